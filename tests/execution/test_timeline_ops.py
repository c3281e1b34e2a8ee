"""Timelines of a run keep each op's kind, shape and GEMM (what validate-device --runs re-prices)."""
import json

import pytest
import torch

from npumoe_lab.devices import get_platform
from npumoe_lab.errors import NpuMoeError
from npumoe_lab.execution.runtime import PrefillConfig, run_prefill
from npumoe_lab.execution.timeline import to_frame
from tests.model_zoo import tiny_model


def test_to_frame_with_ops_adds_kind_shape_gemm():
    model = tiny_model("qwen3_moe")
    res = run_prefill(model, torch.arange(4, 36).view(1, -1), PrefillConfig(get_platform("cpu"), 16, attention="cpu"))
    tl = to_frame(res.events, res.ops)
    assert len(tl) == len(res.ops)
    assert list(tl["kind"]) == [op.kind for op, _, _ in res.ops]
    rest = tl[tl["kind"] == "other"]
    # (chunk, layers, hidden, vocab, LM-head rows): only the last chunk projects, and only its last token
    assert [json.loads(s) for s in rest["shape"]] == [[16, 2, 64, 128, 0], [16, 2, 64, 128, 1]]
    att = tl[tl["kind"] == "attention"].iloc[0]
    assert json.loads(att["gemm"]) == [16, 4 * 16, 64] and json.loads(att["shape"]) == [16, 0]
    assert "kind" not in to_frame(res.events).columns
    with pytest.raises(NpuMoeError, match="op records"):
        to_frame(res.events, res.ops[:-1])


def test_rows_record_what_cpu_cycles_means(tmp_path):
    from npumoe_lab.execution.timeline import CYCLES_DEFINITION, Event, summarize
    from npumoe_lab.results.store import load_results, write_rows
    p = get_platform("m2-max")
    ev = [Event("attention", 0, 0, "cpu", 0.5, 1e9, 1e6, "modeled")]
    s = summarize(ev, p, n_tokens=4)
    assert s["schema_version"] == 2 and s["cycles_definition"] == CYCLES_DEFINITION
    assert s["cpu_cycles"] == pytest.approx(0.5 * p.cpu.cores * p.cpu.freq_hz)    # core-seconds x clock, by hand
    row = dict(model="m", workload="w", variant="v", platform="m2-max", prompt_len=4, chunk=4, repeat=0, **s)
    write_rows([row], tmp_path)
    back = load_results(tmp_path)
    assert back["schema_version"].iloc[0] == 2 and back["cycles_definition"].iloc[0] == CYCLES_DEFINITION
