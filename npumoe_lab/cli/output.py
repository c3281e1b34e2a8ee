"""Writing a command's files without losing its work or leaving half of them: the tables go to the terminal first,
then the files are written inside `writes(out)`; an OSError there (a full disk, a quota, a folder that vanished)
removes every file and folder the block created and becomes one NpuMoeError line (exit 2)."""
from __future__ import annotations

import os
import shutil
from contextlib import contextmanager
from pathlib import Path

from npumoe_lab.errors import NpuMoeError


def _entries(root: Path) -> set:
    if not root.exists():
        return set()
    found = {root}
    for folder, dirs, files in os.walk(root):
        found.update(Path(folder) / n for n in dirs + files)
    return found


def _first_missing(path: Path) -> Path:
    """The top-most folder of `path` that does not exist yet (what creating it would add)."""
    path = path.resolve()
    while not path.parent.exists():
        path = path.parent
    return path


@contextmanager
def writes(out, computed: str = "what was computed is printed above"):
    """Run the block's writes under `out` (a folder or a file); on OSError undo them and raise one line."""
    out = Path(out)
    root = _first_missing(out) if not out.exists() else out
    before = _entries(root)
    try:
        yield out
    except OSError as exc:
        for p in sorted(_entries(root) - before, key=lambda p: len(p.parts), reverse=True):
            try:
                shutil.rmtree(p) if p.is_dir() and not p.is_symlink() else p.unlink()
            except OSError:
                pass
        raise NpuMoeError(f"could not write {exc.filename or out} ({exc.strerror or exc}); nothing half-written is left and "
                          f"{computed}; free some space or choose another --out") from None


def save_png(fig, path, dpi: int = 150) -> None:
    """A figure to PNG atomically (a full disk leaves no truncated image)."""
    from npumoe_lab.results.atomic import atomic_open     # lazy: light until a command writes
    with atomic_open(path, "wb") as fh:
        fig.savefig(fh, format="png", dpi=dpi, bbox_inches="tight")
