"""Sweeps: papermill per grid cell, resume after SIGKILL, failures isolated, Dask == local, include merge, errors.

The fixture notebook (tests/fixtures/sweep_nb.py, .ipynb twin) writes one row with repeat=x, fails when x == 13.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from npumoe_lab import cli
from npumoe_lab.errors import NpuMoeError
from npumoe_lab.results.store import load_results
from npumoe_lab.experiments.sweep import run_sweep
from npumoe_lab.experiments.sweep_spec import load_spec

FIX = Path(__file__).resolve().parents[1] / "fixtures"
REPO = FIX.parent.parent
PROVENANCE = ["created", "host", "git_commit", "versions"]


def _cells(out: Path, marker: str) -> list[Path]:
    return [p.parent for p in out.glob(f"cells/*/{marker}")]


def test_resume_after_sigkill_runs_each_cell_exactly_once(tmp_path):
    out = tmp_path / "sweep"
    env = {**os.environ, "NPUMOE_NO_PROGRESS": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "npumoe_lab.cli", "sweep", str(FIX / "sweep_kill.yaml"),
                             "--out", str(out)], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 60
    running = []
    while time.time() < deadline:  # kill once a cell is done and the next one is mid-run
        done = _cells(out, "DONE.json")
        running = [c for c in _cells(out, "executed.ipynb") if c not in done]
        if done and running:
            break
        assert proc.poll() is None, "the sweep ended before it could be killed"
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    done_before = _cells(out, "DONE.json")
    assert len(done_before) == 1 and running
    time.sleep(1.5)  # ipykernel's parent poller ends the orphaned kernel within 1 s

    report = run_sweep(FIX / "sweep_kill.yaml", out)
    assert sorted(c.dir for c in report.skipped) == sorted(done_before)
    assert len(report.done) == 1 and not report.failed
    df = load_results(out)
    assert sorted(df["repeat"]) == [1, 2] and set(df["variant"]) == {"a"}
    assert (running[0] / "_attempts" / "001" / "executed.ipynb").exists(), "the killed attempt is kept aside"
    for path in out.rglob("*.parquet"):  # nothing corrupt anywhere, archived attempts included
        pq.read_table(path)
    for cell in out.glob("cells/*"):
        done = json.loads((cell / "DONE.json").read_text())
        assert done["params"]["sleep_s"] == 1.0 and done["duration_s"] > 1.0 and done["finished"]
        assert done["row_files"] == [p.name for p in cell.glob("rows-*.parquet")]


def test_failed_cell_is_kept_others_finish_retry_and_dask_matches_local(tmp_path, capsys):
    local = tmp_path / "local"
    rc = cli.main(["sweep", str(FIX / "sweep_fail.yaml"), "--out", str(local), "--workers", "2"])  # process pool
    printed = capsys.readouterr().out
    assert rc == 1 and "1 done" in printed and "1 failed" in printed
    assert "'x': 13" in printed and "ValueError: x == 13 is unlucky" in printed
    [bad] = _cells(local, "FAILED.json")
    assert json.loads((bad / "FAILED.json").read_text())["params"] == {"x": 13, "y": "b", "sleep_s": 0.0}
    executed = json.loads((bad / "executed.ipynb").read_text())
    errors = [o for c in executed["cells"] for o in c.get("outputs", []) if o["output_type"] == "error"]
    assert errors and errors[0]["evalue"] == "x == 13 is unlucky (y='b')"
    assert not (bad / "DONE.json").exists() and len(_cells(local, "DONE.json")) == 1

    report = run_sweep(FIX / "sweep_fail.yaml", tmp_path / "dask", workers=1, executor="dask")
    assert [c.params["x"] for c in report.failed] == [13] and len(report.done) == 1
    a, b = (load_results(d).drop(columns=PROVENANCE).sort_values("repeat").reset_index(drop=True)
            for d in (local, tmp_path / "dask"))
    assert a["repeat"].tolist() == [2] and a.equals(b)

    retry = run_sweep(FIX / "sweep_fail.yaml", local)  # done cells skipped, the failed one retried
    assert len(retry.skipped) == 1 and [c.dir for c in retry.failed] == [bad] and not retry.done
    assert (bad / "_attempts" / "001" / "FAILED.json").exists() and (bad / "executed.ipynb").exists()


def test_include_merges_with_the_including_file_winning():
    spec = load_spec(FIX / "sweep_include.yaml")
    assert spec.name == "fixture-sweep" and spec.notebook == FIX / "sweep_nb.ipynb"
    assert spec.parameters == {"sleep_s": 0.0, "x": 7} and spec.grid == {"y": ["a", "b"]}
    assert spec.cells() == [{"sleep_s": 0.0, "x": 7, "y": "a"}, {"sleep_s": 0.0, "x": 7, "y": "b"}]
    assert spec.sources == (FIX / "sweep_base.yaml", FIX / "sweep_include.yaml")
    assert set(spec.notebook_params) == {"x", "y", "sleep_s", "out_dir"}


@pytest.mark.parametrize("body, match", [
    ("notebook: tests/fixtures/sweep_nb.ipynb\ngrid: {x: [1], z: [1, 2]}",
     r"'z'.*not parameters of notebook sweep_nb.ipynb \(its parameters cell defines: x, y, sleep_s, out_dir\)"),
    ("notebook: tests/fixtures/sweep_nb.ipynb\nparameters: {speed: 3}\ngrid: {x: [1]}", "'speed'.*not parameters"),
    ("notebook: notebooks/missing.ipynb\ngrid: {x: [1]}", "notebook 'missing.ipynb'.*not found"),
    ("notebook: tests/fixtures/sweep_nb.ipynb\ngrid: {x: [1], y: []}", "grid.y.*empty list"),
    ("notebook: tests/fixtures/sweep_nb.ipynb\nparameters: {x: 1}", "empty grid"),
    ("notebook: tests/fixtures/sweep_nb.ipynb\ngrid: {x: 3}", "grid.x.*must be a list"),
    ("notebook: tests/fixtures/sweep_nb.ipynb\ngrid: {out_dir: [a]}", "sets `out_dir`"),
    ("notebok: x.ipynb", "unknown key.*'notebok'"),
    ("include: nowhere.yaml\ngrid: {x: [1]}", "nowhere.yaml.*not found"),
])
def test_bad_sweeps_fail_before_anything_runs(tmp_path, body, match):
    yaml_path = tmp_path / "bad.yaml"
    yaml_path.write_text(body + "\n")
    with pytest.raises(NpuMoeError, match=match):
        run_sweep(yaml_path, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_notebook_without_parameters_cell_and_cli_error_exit(tmp_path, capsys):
    (tmp_path / "nb.py").write_text("# %%\nx = 1\nout_dir = None\n")
    (tmp_path / "s.yaml").write_text("notebook: nb.py\ngrid: {x: [1]}\n")
    assert cli.main(["sweep", str(tmp_path / "s.yaml"), "--out", str(tmp_path / "o")]) == 2
    assert "no cell tagged `parameters`" in capsys.readouterr().err
    with pytest.raises(NpuMoeError, match="--scheduler needs --executor dask"):
        run_sweep(FIX / "sweep_base.yaml", tmp_path / "o", scheduler="tcp://localhost:8786")


def test_simulate_sweep_cells_write_rows_and_resume(tmp_path):
    """kind: simulate: each cell is one simulate() call; rows equal a direct call; a re-run skips done cells."""
    from npumoe_lab.sim.run import simulate
    spec = tmp_path / "sim.yaml"
    spec.write_text("kind: simulate\nparameters: {geometry: phi-tiny-moe, platforms: m2-max, variants: 'cpu-only,npumoe',"
                    " prompt_len: 512}\ngrid: {chunk: [256, 512]}\n")
    report = run_sweep(spec, tmp_path / "out")
    assert len(report.done) == 2 and not report.failed
    rows = load_results(tmp_path / "out").set_index(["chunk", "variant"]).sort_index()
    direct = simulate("phi-tiny-moe", "synthetic:gini=0.6", "m2-max", "cpu-only,npumoe", 512, "256,512")
    assert np.allclose(rows.ttft_s, direct.set_index(["chunk", "variant"]).sort_index().ttft_s, rtol=1e-12)
    assert len(run_sweep(spec, tmp_path / "out").skipped) == 2
    spec.write_text("kind: simulate\nparameters: {geometri: phi-tiny-moe}\ngrid: {chunk: [256]}\n")
    with pytest.raises(NpuMoeError, match="'geometri' in sweep .* are not arguments of npumoe_lab.simulate"):
        run_sweep(spec, tmp_path / "out2")


def test_the_ten_thousand_plan_sweep_and_its_small_fixture(tmp_path):
    """sweeps/simulate_10k.yaml spans >= 10,000 plans over the issue's dimensions; its small fixture runs, each
    cell's rows carry the cell's knobs, one row per chunk x platform."""
    repo = Path(__file__).resolve().parents[2]
    big = load_spec(repo / "sweeps" / "simulate_10k.yaml")
    per_cell = len(big.parameters["chunk"].split(",")) * len(big.parameters["platforms"].split(","))
    assert big.kind == "simulate" and len(big.cells()) * per_cell >= 10_000
    assert {"routing", "group_size", "tiers", "percentile", "residency"} <= set(big.grid)
    report = run_sweep(repo / "sweeps" / "simulate_small.yaml", tmp_path)
    assert len(report.done) == 4 and not report.failed
    dask = run_sweep(repo / "sweeps" / "simulate_small.yaml", tmp_path / "dask", executor="dask")   # unchanged
    assert len(dask.done) == 4 and not dask.failed
    df = load_results(tmp_path / "cells")
    assert len(df) == 4 * per_cell
    assert set(zip(df.group_size, df.n_tiers)) == {(4, 2), (4, 3), (8, 2), (8, 3)}
    assert df.groupby(["group_size", "n_tiers"]).size().eq(per_cell).all()
    keys, values = ["group_size", "n_tiers", "platform", "chunk"], ["ttft_s", "energy_per_token_mj", "drop_rate"]
    on_dask = load_results(tmp_path / "dask").sort_values(keys)
    assert (on_dask[keys].to_numpy() == df.sort_values(keys)[keys].to_numpy()).all()
    np.testing.assert_array_equal(on_dask[values].to_numpy(float), df.sort_values(keys)[values].to_numpy(float))
