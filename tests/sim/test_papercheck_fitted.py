"""paper-check on sourced and fitted platforms side by side: the fitted run simulates the fit's YAML but keeps the
grid's platform names, its numbers are the same simulation on the fitted platform, and a bad --fitted is one line."""
import pytest

from npumoe_lab.cli import main as cli
from npumoe_lab.sim.papercheck import fitted_platforms, paper_check, side_by_side
from npumoe_lab.sim.run import simulate

GRID = dict(geometry="phi-tiny-moe", platforms="m2-max,m2-ultra", prompt_len="512", chunk="256")


def test_fitted_run_is_the_simulation_on_the_fit_under_the_grid_name():
    fits = fitted_platforms(GRID["platforms"], "data/fits")
    assert set(fits) == {"m2-max", "m2-ultra"}
    table, _, df = paper_check(sensitivity=False, grid=GRID, platform_map={"m2-max": fits["m2-max"]})
    assert set(df.platform) == {"m2-max", "m2-ultra"} and set(df.platform_spec) == {"m2-max-fit", "m2-ultra"}
    direct = simulate("phi-tiny-moe", "synthetic:gini=0.6", fits["m2-max"], "npumoe", "512", "256")
    got = df[(df.platform == "m2-max") & (df.variant == "npumoe")].ttft_s.iloc[0]
    assert got == pytest.approx(direct.ttft_s.iloc[0], rel=1e-12)
    src, _, _ = paper_check(sensitivity=False, grid=GRID)
    text = side_by_side(src, table, {"m2-max": fits["m2-max"]})
    assert "| sourced / paper |" in text and "never a paper number" in text


def test_bad_fitted_folder_is_one_line(tmp_path, capsys):
    assert cli(["paper-check", "--fitted", str(tmp_path / "none"), "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip()
    assert "--fitted" in err and len(err.splitlines()) == 1


def test_claims_and_their_probability_are_recomputed_from_each_draw():
    """A claim's value = the lowest baseline / npumoe TTFT over the platform's grid; P(holds) = the share of draws
    where that lowest ratio > 1, computed here from the simulation's own per-draw TTFTs (fitted platform: its
    posterior)."""
    import numpy as np
    from npumoe_lab.sim.papercheck import claim_name
    from npumoe_lab.sim.run import iter_simulation
    grid = dict(geometry="phi-tiny-moe", platforms="m2-max", prompt_len="512", chunk="256,512")
    fits = {"m2-max": "data/fits/m2-max-fit.yaml"}
    table, _, df = paper_check(sensitivity=False, grid=grid, platform_map=fits, draws=40)
    t = table.set_index("quantity")
    runs = list(iter_simulation("phi-tiny-moe", "synthetic:gini=0.6", fits["m2-max"], "all", "512", "256,512",
                                draws=40))
    for b in ("cpu-only", "naive-npu", "anemll"):
        per = {}
        for row, res in runs:
            per.setdefault(row["chunk"], {})[row["variant"]] = (row["ttft_s"], res.draws["ttft_s"])
        point = min(v[b][0] / v["npumoe"][0] for v in per.values())
        drawn = np.min([v[b][1] / v["npumoe"][1] for v in per.values()], axis=0)
        name = claim_name(b, "m2-max")
        assert t.at[name, "kind"] == "claim" and t.at[name, "modeled"] == pytest.approx(point, rel=1e-9)
        assert t.at[name, "p_holds"] == pytest.approx(np.mean(drawn > 1))
        assert t.at[name, "modeled_lo"] == pytest.approx(np.percentile(drawn, 5), rel=1e-9)
    assert table.interval_source.iloc[0] == "posterior+prior (m2-max-fit)"
    assert table[table.kind == "quantity"].p_holds.isna().all()


def test_side_by_side_states_each_probability_of_both_runs():
    grid = dict(GRID, platforms="m2-max")
    fits = {"m2-max": "data/fits/m2-max-fit.yaml"}
    src, _, _ = paper_check(sensitivity=False, grid=grid, draws=20)
    fit, _, _ = paper_check(sensitivity=False, grid=grid, platform_map=fits, draws=20)
    text = side_by_side(src, fit, fits)
    assert "| P(0.8-1.25x) sourced |" in text and "| P(holds) fitted |" in text
    assert "sourced = prior (m2-max); fitted = posterior+prior (m2-max-fit)" in text
    q = "end-to-end speedup vs anemll, highest (x)"     # e2e_s ratios (8 decode tokens by default)
    row = next(line for line in text.splitlines() if line.startswith(f"| {q} |"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    pf = fit.set_index("quantity").at[q, "p_within_25pct"]
    ps = src.set_index("quantity").at[q, "p_within_25pct"]
    assert cells[4] == f"{ps:.0%}" and cells[7] == f"{pf:.0%}"
    claim = next(line for line in text.splitlines() if line.startswith("| npumoe faster than cpu-only on m2-max"))
    ph = fit.set_index("kind", append=True).xs("claim", level="kind").set_index("quantity").p_holds
    assert claim.rstrip(" |").endswith(f"{ph.iloc[0]:.0%}")


def test_claims_carry_their_sobol_indices_and_a_settle_line():
    """paper_check(sobol=N): every claim row names its largest Sobol indices and the measurement that would settle
    it, one entry per claim in table.attrs, and the markdown lines say so."""
    import numpy as np
    from npumoe_lab.sim.claim_sobol import sobol_lines
    grid = dict(geometry="phi-tiny-moe", platforms="m2-max", prompt_len="512", chunk="256")
    table, _, _ = paper_check(sensitivity=False, grid=grid, platform_map={"m2-max": "data/fits/m2-max-fit.yaml"},
                              draws=20, sobol=16)
    claims = table[table.kind == "claim"]
    assert len(claims) == 3 and claims.sobol_top.str.contains("S1").all() and claims.settle.str.len().gt(0).all()
    rows = table.attrs["claims_sobol"]
    assert {r["claim"] for r in rows} == set(claims.quantity)
    assert all(0 <= r["p_holds"] <= 1 and np.isfinite([s for _, s, _ in r["sobol"]]).all() for r in rows)
    assert any("settle" in line for line in sobol_lines(rows))
