"""Check that a command's output location is writable before it computes anything: a run that only fails when
it saves its results loses all its work. The check really creates the folder and a probe file (permission bits,
read-only mounts, a file in the way and a full quota all show up; `os.access` misses several)."""
from __future__ import annotations

import os
import tempfile
from pathlib import Path

from npumoe_lab.errors import NpuMoeError


def check_writable(out, is_file: bool = False, option: str = "--out") -> Path:
    """Create `out` (or, for a file, its folder) and a probe file in it, then remove what the check created (a
    command that later refuses its input leaves nothing behind); raise NpuMoeError naming the path."""
    path = Path(out).expanduser()
    folder = path.parent if is_file else path
    missing = [d for d in (folder, *folder.parents) if not d.exists()]   # deepest first
    try:
        if is_file and path.is_dir():
            raise NpuMoeError(f"{option} {out} is a folder; give a file path (e.g. {path / 'plan.json'})")
        folder.mkdir(parents=True, exist_ok=True)
        fd, probe = tempfile.mkstemp(dir=folder, prefix=".npumoe-write-check.", suffix=".tmp")
        os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        raise NpuMoeError(f"{option} {out} is not writable ({exc.strerror or exc}); choose a folder you can "
                          "write to") from None
    finally:
        for d in missing:
            try:
                d.rmdir()
            except OSError:
                break
    return path
