"""Atomic file writes: write a hidden temp file in the target's folder, fsync, os.replace.

A reader (or a re-run after a kill) sees either the old file or the complete new one, never a partial one.
Temp names start with "." and end with ".tmp" so result loaders can skip them.
"""
from __future__ import annotations

import json
import os
import tempfile
import threading
from contextlib import contextmanager
from pathlib import Path


_UMASK_LOCK = threading.Lock()


def umask() -> int:
    """The process umask (reading it means setting it: briefly, under a lock)."""
    with _UMASK_LOCK:
        mask = os.umask(0o022)
        os.umask(mask)
    return mask


def is_temp(path: Path) -> bool:
    return path.name.startswith(".") or path.name.endswith(".tmp")


@contextmanager
def atomic_open(path, mode: str = "wb", durable: bool = True):
    """Yield a file object; on clean exit its content replaces `path` atomically; on error nothing changes.
    `durable` False skips the fsyncs (a cache entry: a crash may lose it, never leave it partial)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        os.fchmod(fd, 0o666 & ~umask())   # mkstemp makes 0600; the result should follow the umask like open()
        with os.fdopen(fd, mode) as fh:
            yield fh
            fh.flush()
            if durable:
                os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException as exc:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        if isinstance(exc, OSError) and (exc.filename is None or str(exc.filename) == tmp):
            exc.filename = str(path)      # the file the user asked for, not the hidden temp (fsync names none)
        raise
    if durable:
        _fsync_dir(path.parent)


def write_text(path, text: str) -> Path:
    with atomic_open(path, "w") as fh:
        fh.write(text)
    return Path(path)


def write_json(path, obj) -> Path:
    with atomic_open(path, "w") as fh:
        json.dump(obj, fh, indent=2, sort_keys=True, default=str)
        fh.write("\n")
    return Path(path)


def _fsync_dir(folder: Path) -> None:
    # makes the rename itself durable (a crash right after os.replace cannot resurrect the old name)
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
