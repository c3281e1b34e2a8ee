"""The cyclic GC's relaxed thresholds during a simulation: the same rows as at CPython's defaults, thresholds
restored afterwards (also after an error), a caller's higher thresholds kept, and cycles still collected."""
import gc
import multiprocessing
import os

import pandas as pd
import pytest

from npumoe_lab.errors import NpuMoeError
from npumoe_lab.sim import run
from npumoe_lab.utils import RELAXED_GC_THRESHOLDS, relaxed_gc

GRID = dict(geometry="phi-tiny-moe", routing="synthetic:gini=0.5", platforms="m2-max", variants="all",
            prompt_len=512, chunk="128,256", draws=8)


@pytest.fixture
def default_thresholds():
    before = gc.get_threshold()
    gc.set_threshold(700, 10, 10)                     # CPython's defaults, whatever an earlier test left
    yield (700, 10, 10)
    gc.set_threshold(*before)


def _fresh_rows_at_cpython_thresholds(grid):
    """In a fresh (spawned) process: no source, profile or plan kept from the parent's run, caches off."""
    os.environ.update(NPUMOE_DRAW_CACHE="off", NPUMOE_PLAN_CACHE="off", NPUMOE_RELAXED_GC="off")
    gc.set_threshold(700, 10, 10)
    rows, _ = run.simulate_with_timelines(**grid)
    return gc.get_threshold(), rows


def test_rows_equal_to_a_fresh_process_at_cpython_thresholds(default_thresholds, monkeypatch):
    monkeypatch.setenv("NPUMOE_DRAW_CACHE", "off")
    monkeypatch.setenv("NPUMOE_PLAN_CACHE", "off")
    seen = []
    original = run.iter_simulation

    def spy(*args, **kwargs):
        seen.append(gc.get_threshold())
        yield from original(*args, **kwargs)
    monkeypatch.setattr(run, "iter_simulation", spy)
    relaxed, _ = run.simulate_with_timelines(**GRID)
    assert seen == [RELAXED_GC_THRESHOLDS] and gc.get_threshold() == default_thresholds
    with multiprocessing.get_context("spawn").Pool(1) as pool:
        thresholds, plain = pool.apply(_fresh_rows_at_cpython_thresholds, (GRID,))
    assert thresholds == default_thresholds
    pd.testing.assert_frame_equal(relaxed.drop(columns=["created"]), plain.drop(columns=["created"]),
                                  check_exact=True)


def test_thresholds_restored_after_success_and_error(default_thresholds, tmp_path):
    run.simulate(**{**GRID, "chunk": 128, "draws": 0}, out=tmp_path / "rows")
    assert gc.get_threshold() == default_thresholds
    with pytest.raises(NpuMoeError):
        run.simulate(**{**GRID, "geometry": "no-such-geometry"})
    assert gc.get_threshold() == default_thresholds


def test_higher_caller_thresholds_kept_and_disabled_gc_stays_disabled():
    before, enabled = gc.get_threshold(), gc.isenabled()
    try:
        gc.set_threshold(100_000, 5, 500)
        gc.disable()
        with relaxed_gc():
            assert gc.get_threshold() == (100_000, 20, 500)
            assert not gc.isenabled()
        assert gc.get_threshold() == (100_000, 5, 500)
    finally:
        gc.set_threshold(*before)
        if enabled:
            gc.enable()


def test_off_switch_leaves_thresholds_alone(default_thresholds, monkeypatch):
    monkeypatch.setenv("NPUMOE_RELAXED_GC", "off")
    with relaxed_gc():
        assert gc.get_threshold() == default_thresholds
    monkeypatch.setenv("NPUMOE_RELAXED_GC", "on")
    with relaxed_gc():
        assert gc.get_threshold() == RELAXED_GC_THRESHOLDS


def test_cycles_still_collected_without_an_explicit_collect(default_thresholds):
    class Node:
        pass
    gc.collect()
    young_before = gc.get_stats()[0]["collections"]
    with relaxed_gc():
        for _ in range(4 * RELAXED_GC_THRESHOLDS[0]):
            node = Node()
            node.me = node                                 # a reference cycle: only the cyclic GC frees it
        collected = gc.get_stats()[0]["collections"] - young_before
    assert 1 <= collected <= 8          # at 700 it would be ~570 collections; at 50,000 about 4 (each node + dict)
