"""Never lose work: every command refuses an unwritable --out in one line (exit 2) before computing; atomic
writes follow the umask."""
from __future__ import annotations

import os
import stat

import pytest

from npumoe_lab import cli
from npumoe_lab.errors import NpuMoeError
from npumoe_lab.results.atomic import write_json
from npumoe_lab.results.outdir import check_writable

COMMANDS = {  # each would compute for seconds to minutes before writing anything
    "run": ["run", "--workload", "lm-heldout", "--variant", "npumoe", "--platform", "cpu"],
    "calibrate": ["calibrate", "--model", "tiny", "--tokens", "1024"],
    "sweep": ["sweep", "sweeps/demo.yaml"],
    "figures": ["figures", "results"],
    "convert": ["convert", "--plan", "plan.json", "--target", "onnx"],
    "plan": ["plan", "--profile", "profile"],
    "simulate": ["simulate", "--geometry", "phi-tiny-moe"],
}


@pytest.fixture
def blocked(tmp_path):
    """A path no user, root included, can create: its parent is a regular file."""
    (tmp_path / "a-file").write_text("x")
    return tmp_path / "a-file" / "out"


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_unwritable_out_is_one_line_and_exit_2_before_compute(command, blocked, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("NPUMOE_CACHE", str(tmp_path / "cache"))
    out = blocked / "plan.json" if command == "plan" else blocked
    rc = cli.main(COMMANDS[command] + ["--out", str(out)])
    cap = capsys.readouterr()
    assert rc == 2 and cap.out == ""
    lines = cap.err.strip().splitlines()
    assert len(lines) == 1 and f"npumoe-lab {command}: error: --out {out} is not writable" in lines[0], cap.err
    assert not (tmp_path / "cache").exists()           # nothing was calibrated or cached


def test_permission_bits_are_checked_for_a_non_root_user(tmp_path):
    if os.geteuid() == 0:
        pytest.skip("root ignores permission bits")
    ro = tmp_path / "ro"
    ro.mkdir(mode=0o500)
    with pytest.raises(NpuMoeError, match="not writable"):
        check_writable(ro / "sub")


def test_plan_out_that_is_a_folder_is_named(tmp_path):
    with pytest.raises(NpuMoeError, match="is a folder"):
        check_writable(tmp_path, is_file=True)


@pytest.mark.parametrize("mask, mode", [(0o022, 0o644), (0o077, 0o600), (0o002, 0o664)])
def test_atomic_writes_follow_the_umask(tmp_path, mask, mode):
    old = os.umask(mask)
    try:
        path = write_json(tmp_path / "x.json", {"a": 1})
    finally:
        os.umask(old)
    assert stat.S_IMODE(path.stat().st_mode) == mode


def test_the_check_leaves_no_folder_behind(tmp_path):
    """A command that refuses its input after the check must not have created its --out."""
    out = tmp_path / "a" / "b" / "out"
    check_writable(out)
    assert not (tmp_path / "a").exists()
    check_writable(tmp_path / "c" / "plan.json", is_file=True)
    assert list(tmp_path.iterdir()) == []
