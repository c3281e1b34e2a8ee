"""Core ML builders on Linux: multifunction packages, op census and static checks, NumPy re-execution of the stored
weights vs the workbench's expert path (fp16 tolerance) and vs HF attention, cache rebuild time, bad input."""
import builtins
import json
import time

import numpy as np
import pytest
import torch

from npumoe_lab.backends.coreml import function_io
from npumoe_lab.errors import NpuMoeError
from npumoe_lab.graphs import AttentionGraphSpec, GraphCache, GroupGraphSpec, Limits, build_graphs
from npumoe_lab.graphs.coreml import CoreMLOptions, build_attention_package, build_group_package, require_coremltools
from npumoe_lab.graphs.milnumpy import load_program, run_function
from npumoe_lab.graphs.modules import chunk_inputs
from npumoe_lab.graphs.spec import subset
from npumoe_lab.graphs.validate import ANE_OPS, check_function, package_size, validate_group_package
from npumoe_lab.graphs.validate_attention import validate_attention_package
from tests.graphs.test_graphs import tiny_parts, tiny_plan

ct = pytest.importorskip("coremltools")


def _spec(w, experts, caps):
    return GroupGraphSpec(0, 0, tuple(experts), tuple(caps), w.hidden, w.intermediate, w.act)


def test_group_package_multifunction_validates(tmp_path):
    _, weights, _, _ = tiny_parts("qwen3_moe")
    w = subset(weights[0], (0, 3, 5))
    spec = _spec(w, (0, 3, 5), (16, 8))
    path = build_group_package(w, spec.capacities, tmp_path / "g.mlpackage", CoreMLOptions(layout="conv"))
    prog = load_program(path)
    assert sorted(prog.functions) == ["cap16", "cap8"]
    reports = validate_group_package(path, spec, w, "conv", prog=prog)
    for r in reports:
        assert r.ok, r.violations
        assert r.rel_err < 1e-2 and r.ops == {"const": 18, "conv": 3, "mul": 1, "silu": 1}
    fp16_weights = 3 * 3 * 64 * 32 * 2
    assert reports[0].weight_bytes >= fp16_weights
    assert package_size(path) < 1.5 * fp16_weights   # two functions, weights stored once
    x = np.ones((1, 3 * 64, 1, 8), np.float32)       # the other function is a real, different shape
    assert run_function(prog, "cap8", {"x": x})["y"].shape == (1, 192, 1, 8)


def test_gpt_oss_group_bmm_int8(tmp_path):
    _, weights, _, _ = tiny_parts("gpt_oss")
    w = subset(weights[0], (2, 7))
    spec = _spec(w, (2, 7), (8,))
    path = build_group_package(w, spec.capacities, tmp_path / "g.mlpackage",
                               CoreMLOptions(layout="bmm", compression="int8"))
    (r,) = validate_group_package(path, spec, w, "bmm", compression="int8")
    assert r.ok and r.rel_err < 3e-2, (r.rel_err, r.violations)
    assert r.ops["constexpr_blockwise_shift_scale"] == 3 and r.ops["clip"] == 2 and r.ops["matmul"] == 3
    blob = path / "Data" / "com.apple.CoreML" / "weights" / "weight.bin"
    assert blob.stat().st_size < 0.6 * (2 * 64 * 32 * 3 * 2)  # int8 + scales, vs 2 bytes per weight in fp16


def test_attention_package_state_carries_between_chunks(tmp_path):
    _, _, attn, rotary = tiny_parts("qwen3_moe")
    spec = AttentionGraphSpec(0, (8,), 32)
    path = build_attention_package(attn[0], spec.chunks, spec.context, tmp_path / "a.mlpackage")
    (r,) = validate_attention_package(path, spec, attn[0], rotary)
    assert r.ok and r.rel_err < 1e-2, (r.rel_err, r.violations)
    assert r.ops["read_state"] == 2 and r.ops["softmax"] == 1 and set(r.ops) - {"const"} <= ANE_OPS
    # without the state the first chunk wrote, the second chunk's output is wrong: the state is really used
    prog = load_program(path)
    _, _, mask, write = chunk_inputs(range(8, 16), 32, 16)
    feed = {"x": np.ones((1, 8, 64), np.float32), "cos": np.ones((8, 16), np.float32),
            "sin": np.zeros((8, 16), np.float32), "mask": mask.numpy(), "write": write.numpy()}
    zero = {n: np.zeros((1, 2, 32, 16), np.float32) for n in ("k_cache", "v_cache")}
    filled = {n: np.full((1, 2, 32, 16), 0.5, np.float32) for n in ("k_cache", "v_cache")}
    y0, y1 = run_function(prog, "chunk8", feed, zero)["y"], run_function(prog, "chunk8", feed, filled)["y"]
    assert np.abs(y0 - y1).max() > 1e-3 and zero["k_cache"][0, :, 8:16].any()  # and the chunk wrote slots 8..15
    spec_pb = ct.models.MLModel(str(path), skip_model_load=True).get_spec()  # what the Mac device loads by
    assert function_io(spec_pb, "chunk8") == (["x", "cos", "sin", "mask", "write"], ["k_cache", "v_cache"])
    with pytest.raises(NpuMoeError, match="no function 'chunk16'"):
        function_io(spec_pb, "chunk16")


def test_census_flags_host_ops_int_outputs_and_infinities():
    from coremltools.converters.mil import Builder as mb
    from coremltools.converters.mil.mil import types

    @mb.program(input_specs=[mb.TensorSpec(shape=(4, 20000), dtype=types.fp16)],
                opset_version=ct.target.iOS18)
    def prog(x):
        vals, idx = mb.topk(x=x, k=2, axis=-1)
        return mb.add(x=vals, y=np.float16(-np.inf)), idx, mb.cast(x=x, dtype="fp32")
    rep = check_function(prog, "main", "bad", Limits())
    text = " | ".join(rep.violations)
    assert "op topk" in text and "produces int32" in text and "non-finite" in text and "computes in fp32" in text
    assert "output" in text and "not fp16" in text
    assert "axis 1 is 20000 > 16384" in text and not rep.ok


def test_plan_rebuild_is_a_cache_hit_under_10_percent(tmp_path):
    model, weights, attn, rotary = tiny_parts("qwen3_moe")
    plan = tiny_plan(model)
    cache = GraphCache(tmp_path / "cache")
    t0 = time.perf_counter()
    first = build_graphs(plan, weights, tmp_path / "out", cache=cache)
    t_first = time.perf_counter() - t0
    t0 = time.perf_counter()
    second = build_graphs(plan, weights, tmp_path / "out", cache=cache)
    t_second = time.perf_counter() - t0
    assert not any(g["cache_hit"] for g in first["graphs"]) and all(g["cache_hit"] for g in second["graphs"])
    assert t_second < 0.1 * t_first, (t_first, t_second)
    man = json.loads((tmp_path / "out" / "manifest.json").read_text())
    assert [g["path"] for g in man["graphs"]] == ["L0_g0.mlpackage", "L0_g1.mlpackage", "L1_g0.mlpackage",
                                                  "L1_g1.mlpackage"]
    assert all(f["rel_err"] < 1e-2 and not f["violations"] for g in man["graphs"] for f in g["functions"])
    assert (tmp_path / "out" / "L1_g1.mlpackage" / "Manifest.json").is_file()
    # a changed weight is a different artifact
    with torch.no_grad():
        model.model.layers[1].mlp.experts.down_proj[2, 0, 0] += 1.0
    third = build_graphs(plan, weights, tmp_path / "out", cache=cache)
    assert [g["cache_hit"] for g in third["graphs"]] == [True, True, True, False]  # only L1 group [1, 2]


def test_group_over_limit_fails_before_converting(tmp_path):
    model, weights, _, _ = tiny_parts("qwen3_moe")
    with pytest.raises(NpuMoeError, match=r"\(layer 0, group 0\) has 36,864 B .* 36,764 B"):
        build_graphs(tiny_plan(model), weights, tmp_path / "out", limits=Limits(graph_limit_bytes=100),
                     cache=GraphCache(tmp_path / "c"))


def test_coremltools_missing_is_one_clear_error(tmp_path, monkeypatch):
    model, weights, _, _ = tiny_parts("qwen3_moe")
    real_import = builtins.__import__

    def no_coremltools(name, *args, **kwargs):
        if name == "coremltools" or name.startswith("coremltools."):
            raise ImportError("No module named 'coremltools'")
        return real_import(name, *args, **kwargs)
    monkeypatch.setattr(builtins, "__import__", no_coremltools)
    with pytest.raises(NpuMoeError, match=r"coremltools is not installed.*npumoe-lab\[coreml\].*--target onnx"):
        require_coremltools()
    with pytest.raises(NpuMoeError, match="coremltools is not installed"):
        build_graphs(tiny_plan(model), weights, tmp_path / "out", cache=GraphCache(tmp_path / "c"))


def test_npu_decode_group_packages_validate(tmp_path):
    model, weights, _, _ = tiny_parts("qwen3_moe")
    man = build_graphs(tiny_plan(model), weights, tmp_path / "out", cache=GraphCache(tmp_path / "c"),
                       decode_policy="npu-decode")
    dec = [g for g in man["graphs"] if g["kind"] == "decode-group"]
    assert [g["path"] for g in dec] == ["L0_g0_decode.mlpackage", "L0_g1_decode.mlpackage",
                                        "L1_g0_decode.mlpackage", "L1_g1_decode.mlpackage"]
    for g in dec:          # one token per step: capacity 1, re-executed in NumPy against the expert path
        (f,) = g["functions"]
        assert f["function"] == "cap1" and f["rel_err"] < 1e-2 and not f["violations"], f
    assert sorted(load_program(tmp_path / "out" / dec[0]["path"]).functions) == ["cap1"]
