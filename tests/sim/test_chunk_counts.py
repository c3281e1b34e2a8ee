"""A prompt's routing counted as it is drawn (PopularityRouting.chunk_counts) equals the counts of its sampled
chunks (routing_counts of chunks(): expert ids, ordered and weighted), for every source kind, prompt order and
partial last chunk, with the draw cache off and on; and simulated rows do not depend on which path counted."""
from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest

from npumoe_lab.sim import routing
from npumoe_lab.sim.geometries import load_geometry
from npumoe_lab.sim.stream import routing_counts


def _phi_specs():
    return list(load_geometry("phi-tiny-moe", hf_config=False)[2].moe)[:6]


def _mixed_source():
    """Layers of 12, 40 and 9 experts (E differs by layer), top 3, chunk and document variation."""
    specs = [SimpleNamespace(layer=i, n_experts=E, top_k=3) for i, E in enumerate((12, 40, 9))]
    g = np.random.default_rng(5)
    shares = {s.layer: g.dirichlet(np.ones(s.n_experts)) for s in specs}
    return specs, routing.PopularityRouting("mixed", shares, shares, top_k=3, concentration=30.0,
                                            doc_concentration=8.0)


def _sources():
    specs = _phi_specs()
    yield "synthetic", specs, lambda: routing.parse_routing("synthetic:gini=0.6", specs, 0)
    yield "no variation", specs, lambda: routing.parse_routing(
        "synthetic:gini=0.5,concentration=inf,doc_concentration=inf", specs, 0)
    g = np.random.default_rng(9)
    records = {s.layer: g.dirichlet(np.ones(s.n_experts), size=3) for s in specs}

    def replayed():     # a source replaying recorded per-chunk popularity (profile:DIR,run=DIR2)
        base = routing.parse_routing("synthetic:gini=0.6", specs, 0)
        return dataclasses.replace(base, run_records=records, _gini={}, _profiles={}, _sampled={})
    yield "recorded chunks", specs, replayed
    mixed_specs, _ = _mixed_source()
    yield "mixed experts", mixed_specs, lambda: _mixed_source()[1]


@pytest.mark.parametrize("cache_on", [False, True])
@pytest.mark.parametrize("name,specs,make", list(_sources()), ids=lambda x: x if isinstance(x, str) else "")
def test_counted_draws_equal_the_counts_of_the_sampled_chunks(name, specs, make, cache_on, tmp_path, monkeypatch):
    monkeypatch.setenv("NPUMOE_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("NPUMOE_DRAW_CACHE", "on" if cache_on else "off")
    chunk = 64
    for order in ([100, 640, 130], [640, 64, 300]):      # partial last chunks, extensions, shorter after longer
        counted, sampled = make(), make()
        for t in order:
            every, real = counted.chunk_counts(specs, t, chunk, 0)
            want = routing_counts(sampled.chunks(specs, t, chunk, 0), specs, t, chunk)
            np.testing.assert_array_equal(real, want.real)
            np.testing.assert_array_equal((every > 0).sum(2), want.touched)
            assert every.sum() == len(specs) * want.n_chunks * chunk * specs[0].top_k     # padding counted
            assert real.sum() == len(specs) * t * specs[0].top_k
            assert counted.gini() == sampled.gini()          # the run Gini of this prompt, as chunks() sets it
    if cache_on:        # a fresh source reads both kinds of draw back from the cache: the same counts
        again = make()
        np.testing.assert_array_equal(again.chunk_counts(specs, 300, chunk, 0)[1],
                                      routing_counts(make().chunks(specs, 300, chunk, 0), specs, 300, chunk).real)


def test_simulated_rows_do_not_depend_on_the_counting_path(monkeypatch):
    """The array engine counts as it draws; with chunk_counts hidden it counts sampled chunks: the same rows."""
    from npumoe_lab.sim.run import _cached_source, simulate
    monkeypatch.setenv("NPUMOE_NO_PROGRESS", "1")
    monkeypatch.setenv("NPUMOE_DRAW_CACHE", "off")
    grid = dict(geometry="phi-tiny-moe", platforms="m2-max", variants="npumoe,naive-npu,cpu-only",
                prompt_len="300,1024", chunk="256", workers=1)
    _cached_source.cache_clear()
    counted = simulate(**grid).drop(columns=["created"])
    monkeypatch.delattr(routing.PopularityRouting, "chunk_counts")
    _cached_source.cache_clear()
    sampled = simulate(**grid).drop(columns=["created"])
    _cached_source.cache_clear()
    pd.testing.assert_frame_equal(counted, sampled, check_exact=True)
