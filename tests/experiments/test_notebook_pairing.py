"""Notebooks open without dirtying git: every notebook's .py and .ipynb are already in the form
jupytext (the JupyterLab extension, or `make notebooks`) writes, so `jupytext --sync` on a copy changes nothing."""
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from npumoe_lab.utils import REPO_ROOT

NOTEBOOKS = REPO_ROOT / "notebooks"


@pytest.mark.slow
def test_jupytext_sync_of_a_copy_changes_nothing(tmp_path):
    pytest.importorskip("jupytext")
    copy = tmp_path / "notebooks"
    shutil.copytree(NOTEBOOKS, copy)
    pairs = sorted(p.name for p in copy.glob("*.py") if (copy / f"{p.stem}.ipynb").is_file())
    assert len(pairs) >= 10
    jupytext = Path(sys.executable).with_name("jupytext")
    cmd = [str(jupytext)] if jupytext.is_file() else [sys.executable, "-m", "jupytext"]
    out = subprocess.run(cmd + ["--sync", *pairs], cwd=copy, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-1500:]
    changed = [p.name for p in sorted(copy.iterdir()) if p.is_file()
               and p.read_bytes() != (NOTEBOOKS / p.name).read_bytes()]
    assert not changed, f"jupytext --sync rewrites {changed}: run `make notebooks` and commit the result"


def test_every_paired_script_carries_jupytexts_version_header():
    """The header JupyterLab's jupytext adds when it saves: without it, opening the notebook rewrites the .py."""
    for py in sorted(NOTEBOOKS.glob("*.py")):
        head = py.read_text().split("# ---", 2)[1]
        assert "format_version:" in head and "jupytext_version:" in head, py.name
