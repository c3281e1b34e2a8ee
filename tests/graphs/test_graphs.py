"""Static graph modules, specs, limits, cache and the powermetrics parser (no coremltools needed here).
References: the contract's expert math in NumPy, packing.group_ffn, HF's own attention forward."""
import json
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from npumoe_lab.devices import get_platform
from npumoe_lab.backends.coreml import CoreMLDevice, energy_j, parse_powermetrics, placement
from npumoe_lab.errors import NpuMoeError
from npumoe_lab.graphs import (AttentionGraphSpec, ChunkAttention, GraphCache, GroupFFN, Limits, chunk_inputs,
                               from_layout, group_specs, model_parts, to_layout)
from npumoe_lab.graphs.modules import MASK_MIN
from npumoe_lab.graphs.spec import canonical, subset
from npumoe_lab.graphs.validate import reference_group_ffn
from npumoe_lab.models import model_fingerprint
from npumoe_lab.core.packing import group_ffn
from npumoe_lab.planning.plan import Plan
from tests.model_zoo import tiny_model

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"


def tiny_parts(family="qwen3_moe"):
    model = tiny_model(family)
    return (model, *model_parts(model))


def tiny_plan(model, chunk=16, platform=None) -> Plan:
    """Groups [0,3,5]@16 and [1,2]@8 resident, [4,6,7]@8 on the CPU, in every MoE layer of `model`."""
    groups = [([0, 3, 5], 0, True), ([1, 2], 1, True), ([4, 6, 7], 1, False)]
    caps, layers = [16, 8], []
    tier = [0] * 8
    for experts, t, _ in groups:
        for e in experts:
            tier[e] = t
    for layer in sorted(model_parts(model)[0]):
        layers.append({"layer": layer, "n_experts": 8, "top_k": 2, "hidden": 64, "intermediate": 32,
                       "capacity": [caps[t] for t in tier], "tier": tier, "tier_capacities": caps,
                       "groups": [{"id": i, "tier": t, "capacity": caps[t], "experts": e, "resident": r,
                                   "expected_tokens": 4.0} for i, (e, t, r) in enumerate(groups)]})
    return Plan(model_fingerprint(model), chunk, "router_weight", True, platform, {}, layers)


@pytest.mark.parametrize("family", ["qwen3_moe", "gpt_oss"])
@pytest.mark.parametrize("layout", ["bmm", "conv"])
def test_group_ffn_matches_expert_path(family, layout):
    _, weights, _, _ = tiny_parts(family)
    w = subset(weights[0], (5, 1, 2))
    x = torch.randn(3, 8, 64, generator=torch.Generator().manual_seed(1))
    m = GroupFFN(*canonical(w), act=w.act, alpha=w.alpha, limit=w.limit, layout=layout)
    with torch.no_grad():
        y = from_layout(m(to_layout(x, layout)), layout, 3)
        want = group_ffn(x, w)
    np.testing.assert_allclose(y.numpy(), want.numpy(), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(want.numpy(), reference_group_ffn(x.numpy(), w), rtol=1e-4, atol=1e-5)


def test_layout_roundtrip_numpy_and_torch():
    x = np.random.default_rng(0).standard_normal((3, 5, 4)).astype(np.float32)
    c = to_layout(x, "conv")
    assert c.shape == (1, 12, 1, 5) and np.array_equal(c[0, 4:8, 0, :], x[1].T)  # expert 1's channels
    assert np.array_equal(from_layout(c, "conv", 3), x)
    assert torch.equal(from_layout(to_layout(torch.from_numpy(x), "conv"), "conv", 3), torch.from_numpy(x))


@pytest.mark.parametrize("kv", ["io", "state"])
def test_chunk_attention_two_chunks_match_hf(kv):
    model, _, attn, rotary = tiny_parts()
    a, s, t = attn[0], 6, 16
    x = torch.randn(1, 2 * s, 64, generator=torch.Generator().manual_seed(2))
    pos = torch.arange(2 * s)[None]
    cos, sin = rotary(x, pos)
    mask = torch.triu(torch.full((2 * s, 2 * s), MASK_MIN), 1)[None, None]
    with torch.no_grad():
        want = a(hidden_states=x, position_embeddings=(cos, sin), attention_mask=mask)[0]
        m = ChunkAttention(a, t, kv=kv)
        kc = vc = torch.zeros(1, 2, t, 16)
        outs = []
        for c in range(2):
            rows = slice(c * s, (c + 1) * s)
            _, _, mk, wr = chunk_inputs(range(c * s, (c + 1) * s), t, 16)
            args = (x[:, rows], cos[0, rows], sin[0, rows], mk, wr)
            if kv == "io":
                y, kc, vc = m(*args, kc, vc)
            else:
                y = m(*args)
            outs.append(y)
    got, want = torch.cat(outs, 1).numpy(), want.numpy()
    if kv == "io":
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
    else:  # Core ML states are fp16, so the torch module keeps its caches in fp16 too
        assert np.abs(got - want).max() / np.abs(want).max() < 5e-3


@pytest.mark.parametrize("family", ["qwen2_moe", "olmoe", "mixtral", "phimoe", "granitemoe"])
def test_chunk_attention_other_families_match_hf(family):
    """Biases (qwen2_moe), full-width q/k norm (olmoe), attention_multiplier scaling (granitemoe)."""
    model, _, attn, rotary = tiny_parts(family)
    layer = max(attn)
    a, s = attn[layer], 8
    x = torch.randn(1, s, 64, generator=torch.Generator().manual_seed(4))
    cos, sin = rotary(x, torch.arange(s)[None])
    with torch.no_grad():
        want = a(hidden_states=x, position_embeddings=(cos, sin),
                 attention_mask=torch.triu(torch.full((s, s), MASK_MIN), 1)[None, None])[0]
        _, _, mk, wr = chunk_inputs(range(s), 16, 16)
        y, _, _ = ChunkAttention(a, 16, kv="io")(x, cos[0], sin[0], mk, wr, torch.zeros(1, 2, 16, 16),
                                                 torch.zeros(1, 2, 16, 16))
    np.testing.assert_allclose(y.numpy(), want.numpy(), rtol=1e-4, atol=1e-5)


def test_chunk_attention_refuses_what_it_does_not_implement():
    _, _, attn, _ = tiny_parts("gpt_oss")
    with pytest.raises(NpuMoeError, match="attention sinks"):
        ChunkAttention(attn[0], 64)
    _, _, attn, _ = tiny_parts("deepseek_v3")
    with pytest.raises(NpuMoeError, match=r"has no \['k_proj', 'v_proj'\]"):
        ChunkAttention(attn[max(attn)], 64)


def test_chunk_inputs_default_rope_matches_hf_and_bad_context():
    model, _, _, rotary = tiny_parts()
    cos, sin, mask, write = chunk_inputs(range(4, 8), 8, 16)
    hc, hs = rotary(torch.zeros(1, 4, 1), torch.arange(4, 8)[None])
    assert torch.allclose(cos, hc[0], atol=1e-6) and torch.allclose(sin, hs[0], atol=1e-6)
    assert write.sum().item() == 4 and write[5, 1] == 1 and mask[0, 0, 0, 4] == 0 and mask[0, 0, 0, 5] == MASK_MIN
    assert np.isfinite(mask.half().numpy()).all()
    with pytest.raises(NpuMoeError, match="do not fit a KV cache of 8"):
        chunk_inputs(range(6, 10), 8, 16)


def test_group_specs_from_plan():
    model, weights, _, _ = tiny_parts()
    plan = tiny_plan(model)
    specs = group_specs(plan, weights=weights)
    assert [(s.layer, s.group, s.experts, s.capacities) for s in specs] == [
        (0, 0, (0, 3, 5), (16,)), (0, 1, (1, 2), (8,)), (1, 0, (0, 3, 5), (16,)), (1, 1, (1, 2), (8,))]
    tiers = group_specs(plan.to_dict(), all_tiers=True, weights=weights)  # the JSON dict works too
    assert tiers[0].capacities == (16, 8) and tiers[1].capacities == (8,)
    other = plan.to_dict()
    other["layers"][1]["hidden"] = 128
    with pytest.raises(NpuMoeError, match="plan layer 1 is for hidden 128 / intermediate 32 but the model has 64 / 32"):
        group_specs(other, weights=weights)


def test_group_over_graph_limit_names_group_and_excess():
    model, weights, _, _ = tiny_parts()
    limit = 3 * 3 * 64 * 32 * 2 - 100   # group 0 (3 experts) is 100 B too big, group 1 fits
    with pytest.raises(NpuMoeError, match=r"layer 0, group 0\).* 100 B .*over the graph limit"):
        group_specs(tiny_plan(model), limits=Limits(graph_limit_bytes=limit), weights=weights)


def test_limits_from_platform_profile():
    lim = Limits.of("m2-max")
    npu = get_platform("m2-max").npu
    assert lim.graph_limit_bytes == int(npu.graph_limit_bytes) and lim.max_dim == int(npu.max_dim) == 16384
    assert Limits.of(SimpleNamespace(name="x", npu=SimpleNamespace(graph_limit_bytes=10.0, max_dim=8))).max_dim == 8
    assert lim.axis_limits(4) == [16384, 65536, 16384, 16384]  # (N, C, H, W): channels may reach 65536


def test_attention_spec_names():
    assert AttentionGraphSpec(3, (64, 128), 2048).name == "L3_attn"


def test_cache_hit_and_failed_build_leaves_nothing(tmp_path):
    cache, calls = GraphCache(tmp_path), []

    def build(p):
        calls.append(p)
        p.write_text("artifact")
    p1, hit1 = cache.get_or_build("k1", build, ".txt")
    p2, hit2 = cache.get_or_build("k1", build, ".txt")
    assert (hit1, hit2) == (False, True) and p1 == p2 and p2.read_text() == "artifact" and len(calls) == 1

    def broken(p):
        p.write_text("half")
        raise RuntimeError("converter crashed")
    with pytest.raises(RuntimeError):
        cache.get_or_build("k2", broken, ".txt")
    assert cache.get("k2", ".txt") is None and sorted(x.name for x in tmp_path.iterdir()) == ["k1"]


def test_powermetrics_sample_parsed_and_integrated():
    samples = parse_powermetrics((FIXTURES / "powermetrics_sample.txt").read_text())
    assert [s["elapsed_s"] for s in samples] == pytest.approx([0.10237, 0.10081, 0.10155])
    assert [s["ane_w"] for s in samples] == [2.212, 2.450, 0.0]
    assert samples[0]["gpu_w"] == 0.041  # GPU Power appears twice per sample: counted once
    e = energy_j(samples)
    assert e["cpu_j"] == pytest.approx(6.534 * 0.10237 + 5.921 * 0.10081 + 1.210 * 0.10155)
    assert e["ane_j"] == pytest.approx(2.212 * 0.10237 + 2.450 * 0.10081)
    with pytest.raises(NpuMoeError, match="Sampled system activity"):
        parse_powermetrics("<plist>not text</plist>")


@pytest.mark.skipif(sys.platform == "darwin", reason="checks the Linux message; macOS runs Core ML")
def test_coreml_run_on_linux_is_one_clear_error():
    with pytest.raises(NpuMoeError, match="needs macOS with Core ML.*onnxruntime device"):
        CoreMLDevice()
    with pytest.raises(NpuMoeError, match="MLComputePlan placement needs macOS"):
        placement("x.mlpackage", "cap16")
    with pytest.raises(NpuMoeError, match="unknown compute units"):
        CoreMLDevice("NPU")


def test_convert_cli_onnx_end_to_end(tmp_path):
    from npumoe_lab import cli
    model = tiny_model("qwen3_moe")
    model.save_pretrained(tmp_path / "model")
    plan_path = tiny_plan(model).save(tmp_path / "plan.json")
    argv = ["convert", "--plan", str(plan_path), "--target", "onnx", "--out", str(tmp_path / "out"), "--model",
            str(tmp_path / "model"), "--cache", str(tmp_path / "cache"), "--context", "32"]
    assert cli.main(argv) == 0
    man = json.loads((tmp_path / "out" / "manifest.json").read_text())
    kinds = sorted((g["kind"], g["layer"], g.get("group", -1)) for g in man["graphs"])
    assert kinds == [("attention", 0, -1), ("attention", 1, -1), ("group", 0, 0), ("group", 0, 1),
                     ("group", 1, 0), ("group", 1, 1)]
    assert all(not f["violations"] for g in man["graphs"] for f in g["functions"])
    assert (tmp_path / "out" / "L0_g0" / "cap16.onnx").is_file() and man["plan_hash"]
    assert cli.main(argv) == 0
    assert all(g["cache_hit"] for g in json.loads((tmp_path / "out" / "manifest.json").read_text())["graphs"])
    # a plan that is not this model's is refused
    other = tiny_plan(tiny_model("qwen3_moe", seed=5)).save(tmp_path / "other.json")
    assert cli.main([*argv[:2], str(other), *argv[3:]]) == 2
