"""The simulation's rows held to the rows of the code before its speed-ups (commit 281e10a: the top-k sampler by
argpartition, plan layers rebuilt per plan, per-row template rows), exactly, on small grids: the paper grid's
variants and platforms on two geometries, a 10k-sweep cell (cost residency, group size 4), parameter draws, the
per-op engine. The fixtures hold the rows those grids gave then, written by `python tests/sim/test_golden_grid.py
--write` at that commit; rewrite them only with a change that is meant to change numbers, and say so in its commit.
Exact except in the last bits of floats: NumPy's sums run on the CPU's SIMD width (an avx512 CPU adds in other
lanes than the avx2 one the fixtures were written on: up to 18 ulps seen, 2.4e-15 relative), so float columns are
held to MAX_ULP units in the last place (NaN where the fixture has NaN), every other column exactly. On one CPU
the rows are exactly equal (the caches' tests hold that)."""
from __future__ import annotations

import io
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "golden_simulate"      # one parquet file per grid
MAX_ULP = 32       # the avx512 vs avx2 summation differences seen: <= 18 ulps
VARYING = ("created", "git_commit", "versions", "host")       # the run's provenance, not its numbers

GRIDS = {
    "paper": dict(geometry="phi-tiny-moe,qwen3-30b-a3b", platforms="m2-max,m2-ultra", variants="all",
                  prompt_len="1024,1536", chunk="512", draws=0),
    "sweep-cell": dict(geometry="phi-tiny-moe", variants="npumoe", prompt_len=1024, chunk="128,256",
                       platforms="m2-max,m3-max", routing="synthetic:gini=0.45", group_size=4, tiers=3,
                       percentile=90, residency="cost"),
    "sweep-all": dict(geometry="phi-tiny-moe", variants="npumoe", prompt_len=1024, chunk="256",
                      platforms="m4-max", routing="synthetic:gini=0.7", group_size=16, tiers=2, percentile=99,
                      residency="all"),
    "draws": dict(geometry="phi-tiny-moe", platforms="m2-max", variants="npumoe,anemll,npumoe-tg",
                  prompt_len=1024, chunk="256", draws=16),
    "ops": dict(geometry="phi-tiny-moe", platforms="m2-ultra", variants="npumoe,cpu-only", prompt_len=512,
                chunk="256", engine="ops"),
}


def grid_rows(name: str) -> pd.DataFrame:
    from npumoe_lab.sim.run import simulate
    df = simulate(**GRIDS[name])
    return pd.read_parquet(_roundtrip(df.drop(columns=[c for c in VARYING if c in df.columns])))


def _write() -> None:
    FIXTURES.mkdir(parents=True, exist_ok=True)
    for name in GRIDS:
        grid_rows(name).to_parquet(FIXTURES / f"{name}.parquet", index=False)


def _roundtrip(df: pd.DataFrame):
    """The rows through parquet in memory: the column types the stored rows have."""
    buf = io.BytesIO()
    df.to_parquet(buf, index=False)
    buf.seek(0)
    return buf


@pytest.mark.parametrize("name", list(GRIDS))
def test_rows_equal_the_rows_before_the_speedups(name, monkeypatch):
    monkeypatch.setenv("NPUMOE_NO_PROGRESS", "1")
    want = pd.read_parquet(FIXTURES / f"{name}.parquet")
    got = grid_rows(name)
    assert list(got.columns) == list(want.columns)
    floats = [c for c in want.columns if want[c].dtype.kind == "f"]
    pd.testing.assert_frame_equal(got.drop(columns=floats), want.drop(columns=floats), check_exact=True)
    for c in floats:
        a, b = got[c].to_numpy(dtype=float), want[c].to_numpy(dtype=float)
        np.testing.assert_array_equal(np.isnan(a), np.isnan(b), err_msg=c)
        np.testing.assert_array_max_ulp(a[~np.isnan(a)], b[~np.isnan(b)], maxulp=MAX_ULP)


if __name__ == "__main__":
    if "--write" in sys.argv:
        _write()
        print(f"written {FIXTURES}")
