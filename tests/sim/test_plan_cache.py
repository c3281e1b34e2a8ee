"""The keyed plan cache (sim/plan_cache.py): a run that reads its plans from the cache gives the rows a run that
builds them gives; every input of a plan is in its key; a broken entry is rebuilt; stand-ins are never cached."""
from __future__ import annotations

import dataclasses

import pandas as pd
import pytest

from npumoe_lab.devices import as_platform
from npumoe_lab.planning import plan as plan_module
from npumoe_lab.planning.variants import get_variant
from npumoe_lab.sim import plan_cache, routing
from npumoe_lab.sim.geometries import load_geometry

GRID = dict(geometry="phi-tiny-moe", platforms="m2-max,m3-max", variants="all", prompt_len="512,1536",
            chunk="256,512", draws=0, workers=1)


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("NPUMOE_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("NPUMOE_NO_PROGRESS", "1")
    monkeypatch.setenv("NPUMOE_PLAN_CACHE", "on")
    return tmp_path / "plans"


def _rows(**kw) -> pd.DataFrame:
    from npumoe_lab.sim.run import _cached_source, simulate
    _cached_source.cache_clear()        # fresh sources and profiles: nothing kept in this process between runs
    return simulate(**{**GRID, **kw}).drop(columns=["created"])


def test_cached_and_built_plans_give_identical_rows(cache, monkeypatch):
    monkeypatch.setenv("NPUMOE_PLAN_CACHE", "off")
    built = _rows()
    assert not cache.exists()                       # off: nothing read, nothing written
    monkeypatch.setenv("NPUMOE_PLAN_CACHE", "on")
    cold = _rows()
    entries = list(cache.glob("*.pkl"))
    # 6 plan variants (npumoe-spill shares npumoe's plan) x 2 platforms x 2 chunks, fewer where plans coincide
    assert 0 < len(entries) <= 24

    def no_build(*a, **k):
        raise AssertionError("a warm run built a plan")
    monkeypatch.setattr(plan_module, "build_plan", no_build)
    warm = _rows()
    pd.testing.assert_frame_equal(cold, built, check_exact=True)
    pd.testing.assert_frame_equal(warm, built, check_exact=True)


def _parts(chunk=256, platform="m2-max", variant="npumoe", knobs=None, seed=0):
    specs = list(load_geometry("phi-tiny-moe", hf_config=False)[2].moe)
    src = routing.parse_routing("synthetic:gini=0.6", specs, seed)
    v = get_variant(variant)
    return v, specs, src.calibration_profile(specs, chunk, seed), as_platform(platform), \
        {**(knobs or {}), **v.plan_overrides}


def test_every_input_of_a_plan_is_in_its_key(monkeypatch):
    base = plan_cache.plan_key(*_parts())
    assert base is not None and base == plan_cache.plan_key(*_parts())          # the same inputs: the same name
    v, specs, profile, plat, knobs = _parts()
    changed = {
        "chunk": plan_cache.plan_key(*_parts(chunk=512)),
        "platform": plan_cache.plan_key(*_parts(platform="m3-max")),
        "platform parameter": plan_cache.plan_key(v, specs, profile, as_platform("m2-max", npu_dispatch_s=4e-4),
                                                  knobs),
        "knob": plan_cache.plan_key(*_parts(knobs={"percentile": 80})),
        "variant's forced knobs": plan_cache.plan_key(*_parts(variant="npumoe-tg")),
        "calibration seed": plan_cache.plan_key(*_parts(seed=1)),
        "attention placement": plan_cache.plan_key(dataclasses.replace(v, attention="cpu"), specs, profile, plat,
                                                   knobs),
        "top-k": plan_cache.plan_key(v, [type(s)(**{**vars(s), "top_k": s.top_k + 1}) for s in specs], profile,
                                     plat, knobs),
    }
    counts = profile.counts.copy()
    counts.loc[counts.index[0], "count"] += 1       # one token more in one calibration count
    other = type(profile)(counts, profile.stats, profile.meta, profile.coactivation)
    changed["one calibration count"] = plan_cache.plan_key(v, specs, other, plat, knobs)
    for what, name in changed.items():
        assert name is not None and name != base, what
    assert len(set(changed.values())) == len(changed)
    # npumoe-spill differs from npumoe in its executor only: one plan
    assert plan_cache.plan_key(*_parts(variant="npumoe-spill")) == base
    plan_cache.code_version.cache_clear()
    monkeypatch.setattr(plan_cache.keyed_store, "source_version", lambda paths: "edited planning code")
    try:
        assert plan_cache.plan_key(*_parts()) != base
    finally:
        plan_cache.code_version.cache_clear()


def test_the_key_covers_every_planning_module():
    names = {p.name for p in plan_cache.keyed_store.PACKAGE_ROOT.joinpath("planning").glob("*.py")}
    assert {"tiers.py", "grouping.py", "residency.py", "makespan.py", "plan.py", "layout.py"} <= names
    hashed = []
    real = plan_cache.keyed_store.source_version
    plan_cache.code_version.cache_clear()
    try:
        plan_cache.keyed_store.source_version = lambda paths: hashed.extend(paths) or real(paths)
        plan_cache.code_version()
    finally:
        plan_cache.keyed_store.source_version = real
        plan_cache.code_version.cache_clear()
    got = {(p.parent.name, p.name) for p in hashed}
    assert {("planning", n) for n in names} <= got
    assert ("devices", "platform.py") in got and ("core", "saliency_rules.py") in got


def test_a_broken_entry_is_rebuilt(cache):
    v, specs, profile, plat, knobs = _parts()
    calls = []

    def build():
        calls.append(1)
        p = plan_module.variant_plan(profile, v.name, specs, plat, {})
        return p, p.compile()
    first, _ = plan_cache.cached_plan(v, specs, profile, plat, knobs, build)
    (entry,) = cache.glob("*.pkl")
    again, _ = plan_cache.cached_plan(v, specs, profile, plat, knobs, build)
    assert len(calls) == 1 and again.to_dict() == first.to_dict()
    entry.write_bytes(b"not a pickle")
    rebuilt, _ = plan_cache.cached_plan(v, specs, profile, plat, knobs, build)
    assert len(calls) == 2 and rebuilt.to_dict() == first.to_dict()


def test_a_stand_in_platform_is_never_cached(cache):
    v, specs, profile, plat, knobs = _parts()
    stand_in = type("StandIn", (), {"npu": plat.npu, "cpu": plat.cpu, "name": "stand-in"})()
    assert plan_cache.plan_key(v, specs, profile, stand_in, knobs) is None
    built = plan_cache.cached_plan(v, specs, profile, stand_in, knobs, lambda: ("plan", "layout"))
    assert built == ("plan", "layout") and not cache.exists()
