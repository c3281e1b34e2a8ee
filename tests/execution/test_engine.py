"""Engine: static plans inside HF's forward, chunked prefill, padding, spill, errors."""
import pytest
import torch

import npumoe_lab as nl
from npumoe_lab.execution.engine import PlanExecutor
from npumoe_lab.errors import NpuMoeError
from npumoe_lab.models import describe
from npumoe_lab.execution.runtime import PrefillConfig, chunked_prefill
from npumoe_lab.planning.layout import ExecutionLayout
from tests.model_zoo import tiny_model



def make_plan(specs, capacity, group_size=2, cold_every=0, saliency="weight_x_norm", renormalize=False):
    """Hand-made layout: experts grouped in id order at one capacity; every `cold_every`-th group on the CPU."""
    groups = {s.layer: [(range(start, min(start + group_size, s.n_experts)), capacity,
                         not (cold_every and gid % cold_every == cold_every - 1))
                        for gid, start in enumerate(range(0, s.n_experts, group_size))] for s in specs}
    return ExecutionLayout.build(specs, groups, saliency=saliency, renormalize=renormalize)


@pytest.fixture(scope="module")
def model():
    return tiny_model("qwen3_moe", seed=3)


def hf_logits(model, ids):
    nl.detach(model)
    model.set_experts_implementation("eager")
    with torch.no_grad():
        return model(ids).logits


@pytest.mark.parametrize("chunk", [16, 64])
@pytest.mark.parametrize("setup", ["dynamic", "static", "static-cold", "static-cold-static", "spill"])
def test_capacity_at_least_load_equals_reference(model, chunk, setup):
    ids = torch.randint(3, 128, (1, 45), generator=torch.Generator().manual_seed(1))
    ref = hf_logits(model, ids)
    specs = describe(model)
    if setup == "dynamic":
        nl.attach(model, ExecutionLayout.dropless(specs))
    else:   # capacity = chunk: an expert can take every token of a chunk, so nothing can be dropped
        cold_every = 2 if "cold" in setup else 0
        nl.attach(model, make_plan(specs, chunk, cold_every=cold_every), spill=setup == "spill",
                  cold="static" if setup.endswith("static") else "dynamic")
    res = chunked_prefill(model, ids, chunk)
    nl.detach(model)
    torch.testing.assert_close(res.logits, ref, atol=1e-4, rtol=0)


def test_padding_never_changes_real_tokens(model):
    """Last chunk padded with different pad ids: real tokens' logits identical even with drops (pads take no
    capacity and cannot outrank real tokens)."""
    ids = torch.randint(3, 128, (1, 37), generator=torch.Generator().manual_seed(2))
    nl.attach(model, make_plan(describe(model), capacity=3))
    a = chunked_prefill(model, ids, PrefillConfig.untimed(16, pad_token_id=0))
    b = chunked_prefill(model, ids, PrefillConfig.untimed(16, pad_token_id=77))
    nl.detach(model)
    assert a.logits.shape[1] == 37
    assert torch.equal(a.logits, b.logits)
    assert a.past_key_values.get_seq_length() == 37


def test_small_capacity_drops_and_spill_recovers(model):
    ids = torch.randint(3, 128, (1, 64), generator=torch.Generator().manual_seed(4))
    ref = hf_logits(model, ids)
    specs = describe(model)
    from npumoe_lab.execution.clock import TimelineClock
    from npumoe_lab.devices import get_platform
    nl.attach(model, make_plan(specs, capacity=4))
    clock = TimelineClock(get_platform("m2-max"), measured=False)
    dropped = chunked_prefill(model, ids, PrefillConfig(get_platform("m2-max"), 32, attention="npu"), clock)
    n_drop = sum(s.dropped for _, _, s in clock.stats)
    n_routed = sum(s.routed for _, _, s in clock.stats)
    assert n_routed == 64 * 2 * len(specs) and n_drop > 0
    assert (dropped.logits - ref).abs().max() > 1e-3
    nl.attach(model, make_plan(specs, capacity=4), spill=True)
    spilled = chunked_prefill(model, ids, 32)
    nl.detach(model)
    torch.testing.assert_close(spilled.logits, ref, atol=1e-4, rtol=0)


def test_modeled_events_cover_every_op(model):
    ids = torch.randint(3, 128, (1, 40), generator=torch.Generator().manual_seed(5))
    specs = describe(model)
    nl.attach(model, make_plan(specs, capacity=16, cold_every=2))
    res = nl.prefill(model, ids, chunk=20, platform="m2-max", attention="npu")
    nl.detach(model)
    names = {e.name for e in res.events}
    assert {"attention", "router", "dispatch", "pack", "scatter", "cold", "other"} <= names
    assert all(e.timing_source == "modeled" for e in res.events)
    groups = [e for e in res.events if e.name.startswith("group")]
    assert groups and all(e.device == "npu" for e in groups)
    assert res.summary["timing_source"] == "modeled"
    assert res.summary["n_npu_calls"] == len(groups) + sum(e.name == "attention" for e in res.events)


def test_nan_stops_with_layer_and_chunk(model):
    import copy
    m = copy.deepcopy(model)
    nl.attach(m, make_plan(describe(m), capacity=8))
    with torch.no_grad():
        m.model.layers[0].mlp.experts.down_proj.fill_(float("nan"))
    ids = torch.randint(3, 128, (1, 20))
    with pytest.raises(NpuMoeError, match=r"MoE layer 1 at prefill chunk 0"):
        chunked_prefill(m, ids, 10)


def test_bad_prompts(model):
    nl.attach(model)
    with pytest.raises(NpuMoeError, match="empty"):
        chunked_prefill(model, torch.zeros(1, 0, dtype=torch.long), 16)
    with pytest.raises(NpuMoeError, match="context"):
        chunked_prefill(model, torch.zeros(1, 600, dtype=torch.long), 16)
    nl.detach(model)


def test_plan_for_another_model_is_rejected(model):
    handles = nl.attach(model)._npumoe.handles
    nl.detach(model)
    with pytest.raises(NpuMoeError, match="no entry for MoE layer"):
        PlanExecutor(ExecutionLayout((), "position", False, None, None), handles)
    with pytest.raises(NpuMoeError, match="Plan or an ExecutionLayout"):   # plan-shaped dicts are gone
        PlanExecutor({"saliency": "position", "layers": []}, handles)


def test_attach_and_prefill_check_the_plans_model_and_chunk(model):
    from tests.execution.test_calibration import TEXT, CharTokenizer
    prof = nl.calibrate(model, CharTokenizer(), chunk=16, tokens=64, text=TEXT)
    plan = nl.build_plan(prof, model, group_size=2, min_capacity=1, align=1)
    other = tiny_model("qwen3_moe", seed=4)                   # same geometry, other weights
    with pytest.raises(NpuMoeError, match="built for model .* but this model is"):
        nl.attach(other, plan)
    assert getattr(other, "_npumoe", None) is None            # nothing half-attached
    nl.attach(model, plan)
    ids = torch.randint(3, 128, (1, 40), generator=torch.Generator().manual_seed(7))
    with pytest.raises(NpuMoeError, match="sized for prefill chunks of 16 tokens but the prefill uses 32"):
        chunked_prefill(model, ids, 32)
    assert chunked_prefill(model, ids, 16).logits.shape == (1, 40, model.config.vocab_size)
    nl.detach(model)


@pytest.mark.parametrize("cold_every", [0, 2])     # npumoe-tg (all resident) and npumoe (cold groups on the CPU)
def test_onnxruntime_backend_matches_torch_groups(model, cold_every):
    pytest.importorskip("onnxruntime")
    ids = torch.randint(3, 128, (1, 40), generator=torch.Generator().manual_seed(6))
    plan = make_plan(describe(model), capacity=8, cold_every=cold_every)
    nl.attach(model, plan)
    torch_res = nl.prefill(model, ids, chunk=20, platform="cpu")
    nl.attach(model, plan, npu_backend="onnxruntime")
    ort_res = nl.prefill(model, ids, chunk=20, platform="cpu")
    nl.detach(model)
    torch.testing.assert_close(ort_res.logits, torch_res.logits, atol=1e-4, rtol=1e-4)
    groups = [e for e in ort_res.events if e.name.startswith("group") and e.device == "npu"]
    assert groups and all(e.timing_source == "measured" and e.duration_s > 0 for e in groups)
