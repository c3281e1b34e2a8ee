"""Residency as scheduling: the makespan model against an independent schedule of the engine's events, the search
against brute force, and its monotonicity in the NPU's and the CPU's speed."""
import itertools

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from npumoe_lab.devices import get_platform
from npumoe_lab.devices.cost import dense_cost, expert_ffn_cost, memory_cost
from npumoe_lab.execution.timeline import Event, schedule
from npumoe_lab.planning.makespan import (LayerCase, LayerMakespan, candidate_masks, choose_resident,
                                         fit_program_budget)

H, I, K, CHUNK = 512, 256, 4, 256


def reference_makespan(case: LayerCase, platform, resident) -> float:
    """Mean over chunks of the end of the last event of the layer-chunk the engine emits, placed by
    timeline.schedule (router, dispatch, pack; NPU groups beside the dynamic cold op; scatter)."""
    cpu, npu, b = platform.cpu, platform.npu, case.dtype_bytes
    E, n_chunks = case.counts.shape
    ends = []
    for c in range(n_chunks):
        ev = []

        def add(name, device, cost, deps):
            dev = npu if device == "npu" else cpu
            ev.append(Event(name, c, 0, device, dev.estimate(cost), cost.flops, cost.bytes, "modeled", deps,
                            cost.calls))
            return len(ev) - 1
        r = add("router", "cpu", dense_cost(case.chunk, case.hidden, E, dtype_bytes=b), ())
        d = add("dispatch", "cpu", memory_cost(case.chunk * case.top_k * 16, "dispatch"), (r,))
        rows = sum(len(e) * cap for (e, cap), res in zip(case.groups, resident) if res)
        p = add("pack", "cpu", memory_cost(2 * rows * case.hidden * b, "pack"), (d,))
        deps = []
        for (e, cap), res in zip(case.groups, resident):
            if res:
                deps.append(add("group", "npu", expert_ffn_cost(len(e), cap, case.hidden, case.intermediate, b,
                                                                weight_bytes=case.npu_weight_bytes), (p,)))
        cold = [x for (e, _), res in zip(case.groups, resident) if not res for x in e]
        load = int(case.counts[cold, c].sum()) if cold else 0
        if load > 0:
            n_exp = int((case.counts[cold, c] > 0).sum())
            cost = expert_ffn_cost(1, load, case.hidden, case.intermediate, b, calls=n_exp)
            cost = type(cost)("cold", cost.flops, cost.bytes + (n_exp - 1) * 3 * case.hidden * case.intermediate * b,
                              n_exp, cost.gemm)
            deps.append(add("cold", "cpu", cost, (p,)))
        add("scatter", "cpu", memory_cost(2 * case.chunk * case.top_k * case.hidden * b, "scatter"),
            tuple(deps) or (p,))
        placed = schedule(ev, platform.npu_shares_cpu)
        ends.append(max(e.end_s for e in placed))
    return float(np.mean(ends))


def brute_force(case, platform) -> float:
    return min(reference_makespan(case, platform, m) for m in itertools.product((False, True),
                                                                              repeat=len(case.groups)))


@st.composite
def cases(draw, max_groups=6, constant=False):
    n = draw(st.integers(1, max_groups))
    sizes = [draw(st.sampled_from([1, 2, 4])) for _ in range(n)]
    caps = [draw(st.sampled_from([8, 32, 64])) for _ in range(n)]
    groups, e0 = [], 0
    for g, c in zip(sizes, caps):
        groups.append((tuple(range(e0, e0 + g)), c))
        e0 += g
    n_chunks = 1 if constant else draw(st.integers(1, 4))
    lo = 1 if constant else 0
    counts = np.array(draw(st.lists(st.lists(st.integers(lo, 120), min_size=n_chunks, max_size=n_chunks),
                                    min_size=e0, max_size=e0)), dtype=np.int64)
    return LayerCase(groups, counts, H, I, K, CHUNK)


PLATFORMS = [get_platform("m2-max"), get_platform("m2-ultra"), get_platform("m2-max", npu_throughput_curve="flat"),
             get_platform("m2-max", cpu_op_overhead_s="coreml_cpu_predict")]


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cases(), st.sampled_from(range(len(PLATFORMS))), st.data())
def test_model_is_the_schedule_of_the_engines_events(case, pi, data):
    plat = PLATFORMS[pi]
    mask = data.draw(st.lists(st.booleans(), min_size=len(case.groups), max_size=len(case.groups)))
    assert LayerMakespan(case, plat)(mask) == pytest.approx(reference_makespan(case, plat, mask), rel=1e-9)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cases(), st.sampled_from(range(len(PLATFORMS))))
def test_matches_brute_force_on_small_cases(case, pi):
    plat = PLATFORMS[pi]
    flags, span = choose_resident(case, plat)
    best = brute_force(case, plat)
    assert span == pytest.approx(best, rel=1e-9)
    assert reference_makespan(case, plat, flags) == pytest.approx(best, rel=1e-9)
    # never above all resident (npumoe-tg) or none resident (anemll's placement)
    assert span <= reference_makespan(case, plat, [True] * len(case.groups)) * (1 + 1e-12)
    assert span <= reference_makespan(case, plat, [False] * len(case.groups)) * (1 + 1e-12)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cases(constant=True), st.sampled_from(range(len(PLATFORMS))))
def test_class_prefix_search_is_exact_when_loads_order_the_groups(case, pi):
    """Beyond EXHAUSTIVE_GROUPS the search takes, per (capacity, size) class, the most loaded groups first: exact
    when every expert is routed to (one calibration chunk, loads >= 1), by the exchange argument."""
    plat = PLATFORMS[pi]
    assert choose_resident(case, plat, exhaustive=0)[1] == pytest.approx(brute_force(case, plat), rel=1e-9)


def test_candidates_start_with_none_and_all():
    case = LayerCase([((i,), 8) for i in range(14)], np.ones((14, 2)), H, I, K, CHUNK)
    m = candidate_masks(case)
    assert not m[0].any() and m[1].all() and len(m) == 15     # one class: prefixes 0..14
    small = candidate_masks(LayerCase([((0,), 8), ((1,), 16)], np.ones((2, 1)), H, I, K, CHUNK))
    assert sorted(map(tuple, small.tolist())) == sorted(itertools.product((False, True), repeat=2))


def _scaled(role, s):
    """m2-max with the curve set aside and `role` s times faster (throughput, bandwidth, per-call cost / s)."""
    kw = {"npu_throughput_curve": "flat"}
    base = get_platform("m2-max", **kw)
    dev = base.device(role)
    kw |= {f"{role}_throughput_flops": dev.throughput_flops * s, f"{role}_bandwidth_bytes_s": dev.bandwidth_bytes_s * s}
    kw |= {"npu_dispatch_s": dev.dispatch_s / s, "npu_sync_s": dev.sync_s / s} if role == "npu" else \
        {"cpu_op_overhead_s": dev.op_overhead_s / s}
    return get_platform("m2-max", **kw)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cases(max_groups=14), st.sampled_from(["npu", "cpu"]), st.floats(1.0, 8.0), st.floats(1.0, 4.0))
def test_a_faster_npu_or_cpu_never_makes_it_slower(case, role, s1, extra):
    slow, fast = _scaled(role, s1), _scaled(role, s1 * extra)
    assert choose_resident(case, fast)[1] <= choose_resident(case, slow)[1] * (1 + 1e-12)


def test_program_budget_moves_the_least_costly_groups_first():
    """fit_program_budget against brute force over every subset of the allowed size (two layers, small)."""
    plat = PLATFORMS[2]
    rng = np.random.default_rng(3)
    layers = []
    for _ in range(2):
        groups = [((2 * i, 2 * i + 1), int(c)) for i, c in enumerate((64, 64, 32, 32))]
        case = LayerCase(groups, rng.integers(20, 120, size=(8, 2)), H, I, K, CHUNK)
        layers.append((LayerMakespan(case, plat), [True] * 4))
    for budget in (8, 5, 2, 0):
        got = fit_program_budget(layers, budget)
        assert sum(map(sum, got)) == min(budget, 8)
        span = sum(m(f) for (m, _), f in zip(layers, got))
        best = min(sum(m(list(f[4 * j:4 * j + 4])) for j, (m, _) in enumerate(layers))
                   for f in itertools.product((False, True), repeat=8) if sum(f) == min(budget, 8))
        assert span <= best * 1.02           # greedy on the exact marginal: within 2 % of the best subset here


def test_build_plan_honours_the_program_budget():
    import pandas as pd
    from types import SimpleNamespace
    from npumoe_lab.planning.plan import build_plan
    from npumoe_lab.planning.profile import CalibrationProfile
    specs = [SimpleNamespace(layer=l, n_experts=32, top_k=4, hidden=1024, intermediate=512) for l in (0, 1)]
    rng = np.random.default_rng(0)
    rows = [dict(layer=l, expert=e, chunk_id=c, count=int(rng.poisson(8 + 40 * (e < 8))))
            for l in (0, 1) for e in range(32) for c in range(8)]
    counts = pd.DataFrame(rows)
    stats = counts.groupby(["layer", "expert"], as_index=False)["count"].sum().assign(
        weight_sum=0.0, weight_sq_sum=0.0, norm_sum=0.0)
    prof = CalibrationProfile(counts, stats, {"chunk": 256, "model_fingerprint": "f" * 64,
                                              "layers": [vars(s) for s in specs]})
    free = build_plan(prof, specs, platform=PLATFORMS[2], group_size=4)
    n_free = sum(g["resident"] for lp in free.layers for g in lp["groups"])
    assert n_free > 1
    tight = build_plan(prof, specs, platform=PLATFORMS[2], group_size=4, npu_program_budget=1)
    assert sum(g["resident"] for lp in tight.layers for g in lp["groups"]) == 1
    same = build_plan(prof, specs, platform=PLATFORMS[2], group_size=4, npu_program_budget=n_free)
    assert [g["resident"] for lp in same.layers for g in lp["groups"]] == \
        [g["resident"] for lp in free.layers for g in lp["groups"]]
