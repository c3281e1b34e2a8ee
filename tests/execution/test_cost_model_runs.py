"""The cost model through real prefills of the bundled tiny model: residency by cost (the old rule) and by makespan
(the default) never slow the modeled TTFT below npumoe-tg, and a measured run's cycles count every torch thread."""
import pytest
import torch

import npumoe_lab as nl
from npumoe_lab.api import prefill
from npumoe_lab.devices import get_platform
from npumoe_lab.planning.plan import variant_plan

PROMPT = "The quick brown fox jumps over the lazy dog. " * 20


@pytest.fixture(scope="module")
def tiny():
    torch.set_num_threads(1)
    model, tok = nl.load_model("tiny")
    prof = nl.calibrate(model, tok, workload="mixed", chunk=64, tokens=512, seed=0)
    return model, tok, prof, tok(PROMPT)["input_ids"][:128]


def _modeled_ttft(model, prof, ids, variant, plat, **knobs):
    plan = variant_plan(prof, variant, model, platform=plat, **knobs)
    nl.attach(model, plan, npu_dtype=torch.float16)     # as the runner attaches on a modeled platform
    try:
        res = prefill(model, ids, chunk=64, platform=plat, attention="npu")
    finally:
        nl.detach(model)
    flags = [g["resident"] for lp in plan.layers for g in lp["groups"]]
    return res.summary["ttft_s"], sum(flags), len(flags), plan.knobs["residency"]


# m2-max as shipped (its 0.3 ms per call makes every tiny group cheaper on the CPU), and m2-max with a 0.1 ms
# direct-path call and the flat 5.38 TF/s rate, where the rule keeps some groups on the NPU and moves others
@pytest.mark.parametrize("overrides, mixed", [
    ({}, False),
    (dict(npu_dispatch_s="direct_path", npu_sync_s="none", npu_throughput_curve="flat"), True)])
def test_cost_residency_never_slower_than_all_resident(tiny, overrides, mixed):
    model, _, prof, ids = tiny
    plat = get_platform("m2-max", **overrides)
    tg, n_tg, total_tg, _ = _modeled_ttft(model, prof, ids, "npumoe-tg", plat)
    old, n_res, total, rule = _modeled_ttft(model, prof, ids, "npumoe", plat, residency="cost")
    assert rule == "cost" and n_tg == total_tg
    assert old <= tg
    assert (0 < n_res < total) if mixed else n_res == 0
    # the default (residency as scheduling) on the same real prefill: not slower than either
    full, _, _, rule = _modeled_ttft(model, prof, ids, "npumoe", plat)
    assert rule == "makespan" and full <= tg * (1 + 1e-9)


def test_two_thread_measured_prefill_counts_both_threads(tiny):
    model, _, _, ids = tiny
    plat = get_platform("cpu")
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        res = prefill(model, ids[:32], chunk=32, platform="cpu", attention="npu")
    finally:
        torch.set_num_threads(before)
    s = res.summary
    assert s["cpu_threads"] == 2 and s["timing_source"] == "measured"
    # every event is host work on the cpu platform: 2 threads x its wall time x the profile's clock
    wall = sum(e.duration_s for e in res.events)
    assert s["cpu_cycles"] == pytest.approx(2 * wall * plat.cpu.freq_hz)
    assert s["cycles_source"] == "measured-time x threads x modeled-clock"
    assert s["energy_source"] == "measured-time x modeled-power"
