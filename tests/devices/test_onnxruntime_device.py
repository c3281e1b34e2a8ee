"""ONNX Runtime device: group graphs at static shapes, measured wall time, cached sessions, fp32 parity with the
torch expert path (packing.group_ffn); the attention graph (KV cache as I/O) vs HF attention; bad input."""
import numpy as np
import pytest
import torch

from npumoe_lab.backends.onnxruntime import OnnxGroupRunner, OnnxRuntimeDevice
from npumoe_lab.errors import NpuMoeError
from npumoe_lab.graphs import GraphCache, GroupGraphSpec, chunk_inputs, subset
from npumoe_lab.graphs.modules import MASK_MIN
from npumoe_lab.graphs.onnx import census, export_attention
from npumoe_lab.core.packing import group_ffn
from tests.graphs.test_graphs import tiny_parts

ort = pytest.importorskip("onnxruntime")


@pytest.fixture()
def device(tmp_path):
    return OnnxRuntimeDevice(cache=GraphCache(tmp_path / "cache"))


@pytest.mark.parametrize("family", ["qwen3_moe", "gpt_oss"])
def test_group_graph_matches_torch_path_fp32(device, family):
    _, weights, _, _ = tiny_parts(family)
    experts = (6, 0, 3)
    w = subset(weights[0], experts)
    spec = GroupGraphSpec(0, 1, experts, (16, 8), 64, 32, w.act)
    h = device.compile(spec, w)
    for cap in (16, 8):
        x = torch.randn(3, cap, 64, generator=torch.Generator().manual_seed(cap))
        y, wall = device.run(h, x)
        assert isinstance(y, torch.Tensor) and wall > 0 and device.timing_source == "measured"
        with torch.no_grad():
            np.testing.assert_allclose(y.numpy(), group_ffn(x, w).numpy(), rtol=1e-5, atol=1e-5)
        y_np, _ = device.run(h, x.numpy())
        assert isinstance(y_np, np.ndarray) and np.array_equal(y_np, y.numpy())
    assert not h.cache_hit
    c = census(h.paths[16])
    assert c["violations"] == [] and set(c["ops"]) <= {"MatMul", "Sigmoid", "Mul", "Add", "Clip", "Constant"}


def test_sessions_and_exports_are_cached(device):
    _, weights, _, _ = tiny_parts("qwen3_moe")
    w = subset(weights[0], (1, 2))
    spec = GroupGraphSpec(0, 0, (1, 2), (8,), 64, 32)
    h1, h2 = device.compile(spec, w), device.compile(spec, w)
    assert h2.cache_hit and h1.sessions[8] is h2.sessions[8]
    fresh = OnnxRuntimeDevice(cache=device.cache)  # a new process: the export is reused from the cache
    assert fresh.compile(spec, w).cache_hit
    h3 = device.compile_group(0, 0, 8, w)  # the engine's shortcut: same graph, same cached session
    assert h3.cache_hit and h3.sessions[8] is h1.sessions[8]
    runner = OnnxGroupRunner(spec, w, device)
    y, wall = runner(np.zeros((2, 8, 64), np.float32))
    assert y.shape == (2, 8, 64) and wall > 0


def test_bad_input_is_explained(device):
    _, weights, _, _ = tiny_parts("qwen3_moe")
    w = subset(weights[0], (1, 2))
    spec = GroupGraphSpec(0, 0, (1, 2), (8,), 64, 32)
    h = device.compile(spec, w)
    with pytest.raises(NpuMoeError, match=r"takes x \[G=2, C in \[8\], H=64\], got \[2, 12, 64\]"):
        device.run(h, np.zeros((2, 12, 64), np.float32))
    with pytest.raises(NpuMoeError, match="has 3 experts but the weights hold 2"):
        device.compile(GroupGraphSpec(0, 0, (1, 2, 3), (8,), 64, 32), w)
    with pytest.raises(NpuMoeError, match="not available here"):
        OnnxRuntimeDevice(providers=("NoSuchExecutionProvider",))


def test_attention_graph_with_io_cache_matches_hf(tmp_path):
    _, _, attn, rotary = tiny_parts("qwen3_moe")
    a, s, t = attn[1], 8, 32
    path = export_attention(a, s, t, tmp_path / "attn.onnx")
    assert census(path)["violations"] == []
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    x = torch.randn(1, 2 * s, 64, generator=torch.Generator().manual_seed(3))
    cos, sin = rotary(x, torch.arange(2 * s)[None])
    with torch.no_grad():
        mask = torch.triu(torch.full((2 * s, 2 * s), MASK_MIN), 1)[None, None]
        want = a(hidden_states=x, position_embeddings=(cos, sin), attention_mask=mask)[0].numpy()
    k = v = np.zeros((1, 2, t, 16), np.float32)
    outs = []
    for c in range(2):
        rows = slice(c * s, (c + 1) * s)
        _, _, mk, wr = chunk_inputs(range(c * s, (c + 1) * s), t, 16)
        y, k, v = sess.run(None, {"x": x[:, rows].numpy(), "cos": cos[0, rows].numpy(), "sin": sin[0, rows].numpy(),
                                  "mask": mk.numpy(), "write": wr.numpy(), "k_cache": k, "v_cache": v})
        outs.append(y)
    np.testing.assert_allclose(np.concatenate(outs, 1), want, rtol=1e-4, atol=1e-5)
