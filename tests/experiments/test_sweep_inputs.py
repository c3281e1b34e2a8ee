"""Sweeps that never drop a grid axis or draw a failed cell: a key given twice in a sweep YAML (a
parameter, a grid entry, `grid:` itself) or in a routing spec is one line and exit 2 with nothing written; rows of
failed or unfinished cells are not loaded by default; FAILED.json is written best-effort (a full disk does not
crash the sweep); the baselines notebook sweeps over modeled platforms only."""
import errno
import json

import pytest

from npumoe_lab import cli
from npumoe_lab.experiments import sweep as sweep_mod
from npumoe_lab.experiments.sweep import run_sweep
from npumoe_lab.results.store import load_results, write_rows
from npumoe_lab.utils import REPO_ROOT

NOTEBOOK = REPO_ROOT / "notebooks" / "05_baselines.py"


@pytest.mark.parametrize("body,line,key", [
    ("parameters:\n  model: tiny\n  seed: 0\n  model: other\ngrid:\n  chunk: [128]\n", 4, "model"),
    ("parameters: {model: tiny}\ngrid:\n  prompt_len: [256]\n  chunk: [128]\n  prompt_len: [512]\n", 5, "prompt_len"),
    ("parameters: {model: tiny}\ngrid:\n  prompt_len: [256]\ngrid:\n  chunk: [128, 256]\n", 4, "grid"),
])
def test_a_key_given_twice_is_one_line_and_nothing_runs(tmp_path, capsys, body, line, key):
    spec = tmp_path / "dup.yaml"
    spec.write_text(f"notebook: {NOTEBOOK}\n" + body)
    assert cli.main(["sweep", str(spec), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"npumoe-lab sweep: error: sweep file {spec} line {line + 1}: key {key!r} is given twice; keep "
                   "one (YAML would silently keep the last)"]
    assert not (tmp_path / "out").exists()


def test_a_routing_field_given_twice_is_refused(tmp_path, capsys):
    rc = cli.main(["simulate", "--geometry", "phi-tiny-moe", "--routing", "synthetic:gini=0.6,gini=0.7",
                   "--out", str(tmp_path / "o")])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and "'gini' is given twice" in err[0], err
    assert not (tmp_path / "o").exists()


def _row(variant):
    return {"model": "m", "workload": "w", "variant": variant, "platform": "m2-max", "prompt_len": 256,
            "chunk": 128, "repeat": 0, "ttft_s": 0.1, "timing_source": "modeled"}


def test_rows_of_failed_and_unfinished_cells_are_not_loaded_by_default(tmp_path, capsys):
    root = tmp_path / "sweep"
    root.mkdir()
    (root / "sweep.json").write_text("{}")
    for key, marker in (("done", "DONE.json"), ("failed", "FAILED.json"), ("running", None)):
        write_rows([_row(key)], root / "cells" / key)
        if marker:
            (root / "cells" / key / marker).write_text("{}")
    assert sorted(load_results(root)["variant"]) == ["done"]
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "left out the rows of 2 unfinished or failed sweep cell(s)" in err[0]
    assert sorted(load_results(root, include_failed=True)["variant"]) == ["done", "failed", "running"]
    # a plain results folder that merely has a `cells` subfolder (no sweep.json) loads everything
    write_rows([_row("plain")], tmp_path / "plain" / "cells" / "x")
    assert list(load_results(tmp_path / "plain")["variant"]) == ["plain"]


def test_figures_leave_failed_cells_out(tmp_path, capsys):
    root = tmp_path / "sweep"
    root.mkdir()
    (root / "sweep.json").write_text("{}")
    write_rows([_row("npumoe")], root / "cells" / "a")
    (root / "cells" / "a" / "FAILED.json").write_text("{}")
    assert cli.main(["figures", str(root), "--out", str(tmp_path / "figs")]) == 2
    err = capsys.readouterr().err
    assert "left out the rows of 1 unfinished or failed" in err and "no result rows" in err


def test_a_full_disk_while_recording_a_failure_does_not_crash_the_sweep(tmp_path, monkeypatch, capsys):
    spec = tmp_path / "sim.yaml"
    spec.write_text("kind: simulate\nparameters: {geometry: phi-tiny-moe, platforms: m2-max, variants: npumoe}\n"
                    "grid: {prompt_len: [0, 512]}\n")         # prompt_len 0 fails inside the cell
    real = sweep_mod.write_json

    def full(path, payload):
        if path.name == "FAILED.json":
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(path, payload)
    monkeypatch.setattr(sweep_mod, "write_json", full)
    report = run_sweep(spec, tmp_path / "out")
    assert len(report.done) == 1 and len(report.failed) == 1
    assert "could not write FAILED.json (No space left on device)" in capsys.readouterr().err
    failed = report.failed[0].dir
    assert not (failed / "FAILED.json").exists() and not (failed / "DONE.json").exists()
    assert list(load_results(tmp_path / "out")["prompt_len"]) == [512]
    monkeypatch.setattr(sweep_mod, "write_json", real)
    again = run_sweep(spec, tmp_path / "out")              # the failed cell is retried, the done one skipped
    assert len(again.skipped) == 1 and len(again.failed) == 1


@pytest.mark.slow
def test_the_baselines_notebook_sweeps_over_modeled_platforms_only(tmp_path, monkeypatch):
    from npumoe_lab.models import TINY_MODEL_DIR
    if not (TINY_MODEL_DIR / "config.json").is_file():
        pytest.skip("bundled tiny model not present")
    monkeypatch.setenv("NPUMOE_CACHE", str(tmp_path / "cache"))
    spec = tmp_path / "modeled.yaml"
    spec.write_text(f"notebook: {NOTEBOOK}\nparameters: {{platforms: m2-max, variants: 'reference,npumoe-base,npumoe',"
                    " prompt_len: 256, chunk: 128, n_samples: 1, calib_tokens: 1024, matched_percentile: null}\n"
                    "grid: {workload: [lm-heldout]}\n")
    report = run_sweep(spec, tmp_path / "out")
    assert report.ok, report.summary()
    df = load_results(tmp_path / "out")
    assert set(df["platform"]) == {"m2-max"} and set(df["timing_source"]) == {"modeled"}
    assert "ttft_iqr_s" not in df.columns or df["ttft_iqr_s"].isna().all()
    executed = json.loads((report.done[0].dir / "executed.ipynb").read_text())
    text = "".join("".join(o.get("text", "")) for c in executed["cells"] for o in c.get("outputs", []))
    assert "median over repeats" in text
