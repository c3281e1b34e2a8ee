"""The keyed draw cache (sim/draw_cache.py): a run that reads its routing draws from the cache gives the rows a run
that samples them gives; every field the draws depend on is in the key; a broken entry is a miss."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from npumoe_lab.sim import draw_cache, routing
from npumoe_lab.sim.geometries import load_geometry

GRID = dict(geometry="phi-tiny-moe", platforms="m2-max,m3-max", variants="npumoe,anemll,cpu-only",
            prompt_len="512,1536", chunk="256,512", draws=0, workers=1)


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("NPUMOE_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("NPUMOE_NO_PROGRESS", "1")
    monkeypatch.delenv("NPUMOE_DRAW_CACHE", raising=False)
    return tmp_path / "draws"


def _fresh_rows(**kw) -> pd.DataFrame:
    """simulate() with the process's own memo of sources cleared (so the draws come from the cache or sampling)."""
    from npumoe_lab.sim.run import _cached_source, simulate
    _cached_source.cache_clear()
    return simulate(**{**GRID, **kw}).drop(columns=["created"])


def _specs():
    return list(load_geometry("phi-tiny-moe", hf_config=False)[2].moe)


def test_cached_and_uncached_runs_give_identical_rows(cache, monkeypatch):
    monkeypatch.setenv("NPUMOE_DRAW_CACHE", "off")
    sampled = _fresh_rows()
    assert not cache.exists()                      # off: nothing read, nothing written
    monkeypatch.delenv("NPUMOE_DRAW_CACHE")
    cold = _fresh_rows()
    assert len(list(cache.glob("*.pkl"))) >= 4     # calibration per chunk, prompt and decode chunks, the zipf fit

    def no_sampling(*a, **k):
        raise AssertionError("a warm run sampled a routing draw")
    monkeypatch.setattr(routing, "sample_routing_np", no_sampling)
    monkeypatch.setattr(routing, "sample_routing_mask", no_sampling)
    monkeypatch.setattr(routing, "zipf_for_gini", no_sampling)
    warm = _fresh_rows()
    pd.testing.assert_frame_equal(cold, sampled, check_exact=True)
    pd.testing.assert_frame_equal(warm, sampled, check_exact=True)


def test_a_longer_prompt_continues_the_cached_stream(cache, monkeypatch):
    specs = _specs()
    src = routing.parse_routing("synthetic:gini=0.6", specs, 0)
    src.chunks(specs, 512, 256, 0)                 # 2 chunks cached, with the generator's state after them
    again = routing.parse_routing("synthetic:gini=0.6", specs, 0)
    got = again.chunks(specs, 1536, 256, 0)        # 4 more drawn from the restored state
    monkeypatch.setenv("NPUMOE_DRAW_CACHE", "off")
    fresh = routing.parse_routing("synthetic:gini=0.6", specs, 0)
    want = fresh.chunks(specs, 1536, 256, 0)
    assert len(got) == len(want) == 6 and again.gini() == fresh.gini()
    for g, w in zip(got, want):
        for layer in w:
            np.testing.assert_array_equal(g[layer][0], w[layer][0])
            np.testing.assert_array_equal(g[layer][1], w[layer][1])


def _calibration_key(src, specs, chunk=256, seed=0):
    return draw_cache.key("calibration", routing._spec_key(specs), chunk, seed, 32, src.concentration,
                          src.doc_concentration, routing._layers_of(src.calibration, specs),
                          routing._layers_of(src.calib_sources, specs), routing._layers_of(src.calib_records, specs))


def test_every_key_field_changes_the_key(cache, monkeypatch):
    specs = _specs()
    src = routing.parse_routing("synthetic:gini=0.6", specs, 0)
    base = _calibration_key(src, specs)
    assert base == _calibration_key(routing.parse_routing("synthetic:gini=0.6", specs, 0), specs)
    changed = {
        "chunk": _calibration_key(src, specs, chunk=512),
        "seed": _calibration_key(src, specs, seed=1),
        "top_k": _calibration_key(src, [type(s)(**{**vars(s), "top_k": s.top_k + 1}) for s in specs]),
        "layers": _calibration_key(src, specs[:-1]),
        "popularity": _calibration_key(routing.parse_routing("synthetic:gini=0.61", specs, 0), specs),
        "concentration": _calibration_key(routing.parse_routing("synthetic:gini=0.6,concentration=50", specs, 0),
                                          specs),
        "doc_concentration": _calibration_key(
            routing.parse_routing("synthetic:gini=0.6,doc_concentration=50", specs, 0), specs),
        "mix": _calibration_key(routing.parse_routing("synthetic:gini=0.6,calibration=code", specs, 0), specs),
    }
    one = src.calibration[specs[0].layer].copy()
    one[0] = np.nextafter(one[0], 1.0)             # one share one ulp away
    src.calibration = {**src.calibration, specs[0].layer: one}
    changed["one ulp"] = _calibration_key(src, specs)
    src.calibration = routing.parse_routing("synthetic:gini=0.6", specs, 0).calibration
    monkeypatch.setattr(draw_cache, "code_version", lambda: "another sampler")
    changed["sampler code"] = _calibration_key(src, specs)
    same = [name for name, k in changed.items() if k == base]
    assert not same, f"the key ignores {same}"


def test_a_changed_field_misses_the_cache_and_a_broken_entry_is_resampled(cache, monkeypatch):
    specs = _specs()
    monkeypatch.setenv("NPUMOE_DRAW_CACHE", "off")
    want = routing.parse_routing("synthetic:gini=0.6", specs, 0).calibration_profile(specs, 256, 0)
    monkeypatch.delenv("NPUMOE_DRAW_CACHE")
    routing.parse_routing("synthetic:gini=0.6", specs, 0).calibration_profile(specs, 256, 0)
    n = len(list(cache.glob("calibration-*.pkl")))
    routing.parse_routing("synthetic:gini=0.6", specs, 0).calibration_profile(specs, 256, 1)     # another seed
    assert len(list(cache.glob("calibration-*.pkl"))) == n + 1
    for f in cache.glob("calibration-*.pkl"):
        f.write_bytes(b"not a pickle")
    got = routing.parse_routing("synthetic:gini=0.6", specs, 0).calibration_profile(specs, 256, 0)
    pd.testing.assert_frame_equal(got.counts, want.counts, check_exact=True)
    for s in specs:
        np.testing.assert_array_equal(got.count_matrix(s.layer), want.count_matrix(s.layer))
