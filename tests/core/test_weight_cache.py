"""Prepared expert weights belong to the model (npumoe_lab/core/weight_cache.py): packed once per model and weight
version, reused by every later attach with any plan or options, rebuilt when the weights change; detach leaves HF's
weights untouched. Reference: HF's own eager forward of the same (possibly changed) weights."""
import pytest
import torch

import npumoe_lab as nl
from npumoe_lab.core.cpu_ffn import onednn_packs
from npumoe_lab.models import describe, find_moe_blocks
from npumoe_lab.core.numerics import EmulatedFp16Weights
from npumoe_lab.execution.runtime import chunked_prefill
from npumoe_lab.core.weight_cache import prepared, weights_version
from tests.model_zoo import tiny_model
from tests.execution.test_engine import hf_logits, make_plan

torch.set_num_threads(1)
pytestmark = pytest.mark.skipif(not onednn_packs(torch.float32), reason="oneDNN cannot pack fp32 here")


def _packed(model):
    ex = model._npumoe.executor
    return [ex.packed_experts(h) for h in ex.handles]


def test_second_attach_reuses_packed_weights_with_any_plan_and_detach_keeps_hf_weights():
    model = tiny_model("qwen3_moe", seed=5)
    before = {k: (v.data_ptr(), v.clone()) for k, v in model.state_dict().items()}
    ids = torch.randint(3, 128, (1, 40), generator=torch.Generator().manual_seed(0))
    ref = hf_logits(model, ids)
    specs = describe(model)
    nl.attach(model, make_plan(specs, 40), cpu_kernel="onednn")
    first = _packed(model)
    assert all(p._packed is not None and all(x is not None for x in p._packed) for p in first)   # packed at attach
    nl.attach(model, make_plan(specs, 64, group_size=4), cpu_kernel="onednn", pad_rows="skip", spill=True)
    assert all(a is b for a, b in zip(_packed(model), first))          # another plan and options: same packs
    torch.testing.assert_close(chunked_prefill(model, ids, 40).logits, ref, atol=1e-4, rtol=0)
    nl.detach(model)
    for k, v in model.state_dict().items():                            # HF's weights: same storage, same bits
        assert v.data_ptr() == before[k][0] and torch.equal(v, before[k][1]), k


@torch.no_grad()
def test_scratch_buffers_belong_to_the_model_and_a_reattach_reuses_them():
    """Fresh scratch buffers are zero-filled pages on every prefill (~0.1 s at Qwen3-30B-A3B geometry): a re-attach
    reuses the model's, grown where another plan needs more rows, and each plan still gives HF's logits."""
    model, other = tiny_model("qwen3_moe", seed=8), tiny_model("qwen3_moe", seed=9)
    specs = describe(model)
    ids = torch.randint(3, 128, (1, 40), generator=torch.Generator().manual_seed(2))
    ref = hf_logits(model, ids)
    nl.attach(model, make_plan(specs, 8, group_size=4))
    chunked_prefill(model, ids, 40)
    work = model._npumoe.executor._work
    small = {k: b.data_ptr() for k, b in work._bufs.items()}
    nl.attach(model, make_plan(specs, 64), pad_rows="skip")          # another plan with more static rows
    assert model._npumoe.executor._work is work
    torch.testing.assert_close(chunked_prefill(model, ids, 40).logits, ref, atol=1e-4, rtol=0)
    assert any(work._bufs[k].data_ptr() != ptr for k, ptr in small.items())   # grown for the bigger plan
    nl.attach(other, make_plan(describe(other), 8))
    assert other._npumoe.executor._work is not work                    # one model's buffers are its own
    nl.detach(model), nl.detach(other)


@torch.no_grad()
def test_changed_weights_are_packed_again():
    model = tiny_model("qwen3_moe", seed=6)
    specs = describe(model)
    ids = torch.randint(3, 128, (1, 32), generator=torch.Generator().manual_seed(1))
    nl.attach(model, make_plan(specs, 32), cpu_kernel="onednn")
    first = _packed(model)
    experts = find_moe_blocks(model)[0].experts
    experts.down_proj.mul_(1.5)                                          # in place: same storage, new version
    ref = hf_logits(model, ids)
    nl.attach(model, make_plan(specs, 32), cpu_kernel="onednn")
    assert _packed(model)[0] is not first[0] and _packed(model)[1] is first[1]   # only the changed layer
    torch.testing.assert_close(chunked_prefill(model, ids, 32).logits, ref, atol=1e-4, rtol=0)
    nl.detach(model)


def test_npu_precision_weights_are_prepared_once_per_model(monkeypatch):
    monkeypatch.setenv("NPUMOE_CPU_FLAGS", "avx2,fma")
    model = tiny_model("qwen3_moe", seed=7)
    specs = describe(model)
    nl.attach(model, make_plan(specs, 16), npu_dtype=torch.float16)
    layer0 = find_moe_blocks(model)[0].experts
    cached = [v for k, v in layer0._npumoe_prepared["items"].items() if k[0] == "npu"]
    assert len(cached) == 1 and isinstance(cached[0], EmulatedFp16Weights)
    nl.attach(model, make_plan(specs, 32, group_size=4), npu_dtype=torch.float16)
    again = [v for k, v in layer0._npumoe_prepared["items"].items() if k[0] == "npu"]
    assert again[0] is cached[0]
    nl.detach(model)


def test_version_tracks_replacement_and_dtype():
    lin = torch.nn.Linear(4, 4)
    calls = []
    build = lambda: calls.append(1) or len(calls)  # noqa: E731
    assert prepared(lin, "k", build) == 1 and prepared(lin, "k", build) == 1
    v = weights_version(lin)
    lin.weight = torch.nn.Parameter(lin.weight.detach().clone())        # replaced parameter
    assert weights_version(lin) != v and prepared(lin, "k", build) == 2
    lin.to(torch.bfloat16)
    assert prepared(lin, "k", build) == 3
