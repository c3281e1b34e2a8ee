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
