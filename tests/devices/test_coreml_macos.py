"""Core ML on a Mac: predict a group and an attention graph vs the workbench/HF reference, MLComputePlan placement,
and live powermetrics. Skipped elsewhere (Core ML's runtime exists only on macOS: ENVIRONMENT 2)."""
import subprocess
import sys

import numpy as np
import pytest
import torch

from npumoe_lab.graphs import AttentionGraphSpec, GroupGraphSpec, from_layout, subset, to_layout
from npumoe_lab.graphs.validate import rel_err, workbench_group_ffn
from npumoe_lab.graphs.validate_attention import hf_attention, rope
from tests.graphs.test_graphs import tiny_parts

pytestmark = [pytest.mark.macos,
              pytest.mark.skipif(sys.platform != "darwin", reason="needs macOS with Core ML (predict, MLComputePlan, "
                                                                  "powermetrics); Linux builds and validates only")]


@pytest.fixture(scope="module")
def group(tmp_path_factory):
    from npumoe_lab.graphs.coreml import CoreMLOptions, build_group_package
    _, weights, _, _ = tiny_parts("qwen3_moe")
    w = subset(weights[0], (0, 3, 5))
    spec = GroupGraphSpec(0, 0, (0, 3, 5), (16, 8), 64, 32)
    path = build_group_package(w, spec.capacities, tmp_path_factory.mktemp("g") / "g.mlpackage",
                               CoreMLOptions(layout="conv"))
    return path, spec, w


def test_predict_group_matches_expert_path(group):
    from npumoe_lab.backends.coreml import CoreMLDevice
    path, spec, w = group
    dev = CoreMLDevice("CPU_AND_NE")
    for cap in spec.capacities:
        h = dev.load(path, f"cap{cap}")
        x = np.random.default_rng(cap).standard_normal((3, cap, 64)).astype(np.float16).astype(np.float32)
        out, wall = dev.run(h, {"x": to_layout(x, "conv")})
        assert wall > 0 and rel_err(from_layout(out["y"], "conv", 3), workbench_group_ffn(x, w)) < 1e-2
        y, _ = dev.run_group(h, x, "conv")
        assert rel_err(y, workbench_group_ffn(x, w)) < 1e-2


def test_predict_attention_two_chunks_matches_hf(tmp_path):
    from npumoe_lab.backends.coreml import CoreMLDevice
    from npumoe_lab.graphs.coreml import build_attention_package
    from npumoe_lab.graphs.modules import chunk_inputs
    _, _, attn, rotary = tiny_parts("qwen3_moe")
    spec = AttentionGraphSpec(0, (8,), 32)
    path = build_attention_package(attn[0], spec.chunks, spec.context, tmp_path / "a.mlpackage")
    h = CoreMLDevice().load(path, "chunk8")
    x = torch.randn(1, 16, 64, generator=torch.Generator().manual_seed(0)).half().float()
    cos, sin = rope(rotary, range(16), 16, 32)
    outs = []
    for c in range(2):
        _, _, mask, write = chunk_inputs(range(8 * c, 8 * c + 8), 32, 16)
        out, _ = CoreMLDevice().run(h, {"x": x[:, 8 * c:8 * c + 8].numpy(), "cos": cos[8 * c:8 * c + 8].numpy(),
                                        "sin": sin[8 * c:8 * c + 8].numpy(), "mask": mask.numpy(),
                                        "write": write.numpy()})
        outs.append(out["y"][0])
    assert rel_err(np.concatenate(outs), hf_attention(attn[0], x, cos, sin)) < 1e-2


def test_compute_plan_reports_placement(group):
    from npumoe_lab.backends.coreml import placement
    path, _, _ = group
    rep = placement(path, "cap16", resident=False)
    assert sum(rep.ops.values()) == 5 and set(rep.ops) <= {"ANE", "GPU", "CPU"}  # conv x3, silu, mul


def test_powermetrics_live():
    from npumoe_lab.backends.coreml import PowerMetrics
    if subprocess.run(["sudo", "-n", "true"], capture_output=True).returncode != 0:
        pytest.skip("powermetrics needs passwordless sudo (sudo -n)")
    with PowerMetrics(interval_ms=100) as pm:
        sum(i * i for i in range(2_000_000))
    assert pm.samples and pm.energy["cpu_j"] is not None and pm.energy["cpu_j"] > 0
