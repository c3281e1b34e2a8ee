"""`convert --decode-policy`: the decode steps' static graphs beside the prefill's. References: the plan's own
resident groups (which graphs must exist), the contract's expert math in NumPy (reference_group_ffn) run on the
ONNX file in ONNX Runtime, and the default (pipeline) manifest for what must not change."""
import json

import numpy as np
import pytest

from npumoe_lab import cli
from npumoe_lab.graphs import GraphCache, build_graphs
from npumoe_lab.graphs.spec import decode_group_specs, subset
from npumoe_lab.graphs.validate import reference_group_ffn
from npumoe_lab.errors import NpuMoeError
from tests.graphs.test_graphs import tiny_parts, tiny_plan

ort = pytest.importorskip("onnxruntime")
pytest.importorskip("onnx")


def _build(tmp_path, policy, name, batch=1):
    model, weights, attn, rotary = tiny_parts("qwen3_moe")
    plan = tiny_plan(model)
    man = build_graphs(plan, weights, tmp_path / name, target="onnx", attention=attn, rotary=rotary, context=32,
                       cache=GraphCache(tmp_path / "cache"), decode_policy=policy, decode_batch=batch)
    return plan, weights, man


def test_npu_decode_adds_one_validated_graph_per_resident_group(tmp_path):
    plan, weights, man = _build(tmp_path, "npu-decode", "npu", batch=2)
    resident = [(lay["layer"], g["id"], tuple(g["experts"])) for lay in plan.to_dict()["layers"]
                for g in lay["groups"] if g["resident"]]
    dec = [g for g in man["graphs"] if g["kind"] == "decode-group"]
    assert [(g["layer"], g["group"], tuple(g["experts"])) for g in dec] == resident
    assert all(g["capacities"] == [2] and g["path"].endswith("_decode") for g in dec)
    assert all(f["rel_err"] < 1e-3 and not f["violations"] for g in man["graphs"] if "group" in g["kind"]
               for f in g["functions"])
    assert all(g["chunks"] == [1, 16] for g in man["graphs"] if g["kind"] == "attention")
    assert man["decode"]["graphs"] == [g["path"] for g in dec] and "capacity 2" in man["decode"]["note"]
    # the file itself, run independently of the builder's own check, against the NumPy contract math
    g = dec[1]
    w = subset(weights[g["layer"]], g["experts"])
    x = np.random.default_rng(7).standard_normal((len(g["experts"]), 2, w.hidden)).astype(np.float32)
    path = tmp_path / "npu" / g["path"] / "cap2.onnx"
    (y,) = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(["y"], {"x": x})
    np.testing.assert_allclose(y, reference_group_ffn(x, w), rtol=1e-4, atol=1e-5)


def test_pipeline_reuses_the_prefill_graphs_and_cpu_adds_only_one_token_attention(tmp_path):
    _, _, pipe = _build(tmp_path, "pipeline", "pipe")
    _, _, cpu = _build(tmp_path, "cpu", "cpu")
    prefill = [(g["kind"], g["path"], g["key"]) for g in pipe["graphs"]]
    assert all(k in ("group", "attention") for k, _, _ in prefill)
    assert "chunk shape [16]" in pipe["decode"]["note"] and pipe["decode"]["graphs"] == []
    assert [(k, p, key) for k, p, key in ((g["kind"], g["path"], g["key"]) for g in cpu["graphs"])
            if k == "group"] == [x for x in prefill if x[0] == "group"]        # the same group artifacts
    assert all(g["chunks"] == [1, 16] for g in cpu["graphs"] if g["kind"] == "attention")
    assert not any(g["kind"] == "decode-group" for g in cpu["graphs"])


def test_decode_specs_refuse_a_step_of_no_tokens():
    model, weights, _, _ = tiny_parts("qwen3_moe")
    with pytest.raises(NpuMoeError, match="--decode-batch 0"):
        decode_group_specs(tiny_plan(model), 0, weights=weights)


@pytest.mark.parametrize("flags,what", [(["--decode-policy", "gpu"], "--decode-policy 'gpu'"),
                                        (["--decode-batch", "0"], "--decode-batch 0")])
def test_convert_bad_decode_flags_one_line_exit_2(tmp_path, capsys, flags, what):
    model = tiny_parts("qwen3_moe")[0]
    plan = tiny_plan(model).save(tmp_path / "plan.json")
    rc = cli.main(["convert", "--plan", str(plan), "--target", "onnx", "--out", str(tmp_path / "o"), *flags])
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert rc == 2 and len(err) == 1 and what in err[0] and not (tmp_path / "o").exists()


def test_convert_cli_says_what_the_decode_runs_on(tmp_path, capsys):
    model = tiny_parts("qwen3_moe")[0]
    model.save_pretrained(tmp_path / "model")
    plan = tiny_plan(model).save(tmp_path / "plan.json")
    rc = cli.main(["convert", "--plan", str(plan), "--target", "onnx", "--out", str(tmp_path / "o"), "--model",
                   str(tmp_path / "model"), "--context", "32", "--no-attention", "--decode-policy", "npu-decode"])
    out = capsys.readouterr().out
    assert rc == 0 and "8 onnx graphs" in out and "decode (npu-decode): 4 decode-shaped group graphs" in out
    assert json.loads((tmp_path / "o" / "manifest.json").read_text())["decode"]["policy"] == "npu-decode"
