"""The plan tuner: the Pareto filter against a brute-force reference, the candidate space, a geometry-only run
(no weights, fast) and every option's error. The real-model acceptance lives in test_tune_model.py (slow)."""
import itertools
import json

import numpy as np
import pandas as pd
import pytest

from npumoe_lab.cli import main
from npumoe_lab.errors import NpuMoeError
from npumoe_lab.studies.tune import SPACE, candidates, pareto, tune


def test_pareto_against_brute_force():
    rng = np.random.default_rng(0)
    df = pd.DataFrame(rng.integers(0, 5, size=(40, 3)), columns=["ttft_ms", "drop_rate", "energy_mj"])
    rows = df.to_numpy()
    expect = [not any((o <= r).all() and (o < r).any() for o in rows) for r in rows]
    assert pareto(df).tolist() == expect
    hand = pd.DataFrame({"ttft_ms": [1, 2, 2, 3], "drop_rate": [0.3, 0.1, 0.2, 0.3], "energy_mj": [5, 5, 5, 1]})
    assert pareto(hand).tolist() == [True, True, False, True]    # row 2 is beaten by row 1 in drop only


def test_candidates_default_first_distinct_and_valid():
    pts = candidates(SPACE, 30, seed=1)
    assert pts[0] == {} and len(pts) == 31
    assert len({json.dumps(p, sort_keys=True) for p in pts}) == len(pts)
    for p in pts[1:]:
        assert all(p[k] in SPACE[k] for k in p)
        assert ("hot_threshold" in p) <= (p["residency"] == "threshold")
    small = {k: v[:1] for k, v in SPACE.items()}
    n_distinct = len(set(itertools.product(*small.values())))
    assert len(candidates(small, 30, seed=1)) == 1 + n_distinct     # a small space is exhausted, not repeated


def test_geometry_run_writes_front_and_plan(tmp_path):
    rep = tune(geometry="phi-tiny-moe", routing="synthetic:gini=0.5", budget_drop=0.05, out=tmp_path,
               n_candidates=6, prompt_len=256, chunk=128,
               space={"tiers": [2, 3], "group_size": [4, 8], "residency": ["all", "threshold"]})
    assert rep["confirmed_on"] == "none" and rep["chosen"]["drop_source"] == "replayed"
    cands = pd.read_csv(tmp_path / "candidates.csv")
    front = pd.read_csv(tmp_path / "front.csv")
    assert len(front) == rep["front_size"] and set(front["candidate"]) <= set(cands["candidate"])
    assert pareto(cands).sum() == len(front)
    ok = cands[cands["drop_rate"] <= 0.05]
    if rep["met"]:
        assert rep["chosen"]["ttft_ms_modeled"] == pytest.approx(ok["ttft_ms"].min())
    for name in ("plan.json", "front.png", "tune.json"):
        assert (tmp_path / name).stat().st_size > 0
    assert {"tiers", "group_size", "residency", "percentile", "hot_threshold"} <= set(front.columns)


@pytest.mark.parametrize("kwargs, msg", [
    (dict(budget_drop=0), "budget_drop=0 must be a number > 0"),
    (dict(budget_drop=-0.1), "must be a number > 0"),
    (dict(budget_drop=1.5), "share"),
    (dict(budget_ttft_ms=0), "budget_ttft_ms=0"),
    (dict(budget_drop=0.05, budget_ttft_ms=10), "exactly one budget"),
    (dict(), "exactly one budget"),
    (dict(budget_drop=0.05, space={"tierz": [1]}), "unknown tune knob"),
    (dict(budget_drop=0.05, space={"tiers": []}), "non-empty list"),
    (dict(budget_drop=0.05, space={"tiers": [0]}), "tiers"),
    (dict(budget_drop=0.05, n_candidates=0), "n_candidates"),
    (dict(budget_drop=0.05, prompt_len=200), "multiple of chunk"),
    (dict(budget_drop=0.05, platform="cpu"), "measured"),
])
def test_bad_options_are_clear_errors(kwargs, msg):
    with pytest.raises(NpuMoeError, match=msg):
        tune(geometry="phi-tiny-moe", routing="synthetic:gini=0.5", n_candidates=kwargs.pop("n_candidates", 2),
             **kwargs)


def test_cli_exit_2_on_bad_values(capsys):
    assert main(["tune", "--geometry", "phi-tiny-moe", "--budget-drop", "0"]) == 2
    assert "budget_drop=0.0 must be a number > 0" in capsys.readouterr().err
    assert main(["tune", "--geometry", "phi-tiny-moe", "--budget-drop", "0.05", "--space", "tierz=1"]) == 2
    assert "unknown tune knob" in capsys.readouterr().err
    assert main(["tune", "--geometry", "phi-tiny-moe", "--budget-drop", "0.05", "--space", "tiers"]) == 2


def test_geometry_ttft_budget_picks_least_drop_within_budget():
    kw = dict(geometry="phi-tiny-moe", routing="synthetic:gini=0.5", n_candidates=8, prompt_len=256, chunk=128,
              space={"tiers": [1, 2, 3], "group_size": [4, 8], "residency": ["all", "threshold"]})
    first = tune(budget_drop=0.5, **kw)["candidates"]
    budget = float(first["ttft_ms"].median())
    rep = tune(budget_ttft_ms=budget, **kw)
    within = rep["candidates"][rep["candidates"]["ttft_ms"] <= budget]
    assert rep["met"] and rep["chosen"]["ttft_ms_modeled"] <= budget
    assert rep["chosen"]["drop_rate"] == pytest.approx(within["drop_rate"].min())
