"""Greedy decode on the same engine: tokens equal HF's generate(do_sample=False) (the independent reference), for
HF's own experts and the dropless plan under every decode policy, on tiny random configs of every family (a
left-padded batch included) and on the bundled model."""
import pytest
import torch

import npumoe_lab as nl
from npumoe_lab.errors import NpuMoeError
from npumoe_lab.execution.decode import greedy_generate, run_decode
from npumoe_lab.execution.decode_policy import DECODE_POLICIES, check_decode, decode_layout, decode_programs
from npumoe_lab.execution.runtime import PrefillConfig, run_prefill
from npumoe_lab.models import describe
from npumoe_lab.planning.layout import ExecutionLayout
from tests.model_zoo import FAMILY_NAMES, tiny_model

N = 5


def hf_greedy(model, ids, mask=None):
    """HF's generate, N + 1 new tokens: the prefill's token and N decode steps (it may stop early at EOS)."""
    out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids) if mask is None else mask,
                         max_new_tokens=N + 1, do_sample=False, pad_token_id=0)
    return out[:, ids.shape[1]:]


def assert_same_tokens(ours, hf, eos):
    """Row by row: equal up to HF's stop (the workbench decodes a fixed count, HF stops at EOS)."""
    for a, b in zip(ours.tolist(), hf.tolist()):
        n = b.index(eos) + 1 if eos in b else len(b)
        assert a[:n] == b[:n], (a, b)
        assert n == len(a) or b[n - 1] == eos


def prompt(batch=1, length=12, seed=0):
    return torch.randint(3, 128, (batch, length), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("family", FAMILY_NAMES)
def test_reference_decode_equals_hf_generate_left_padded_batch(family):
    torch.set_num_threads(1)
    model = tiny_model(family)
    ids = prompt(2)
    mask = torch.ones_like(ids)
    ids[1, :4], mask[1, :4] = 0, 0               # the second row left-padded
    hf = hf_greedy(model, ids, mask)
    assert_same_tokens(greedy_generate(model, ids, N + 1, mask), hf, model.config.eos_token_id)


@pytest.mark.parametrize("family", FAMILY_NAMES)
def test_engine_decode_equals_hf_generate_reference_and_dropless_every_policy(family):
    torch.set_num_threads(1)
    model = tiny_model(family)
    ids = prompt(1, 11, seed=3)
    hf = hf_greedy(model, ids)
    config = PrefillConfig("m2-max", 4)          # 11 tokens: 3 chunks, the last one padded
    res = run_prefill(model, ids, config)
    d = run_decode(model, res, config, N, "pipeline")
    assert_same_tokens(d.tokens, hf, model.config.eos_token_id)
    assert res.past_key_values.get_seq_length() == ids.shape[1]          # the prefill's cache as it was
    nl.attach(model, ExecutionLayout.dropless(describe(model)))
    try:
        for policy in DECODE_POLICIES:
            res = run_prefill(model, ids, config)
            d = run_decode(model, res, config, N, policy)
            assert_same_tokens(d.tokens, hf, model.config.eos_token_id)
            assert d.summary["decode_drop_rate"] == 0.0 and d.summary["decode_s"] > 0
            assert {e.chunk for e in d.events} == set(range(3, 3 + N))      # step indices follow the chunks
    finally:
        nl.detach(model)


def test_bundled_model_decode_equals_hf_generate():
    model, tok = nl.load_model("tiny")
    ids = torch.tensor([tok("The quick brown fox jumps over the lazy dog. " * 6).input_ids[:60]])
    hf = hf_greedy(model, ids)
    config = PrefillConfig("m2-max", 32, pad_token_id=tok.pad_token_id or 0)
    d = run_decode(model, run_prefill(model, ids, config), config, N, "pipeline")
    assert_same_tokens(d.tokens, hf, model.config.eos_token_id)
    nl.attach(model, ExecutionLayout.dropless(describe(model)))
    try:
        for policy in DECODE_POLICIES:
            d = run_decode(model, run_prefill(model, ids, config), config, N, policy)
            assert_same_tokens(d.tokens, hf, model.config.eos_token_id)
    finally:
        nl.detach(model)


def test_policies_shape_the_decode_layout():
    specs = describe(tiny_model("qwen3_moe"))
    groups = {s.layer: [((0, 1), 6, True), ((2, 3, 4), 3, True), ((5, 6, 7), 2, False)] for s in specs}
    lay = ExecutionLayout.build(specs, groups, chunk=16)
    assert decode_layout(lay, "pipeline") is lay
    cpu = decode_layout(lay, "cpu")
    assert all(not g.resident for layer in cpu.layers for g in layer.groups)
    npu = decode_layout(lay, "npu-decode", rows=1)
    assert [(g.capacity, g.resident) for g in npu.layers[0].groups] == [(1, True), (1, True), (2, False)]
    assert decode_programs(lay, "npu-decode") == 2 * len(specs) and decode_programs(lay, "pipeline") == 0


@pytest.mark.parametrize("tokens,policy,what", [(-1, "pipeline", "--decode-tokens -1"), (2.5, "cpu", "2.5"),
                                                 (8, "npu", "--decode-policy 'npu'")])
def test_bad_decode_settings_are_one_clear_error(tokens, policy, what):
    with pytest.raises(NpuMoeError, match=what):
        check_decode(tokens, policy)
