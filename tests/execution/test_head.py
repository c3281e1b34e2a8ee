"""The LM head of a prefill: the timed forward projects the last token only, the scoring logits come after."""
import time

import pytest
import torch

from npumoe_lab.devices import get_platform
from npumoe_lab.errors import NpuMoeError
from npumoe_lab.execution import head
from npumoe_lab.execution.decode import run_decode
from npumoe_lab.execution.runtime import PrefillConfig, chunked_prefill, run_prefill
from tests.model_zoo import FAMILY_NAMES, tiny_model


@pytest.mark.parametrize("family", FAMILY_NAMES)
def test_prefill_logits_equal_hf_forward(family):
    """Every position's logits as HF's own *ForCausalLM returns them (GraniteMoE's logits_scaling included)."""
    over = dict(logits_scaling=4.0) if family == "granitemoe" else {}
    model = tiny_model(family, **over)
    ids = torch.arange(3, 43).view(1, -1)
    with torch.no_grad():
        ref = model(ids).logits
    for chunk in (40, 16):          # one chunk, then three (the last padded)
        got = chunked_prefill(model, ids, chunk).logits
        torch.testing.assert_close(got, ref.float(), atol=1e-4, rtol=0)


def test_timed_forward_projects_the_last_token_only():
    model = tiny_model("qwen3_moe")
    rows = []
    hook = model.lm_head.register_forward_hook(lambda m, a, out: rows.append(a[0].shape[1]))
    try:
        ids = torch.arange(3, 43).view(1, -1)          # chunks of 16: 16, 16, 8 real tokens
        chunked_prefill(model, ids, 16, keep_logits=False)
        assert rows == [0, 0, 1]
        rows.clear()
        res = chunked_prefill(model, ids, 16)          # the scoring logits: one whole-chunk projection after each
        assert rows == [0, 16, 0, 16, 1, 16] and res.logits.shape == (1, 40, 128)
    finally:
        hook.remove()


def test_scoring_logits_are_not_timed(monkeypatch):
    """A slow scoring projection (0.3 s a chunk, injected) enters neither the measured TTFT nor the host wall."""
    model = tiny_model("qwen3_moe")
    slow, calls = head.chunk_logits, []

    def delayed(m, hidden):
        calls.append(hidden.shape[1])
        time.sleep(0.3)
        return slow(m, hidden)

    monkeypatch.setattr(head, "chunk_logits", delayed)
    res = run_prefill(model, torch.arange(3, 35).view(1, -1), PrefillConfig(get_platform("cpu"), 16, attention="cpu"))
    assert res.logits.shape == (1, 32, 128) and calls == [16, 16]     # the slow projection did run, per chunk
    assert res.summary["ttft_s"] < 0.3 and res.summary["host_wall_s"] < 0.3
    rest = [op for op, _, _ in res.ops if op.kind == "other"]
    assert [op.shape[-1] for op in rest] == [0, 1]


def test_model_without_a_separate_head_is_refused():
    model = tiny_model("qwen3_moe")
    with pytest.raises(NpuMoeError, match="no separate decoder and LM head"):
        head.FinalHidden(model.model)


def test_decode_steps_project_their_token_only():
    """A pipeline decode step runs the prefill's static chunk (the token padded to it): one row projected, as the
    step's rest op records, not the padded chunk."""
    model = tiny_model("qwen3_moe")
    config = PrefillConfig(get_platform("cpu"), 16, attention="cpu")
    res = run_prefill(model, torch.arange(3, 23).view(1, -1), config)
    rows = []
    hook = model.lm_head.register_forward_hook(lambda m, a, out: rows.append(a[0].shape[1]))
    try:
        d = run_decode(model, res, config, 3, "pipeline")
    finally:
        hook.remove()
    assert rows == [1, 1, 1]
    assert [op.shape[-1] for op, _, _ in d.ops if op.kind == "other"] == [1, 1, 1]


def test_nan_in_the_lm_head_is_one_clear_error():
    """A NaN that only the LM head makes (its weight) still stops the prefill where the logits are computed."""
    model = tiny_model("qwen3_moe")
    with torch.no_grad():
        model.lm_head.weight[5, 3] = float("nan")
    ids = torch.arange(3, 43).view(1, -1)
    with pytest.raises(NpuMoeError, match="NaN in the logits of prefill chunk 0"):
        chunked_prefill(model, ids, 16)
    with pytest.raises(NpuMoeError, match="NaN in the logits of prefill chunk 2"):  # the last token's projection
        chunked_prefill(model, ids, 16, keep_logits=False)
