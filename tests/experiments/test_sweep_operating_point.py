"""The operating point (and the decode settings) in sweeps: a grid entry of a `kind: simulate` sweep or a notebook's
parameter, `npumoe-lab sweep --operating-point` over every cell, values checked before any cell runs (one line,
exit 2, nothing written), and a band no percentile reaches is the cell's stated failure. Reference: direct
simulate() calls of the same cells."""
import json

import numpy as np
import pytest

from npumoe_lab import cli
from npumoe_lab.experiments.sweep import run_sweep
from npumoe_lab.results.store import load_results
from npumoe_lab.sim.run import simulate
from npumoe_lab.utils import REPO_ROOT

CELL = "parameters: {geometry: phi-tiny-moe, platforms: m2-max, variants: 'cpu-only,npumoe', draws: 0}\n"


def _spec(tmp_path, grid, kind="kind: simulate\n", params=CELL, name="op.yaml"):
    path = tmp_path / name
    path.write_text(kind + params + f"grid: {grid}\n")
    return path


def test_operating_point_as_a_simulate_grid_entry_gives_the_direct_rows(tmp_path):
    report = run_sweep(_spec(tmp_path, "{operating_point: [default, paper]}"), tmp_path / "out")
    assert len(report.done) == 2 and not report.failed
    rows = load_results(tmp_path / "out").set_index(["operating_point", "variant"]).sort_index()
    for op in ("default", "paper"):
        direct = simulate("phi-tiny-moe", platforms="m2-max", variants="cpu-only,npumoe", draws=0,
                          operating_point=op).set_index("variant").sort_index()
        np.testing.assert_allclose(rows.loc[op].ttft_s, direct.ttft_s, rtol=1e-12)
        assert rows.loc[(op, "npumoe"), "drop_rate"] == pytest.approx(direct.at["npumoe", "drop_rate"], rel=1e-12)
    paper = rows.loc[("paper", "npumoe")]
    assert paper.percentile < 90 and paper.op_in_band and 0.10 <= paper.drop_rate <= 0.22
    assert rows.loc[("default", "npumoe"), "drop_rate"] < 0.10


def test_the_sweep_flag_sets_every_cell_over_the_yaml(tmp_path, capsys):
    spec = _spec(tmp_path, "{operating_point: [default], chunk: [256]}")
    assert cli.main(["sweep", str(spec), "--out", str(tmp_path / "out"), "--operating-point", "paper"]) == 0
    done = [json.loads(p.read_text()) for p in (tmp_path / "out" / "cells").glob("*/DONE.json")]
    assert [d["params"]["operating_point"] for d in done] == ["paper"]
    assert set(load_results(tmp_path / "out").operating_point) == {"paper"}
    # a notebook that does not take it: the notebook's parameter check, one line, nothing run
    nb = _spec(tmp_path, "{chunk: [128]}", kind=f"notebook: {REPO_ROOT / 'notebooks' / '05_baselines.py'}\n",
               params="parameters: {model: tiny}\n", name="nb.yaml")
    capsys.readouterr()
    assert cli.main(["sweep", str(nb), "--out", str(tmp_path / "nb"), "--operating-point", "paper"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "'operating_point'" in err[0] and "05_baselines.py" in err[0]
    assert not (tmp_path / "nb").exists()


@pytest.mark.parametrize("grid,what", [
    ("{decode_tokens: [8, -1]}", "grid.decode_tokens in sweep .*: --decode-tokens -1: give a whole number"),
    ("{decode_policy: [pipeline, gpu]}", "grid.decode_policy in sweep .*: --decode-policy 'gpu' is not a decode"),
    ("{operating_point: [paperish]}", "grid.operating_point in sweep .*: --operating-point 'paperish': use one of"),
])
def test_bad_sweep_values_are_one_line_exit_2_before_any_cell(tmp_path, capsys, grid, what):
    import re
    assert cli.main(["sweep", str(_spec(tmp_path, grid)), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and re.search(what, err[0]), err
    assert not (tmp_path / "out").exists()


def test_a_notebook_parameter_is_checked_too(tmp_path, capsys):
    nb = _spec(tmp_path, "{operating_point: [default, papr]}",
               kind=f"notebook: {REPO_ROOT / 'notebooks' / '08_paper_scale.py'}\n", params="")
    assert cli.main(["sweep", str(nb), "--out", str(tmp_path / "out")]) == 2
    assert "grid.operating_point" in capsys.readouterr().err and not (tmp_path / "out").exists()


def test_an_unreachable_band_is_the_cells_stated_failure(tmp_path):
    # one NPU program: the attention graphs take it, no group is resident, npumoe drops nothing at any percentile
    params = ("parameters: {geometry: phi-tiny-moe, platforms: 'm2-max[npu_max_resident_programs=1]', "
              "variants: npumoe, draws: 0}\n")
    report = run_sweep(_spec(tmp_path, "{operating_point: [paper]}", params=params), tmp_path / "out")
    (cell,) = report.failed
    assert "no percentile puts npumoe's drop in 10%-22%: the closest is 0.0%" in cell.error
    assert "the closest is" in json.loads((cell.dir / "FAILED.json").read_text())["error"]
