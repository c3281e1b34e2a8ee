"""The NPU program budget a plan is searched under by default (planning/residency.program_budget)."""
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from npumoe_lab.devices import get_platform
from npumoe_lab.errors import NpuMoeError
from npumoe_lab.planning.knobs import PlanKnobs
from npumoe_lab.planning.plan import build_plan, variant_plan
from npumoe_lab.planning.profile import CalibrationProfile


def _profile(n_layers, n_experts, top_k, hot, chunks, seed, chunk=256):
    specs = [SimpleNamespace(layer=l, n_experts=n_experts, top_k=top_k, hidden=512, intermediate=256)
             for l in range(n_layers)]
    rng = np.random.default_rng(seed)
    rows = [dict(layer=l, expert=e, chunk_id=c, count=int(rng.poisson(2 + 40 * (e < hot))))
            for l in range(n_layers) for e in range(n_experts) for c in range(chunks)]
    counts = pd.DataFrame(rows)
    stats = counts.groupby(["layer", "expert"], as_index=False)["count"].sum().assign(
        weight_sum=0.0, weight_sq_sum=0.0, norm_sum=0.0)
    return CalibrationProfile(counts, stats, {"chunk": chunk, "model_fingerprint": "f" * 64,
                                              "layers": [vars(s) for s in specs]}), specs


def _resident(plan) -> int:
    return sum(g["resident"] for lp in plan.layers for g in lp["groups"])


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(1, 4), st.sampled_from([8, 16, 32]), st.integers(1, 4), st.integers(0, 12), st.integers(2, 6),
       st.integers(0, 10 ** 6), st.integers(1, 40), st.integers(1, 40), st.sampled_from([1, 2, 4]),
       st.sampled_from(["makespan", "cost", "threshold"]))
def test_the_search_keeps_under_the_platform_budget(n_layers, E, k, hot, chunks, seed, programs, compiles, g, rule):
    """Over random profiles and platform limits: resident groups + one attention graph per layer never exceed
    max_resident_programs nor max_compiles (a limit below the attention graphs leaves no group resident)."""
    prof, specs = _profile(n_layers, E, min(k, E), hot, chunks, seed)
    plat = get_platform("m2-max", npu_max_resident_programs=programs, npu_max_compiles=compiles,
                        npu_dispatch_s=1e-6, npu_sync_s=0.0)          # a cheap NPU: the search wants every group
    plan = build_plan(prof, specs, platform=plat, group_size=g, residency=rule)
    allowed = max(0, min(programs, compiles) - n_layers)
    assert _resident(plan) <= allowed
    assert plan.limits["npu_program_budget"] == allowed
    free = build_plan(prof, specs, platform=plat, group_size=g, residency=rule, npu_program_budget="off")
    assert plan.limits["resident_groups_unbounded"] == _resident(free)
    if _resident(free) <= allowed:       # a budget that binds nothing changes nothing
        assert [x["resident"] for lp in plan.layers for x in lp["groups"]] == \
            [x["resident"] for lp in free.layers for x in lp["groups"]]
    else:
        assert _resident(plan) == allowed


def test_off_is_the_unbounded_plan_and_forced_variants_are_not_moved():
    prof, specs = _profile(2, 32, 4, 8, 6, 0)
    tight = get_platform("m2-max", npu_max_resident_programs=4, npu_dispatch_s=1e-6, npu_sync_s=0.0)
    loose = get_platform("m2-max", npu_max_resident_programs="unlimited", npu_max_compiles="unlimited",
                         npu_dispatch_s=1e-6, npu_sync_s=0.0)
    off = variant_plan(prof, "npumoe", specs, tight, {"npu_program_budget": "off"})
    free = variant_plan(prof, "npumoe", specs, loose, {})
    assert _resident(off) == _resident(free) > 2 and off.limits["npu_program_budget"] == "off"
    assert _resident(variant_plan(prof, "npumoe", specs, tight, {})) == 2       # 4 programs - 2 attention graphs
    tg = variant_plan(prof, "npumoe-tg", specs, tight, {})                     # forced all resident: not moved
    assert _resident(tg) == sum(len(lp["groups"]) for lp in tg.layers) and not tg.limits


def test_a_budget_knob_is_off_or_a_whole_number():
    assert PlanKnobs(npu_program_budget="off").npu_program_budget == "off"
    for bad in ("on", -1, 1.5):
        with pytest.raises(NpuMoeError):
            PlanKnobs(npu_program_budget=bad)
