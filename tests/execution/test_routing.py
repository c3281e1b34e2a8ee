"""Routing capture against two independent references: each family's plain-torch `reference_route` and HF's own
router called directly on the captured experts input. Capture must not change the logits by a single bit."""
import pytest
import torch
from tests.model_zoo import FAMILY_NAMES, token_batch, tiny_model

from npumoe_lab.errors import NpuMoeError
from npumoe_lab.models import find_moe_blocks, get_family
from npumoe_lab.execution.routing import RoutingRecorder, capture_routing


def _sorted_by_expert(idx, weight):
    order = idx.argsort(dim=-1)
    return idx.gather(-1, order), weight.gather(-1, order)


@pytest.mark.parametrize("family", FAMILY_NAMES)
def test_capture_matches_reference_and_hf_router(family):
    model = tiny_model(family)
    ids, mask = token_batch(33, batch=2, pad=10)
    with torch.no_grad(), RoutingRecorder(model, keep_hidden=True) as rec:
        out = model(input_ids=ids, attention_mask=mask, output_router_logits=True)
    refs = find_moe_blocks(model)
    assert [r.layer for r in rec.records] == [r.layer for r in refs]
    for i, (record, ref) in enumerate(zip(rec.records, refs)):
        n = ids.numel()
        assert record.topk_idx.shape == (n, 2) and record.topk_idx.dtype == torch.int64
        assert record.topk_weight.dtype == torch.float32 and record.router_logits.shape == (n, 8)
        assert torch.equal(record.token_mask, mask.reshape(-1).bool())
        torch.testing.assert_close(record.hidden_norm, record.hidden.double().norm(dim=-1).float())
        # independent reference (same experts as sets per token, weights within 1e-6)
        ref_idx, ref_w = get_family(model).reference_route(ref.router, record.hidden)
        got_idx, got_w = _sorted_by_expert(record.topk_idx, record.topk_weight)
        ref_idx, ref_w = _sorted_by_expert(ref_idx, ref_w.float())
        assert torch.equal(got_idx, ref_idx)
        torch.testing.assert_close(got_w, ref_w, atol=1e-6, rtol=0)
        # HF's router on the same input returns exactly what the experts received
        with torch.no_grad():
            hf_logits, hf_w, hf_idx = ref.router(record.hidden)
        assert torch.equal(record.topk_idx, hf_idx) and torch.equal(record.topk_weight, hf_w.float())
        assert torch.equal(record.router_logits, hf_logits.float())
        # ... and the logits HF itself reports with output_router_logits=True
        assert torch.equal(record.router_logits, out.router_logits[i].float())


@pytest.mark.parametrize("family", FAMILY_NAMES)
def test_capture_leaves_logits_bit_identical(family):
    model = tiny_model(family)
    ids, mask = token_batch(40, batch=2, pad=7, seed=1)
    with torch.no_grad():
        plain = model(input_ids=ids, attention_mask=mask).logits
        with RoutingRecorder(model):
            hooked = model(input_ids=ids, attention_mask=mask).logits
        after = model(input_ids=ids, attention_mask=mask).logits
    assert torch.equal(plain, hooked) and torch.equal(plain, after)
    assert not model._forward_pre_hooks and all(not r.experts._forward_pre_hooks for r in find_moe_blocks(model))


def test_recorder_accumulates_forwards_and_masks():
    model = tiny_model("qwen3_moe")
    chunks = [token_batch(16, seed=s)[0] for s in range(3)]
    with torch.no_grad(), RoutingRecorder(model) as rec:
        for chunk in chunks:
            model(input_ids=chunk)
    calls = rec.by_call()
    assert len(calls) == 3 and all([r.layer for r in c] == [0, 1] for c in calls)
    assert [r.call for r in rec.records] == [0, 0, 1, 1, 2, 2]
    assert all(r.token_mask.all() and r.token_mask.shape == (16,) for r in rec.records)
    single = capture_routing(model, chunks[1])
    assert all(torch.equal(a.topk_idx, b.topk_idx) for a, b in zip(single, calls[1]))


def test_capture_with_kv_cache_uses_last_mask_columns():
    model = tiny_model("mixtral")
    ids, mask = token_batch(12, batch=2, pad=3)
    with torch.no_grad(), RoutingRecorder(model) as rec:
        out = model(input_ids=ids[:, :8], attention_mask=mask[:, :8], use_cache=True)
        model(input_ids=ids[:, 8:], attention_mask=mask, past_key_values=out.past_key_values, use_cache=True)
    second = rec.by_call()[1][0]
    assert torch.equal(second.token_mask, mask[:, 8:].reshape(-1).bool())


def test_deepseek_routing_is_group_limited_and_bias_corrected():
    model = tiny_model("deepseek_v3")
    ids, _ = token_batch(64)
    with torch.no_grad(), RoutingRecorder(model, keep_hidden=True) as rec:
        model(input_ids=ids)
    for record, ref in zip(rec.records, find_moe_blocks(model)):
        groups = record.topk_idx // 4  # 2 groups of 4 experts, topk_group = 1
        assert (groups == groups[:, :1]).all()
        plain_top = torch.sigmoid(record.router_logits).topk(2, dim=-1).indices.sort(-1).values
        assert not torch.equal(plain_top, record.topk_idx.sort(-1).values)  # group limit / bias change choices
        weight_sum = record.topk_weight.sum(-1)
        torch.testing.assert_close(weight_sum, torch.full_like(weight_sum, 2.5))  # renorm x routed_scaling_factor


def test_phimoe_sparsemixer_weights_do_not_sum_to_one():
    model = tiny_model("phimoe")
    records = capture_routing(model, token_batch(64)[0])
    sums = torch.cat([r.topk_weight.sum(-1) for r in records])
    assert (sums - 1).abs().max() > 1e-3  # not a renormalised top-k softmax


def test_capture_rejects_a_model_without_moe_layers():
    model = tiny_model("qwen3_moe", mlp_only_layers=[0, 1])
    with pytest.raises(NpuMoeError, match="no MoE layers"):
        capture_routing(model, token_batch(4)[0])
