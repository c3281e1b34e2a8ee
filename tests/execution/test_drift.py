"""Drift monitor and recalibration: the measures against hand-computed values, and a routing-only replay where the
calibration and the run popularity differ (flags, rebuild, recovered drop rate)."""
import copy
import dataclasses
import math
import warnings

import numpy as np
import pytest

from npumoe_lab.execution.drift import DriftLimits, DriftMonitor, DriftWarning, changed_graphs, jensen_shannon, measures
from npumoe_lab.execution.engine import LayerStats, PlanExecutor
from npumoe_lab.errors import NpuMoeError
from npumoe_lab.planning.plan import build_plan
from npumoe_lab.execution.runtime import PrefillConfig
from npumoe_lab.sim.geometries import load_geometry
from npumoe_lab.sim.replay import replay_prefill
from npumoe_lab.sim.routing import synthetic


def test_jensen_shannon_hand_computed():
    assert jensen_shannon([1, 0], [0, 1]) == pytest.approx(1.0)
    assert jensen_shannon([3, 1], [6, 2]) == pytest.approx(0.0, abs=1e-12)
    # p = (1/2, 1/2), q = (1, 0), m = (3/4, 1/4): KL(p||m) = (log2(2/3) + log2(2)) / 2, KL(q||m) = log2(4/3)
    jsd = ((math.log2(2 / 3) + 1) / 2 + math.log2(4 / 3)) / 2
    assert jensen_shannon([1, 1], [1, 0]) == pytest.approx(math.sqrt(jsd))


def test_hot_overlap_hand_computed():
    js, overlap = measures([9, 8, 0, 0], np.array([0.1, 0.2, 0.3, 0.4]), k=2)
    assert overlap == 0.0 and js > 0.5        # hot set {0, 1} vs calibrated {3, 2}
    assert measures([1, 5, 4, 0], np.array([0.1, 0.4, 0.1, 0.4]), k=2)[1] == 0.5   # {1, 2} vs {1, 3}


@pytest.fixture(scope="module")
def setting():
    _, _, geometry = load_geometry("phi-tiny-moe")
    specs = [geometry.moe_layers[i] for i in sorted(geometry.moe_layers)][:4]
    geometry = dataclasses.replace(geometry, moe=tuple(specs), n_layers=4)     # a short stack: a fast replay
    routing = synthetic(specs, gini=0.6, workload_overlap=0.0, seed=1)     # run hot set != calibration hot set
    profile = routing.calibration_profile(specs, chunk=128)
    plan = build_plan(profile, specs, platform="m2-max", residency="all")
    return geometry, specs, routing, profile, plan


def _replay(setting, monitor=None, plan=None, chunks=10):
    geometry, specs, routing, profile, base = setting
    config = PrefillConfig("m2-max", 128)
    ex = PlanExecutor(plan or base, [], monitor=monitor)
    res = replay_prefill(geometry, ex, config, routing.chunks(specs, 128 * chunks, 128, seed=3), 128 * chunks)[0]
    per = {}
    for c, _, s in res.stats:
        r, d = per.get(c, (0, 0))
        per[c] = (r + s.routed, d + s.dropped)
    return [d / r for _, (r, d) in sorted(per.items())], res


def test_monitor_flags_and_rebuild_recovers(setting):
    geometry, specs, routing, profile, plan = setting
    static, _ = _replay(setting)
    mon = DriftMonitor(plan, profile, recalibrate="rebuild", persist=2, window=4)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", DriftWarning)
        adaptive, _ = _replay(setting, mon)
    df = mon.frame()
    assert len(df) == 10 * 4 and set(df.columns) >= {"chunk", "layer", "js", "hot_overlap", "drop_excess", "flagged"}
    assert (df[df.chunk < 2].flagged != "").all()           # every layer drifts before the rebuild
    # one warning per (layer, measure) crossed, each naming its layer and measure
    pairs = {(r.layer, m) for r in df.itertuples() for m in r.flagged.split(",") if m}
    assert len(caught) == len(pairs)
    named = {(int(str(w.message).split("MoE layer ")[1].split(",")[0]), str(w.message).split(": ")[1].split("=")[0])
             for w in caught}
    assert named == pairs
    assert mon.rebuilds and mon.rebuilds[0].chunk == 1    # drift in chunks 0 and 1 (persist=2): rebuilt after 1
    # the rebuilt plan runs from chunk 2: drops as low as a plan built on the run's own popularity
    direct_profile = type(routing)(routing.label, routing.run, routing.run).calibration_profile(specs, chunk=128)
    direct = build_plan(direct_profile, specs, platform="m2-max", residency="all")
    target, _ = _replay(setting, plan=direct)
    later = slice(mon.rebuilds[0].chunk + 1, None)
    assert np.mean(static[later]) > np.mean(target[later]) + 0.05      # the drift costs drops
    assert abs(np.mean(adaptive[later]) - np.mean(target[later])) <= 0.02
    assert adaptive[:2] == static[:2]                     # nothing changes before the rebuild is adopted


def test_policies_off_and_warn_never_rebuild(setting):
    geometry, specs, routing, profile, plan = setting
    static, _ = _replay(setting)
    for policy in ("off", "warn"):
        mon = DriftMonitor(plan, profile, recalibrate=policy, persist=2)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", DriftWarning)
            drops, _ = _replay(setting, mon)
        assert drops == static and not mon.rebuilds
        assert any("would rebuild" in str(w.message) for w in caught) == (policy == "warn")


def test_changed_graphs_counts_only_new_shapes(setting):
    _, _, _, _, plan = setting
    assert changed_graphs(plan, plan) == []
    other = type(plan).from_dict(copy.deepcopy(plan.to_dict()) | {"hash": None})
    other.layers[0]["groups"][0]["capacity"] += 8
    other.layers[1]["groups"][0]["resident"] = False
    changed = changed_graphs(plan, other)
    g = other.layers[0]["groups"][0]
    assert changed == [(other.layers[0]["layer"], tuple(g["experts"]), g["capacity"])]


def test_bad_options_are_clear_errors(setting):
    _, specs, _, profile, plan = setting
    for kwargs, msg in (({"recalibrate": "sometimes"}, "recalibrate"), ({"persist": 0}, "persist"),
                        ({"window": 1, "persist": 2}, "window"), ({"limits": {"jsd": 0.1}}, "unknown drift limit"),
                        ({"limits": {"js": 2.0}}, "in \\[0, 1\\]")):
        with pytest.raises(NpuMoeError, match=msg):
            DriftMonitor(plan, profile, **kwargs)
    with pytest.raises(NpuMoeError, match="another|built for model"):
        other = type(profile)(profile.counts, profile.stats, dict(profile.meta, model_fingerprint="x" * 64))
        DriftMonitor(plan, other)
    with pytest.raises(NpuMoeError, match="hot_k"):
        DriftLimits(hot_k=0)
    mon = DriftMonitor(plan, profile)
    with pytest.raises(NpuMoeError, match="not in the monitored plan"):
        mon.observe(0, 99, np.zeros(4), LayerStats())
