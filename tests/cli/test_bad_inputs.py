"""Every bad input is one stderr line naming what is wrong and what to do, exit 2, nothing written;
a full disk (writes monkeypatched to raise ENOSPC) keeps what was computed (the table is printed before any file is
written) and leaves no partial file or empty folder."""
import errno

import pytest

from npumoe_lab import cli
from npumoe_lab.models import TINY_MODEL_DIR
from npumoe_lab.results.store import write_rows


def _one_line(capsys, rc, expected: str):
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert rc == 2 and len(err) == 1, err
    assert expected in err[0], err[0]
    return err[0]


@pytest.fixture
def corrupt_model(tmp_path):
    d = tmp_path / "broken"
    d.mkdir()
    (d / "config.json").write_text('{"model_type": "qwen3_moe", ')
    return d


def test_corrupt_config_json_is_one_line(corrupt_model, tmp_path, capsys):
    rc = cli.main(["calibrate", "--model", str(corrupt_model), "--out", str(tmp_path / "o")])
    _one_line(capsys, rc, f"{corrupt_model / 'config.json'} cannot be read as an HF config")
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("argv,expected", [
    (["tune", "--budget-drop", "0.05", "--chunk", "0"], "--chunk 0 must be an integer >= 1"),
    (["tune", "--budget-drop", "0.05", "--prompt-len", "0"], "--prompt-len 0 must be an integer >= 1"),
    (["tune", "--budget-drop", "0.05", "--prompt-len", "300"], "--prompt-len 300 is not a multiple of --chunk 128"),
    (["drift", "--prompt-len", "0"], "--prompt-len 0 must be an integer >= 1"),
    (["drift", "--prompt-len", "-100"], "--prompt-len -100 must be an integer >= 1"),
    (["simulate", "--geometry", "phi-tiny-moe", "--prompt-len", "256", "--chunk", "512"],
     "--chunk 512 is larger than the prompt (--prompt-len 256)"),
    (["run", "--workload", "lm-heldout", "--platforms", "m2-max", "--prompt-len", "256", "--chunk", "512"],
     "--chunk 512 is larger than the prompt (--prompt-len 256)"),
    (["simulate", "--geometry", "phi-tiny-moe", "--routing", "synthetic:gini=0.6,gini=0.7"],
     "synthetic routing parameter 'gini' is given twice"),
    (["simulate", "--geometry", "phi-tiny-moe", "--routing", "profile:/nope"],
     "calibration profile folder /nope not found"),
])
def test_bad_input_is_one_line_exit_2_nothing_written(argv, expected, tmp_path, capsys):
    if argv[0] in ("tune", "drift", "run") and not (TINY_MODEL_DIR / "config.json").is_file():
        pytest.skip("bundled tiny model not present")
    out = tmp_path / "out"
    rc = cli.main([*argv, "--out", str(out)])
    line = _one_line(capsys, rc, expected)
    assert line.startswith(f"npumoe-lab {argv[0]}: error: ")
    assert not out.exists()


def _full_disk(monkeypatch):
    """Every atomic write fails as a full disk does: after its bytes went to the temp file, at fsync."""
    import npumoe_lab.results.atomic as atomic

    def fsync(fd):
        raise OSError(errno.ENOSPC, "No space left on device")
    monkeypatch.setattr(atomic.os, "fsync", fsync)


def test_full_disk_keeps_the_simulate_table_and_leaves_nothing(tmp_path, monkeypatch, capsys):
    _full_disk(monkeypatch)
    out = tmp_path / "a" / "sim"
    rc = cli.main(["simulate", "--geometry", "phi-tiny-moe", "--variants", "cpu-only,npumoe", "--prompt-len", "512",
                   "--out", str(out)])
    captured = capsys.readouterr()
    err = [line for line in captured.err.splitlines() if line.strip()]
    assert rc == 2 and len(err) == 1 and "No space left on device" in err[0] and "printed above" in err[0], err
    table = captured.out.splitlines()
    assert any(line.split()[4:5] == ["npumoe"] for line in table) and any("cpu-only" in line for line in table)
    assert not (tmp_path / "a").exists()               # no empty folder, no temp file


def test_full_disk_while_drawing_figures_is_one_line_and_no_partial_file(tmp_path, monkeypatch, capsys):
    rows = [{"model": "m", "workload": "w", "variant": v, "platform": "m2-max", "prompt_len": 256, "chunk": 128,
             "repeat": 0, "ttft_s": t, "energy_per_token_mj": 1.0, "cpu_cycles": 1e6, "timing_source": "modeled",
             "energy_source": "modeled", "cycles_source": "modeled"}
            for v, t in (("cpu-only", 0.2), ("npumoe", 0.1))]
    write_rows(rows, tmp_path / "rows")
    import matplotlib.figure

    def savefig(self, fname, *a, **k):                 # half a file, then the disk is full
        if hasattr(fname, "write"):
            fname.write(b"%PDF-1.4 partial")
        else:
            with open(fname, "wb") as fh:
                fh.write(b"%PDF-1.4 partial")
        raise OSError(errno.ENOSPC, "No space left on device")
    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", savefig)
    figs = tmp_path / "figs"
    rc = cli.main(["figures", str(tmp_path / "rows"), "--out", str(figs)])
    _one_line(capsys, rc, "No space left on device")
    assert not figs.exists() or not any(figs.rglob("*"))


def test_workbench_warnings_print_as_one_line_without_the_source_line():
    import subprocess
    import sys
    code = ("import warnings\nfrom npumoe_lab.devices.hostload import HostBusyWarning\n"
            "warnings.warn('measured timings taken on a busy host', HostBusyWarning)\n"
            "warnings.warn('an ordinary warning', UserWarning)\n")
    err = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60).stderr
    lines = err.splitlines()
    assert lines[0] == "HostBusyWarning: measured timings taken on a busy host"
    assert "UserWarning: an ordinary warning" in lines[1] and len(lines) == 2   # others unchanged (file:line)


@pytest.mark.parametrize("argv, named, table", [
    (["fit-device", "--platform", "m2-max", "--steps", "30"], "m2-max-fit.yaml", "fitted "),
    (["validate-device", "--platform", "m2-max"], "validation.csv", "| validate |")])
def test_full_disk_keeps_the_fit_and_validation_tables_and_names_the_file(argv, named, table, tmp_path, monkeypatch,
                                                                         capsys):
    _full_disk(monkeypatch)
    out = tmp_path / "a" / "fit"
    rc = cli.main([*argv, "--out", str(out)])
    captured = capsys.readouterr()
    err = [line for line in captured.err.splitlines() if line.strip() and "it/s" not in line]
    assert rc == 2 and len(err) == 1 and "No space left on device" in err[0] and named in err[0], err
    assert table in captured.out                       # the table came first
    assert not (tmp_path / "a").exists()               # no partial file, no temp file, no empty folder


@pytest.mark.parametrize("command", [["run", "--workload", "fewshot-cls", "--platforms", "cpu", "--out", "OUT"],
                                     ["simulate", "--geometry", "phi-tiny-moe", "--out", "OUT"],
                                     ["paper-check", "--out", "OUT"]])
@pytest.mark.parametrize("flags,expected", [(["--decode-tokens", "-1"], "--decode-tokens -1: give a whole number"),
                                            (["--decode-policy", "gpu"], "--decode-policy 'gpu' is not a decode policy")])
def test_bad_decode_flags_are_the_only_line_printed(tmp_path, capsys, command, flags, expected):
    out = str(tmp_path / "o")
    rc = cli.main([out if a == "OUT" else a for a in command] + flags)
    got = capsys.readouterr()
    err = [line for line in got.err.splitlines() if line.strip()]
    assert rc == 2 and len(err) == 1 and expected in err[0], err
    assert got.out.strip() == "", got.out          # nothing printed before the error (run's host notes)
    assert not (tmp_path / "o").exists()
