"""A keyed on-disk cache of routing draws (calibration count matrices, a prompt's sampled chunks, the synthetic
popularity's fitted exponent).

The draws are pinned: every one is a function of the routing source's arrays and knobs, the layer specs, the
chunk size and the seed, run by the sampler's code under this NumPy. That is the key: all of those, the source
text of the sampling modules (routing.py, topk.py, textlike.py) and NumPy's version. A hit returns the very
arrays (and generator state) a fresh draw would give; anything changed in the key is a miss. Location:
cache_dir()/draws (this checkout's git-ignored .cache/npumoe-lab, or $NPUMOE_CACHE_DIR). Bypass it with
`NPUMOE_DRAW_CACHE=off` (what `simulate --no-cache` and `sweep --no-cache` set): every draw is then sampled.
Writes are atomic, so parallel workers and sweeps may share the folder; an unreadable entry is a miss.
"""
from __future__ import annotations

import functools
import hashlib
import os
import pickle
from pathlib import Path

import numpy as np

from npumoe_lab.results.atomic import atomic_open
from npumoe_lab.utils import cache_dir

OFF_VALUES = ("off", "0", "no", "false")
SAMPLER_MODULES = ("routing.py", "topk.py", "textlike.py")


def enabled() -> bool:
    """False where $NPUMOE_DRAW_CACHE says off (every draw sampled afresh)."""
    return os.environ.get("NPUMOE_DRAW_CACHE", "on").strip().lower() not in OFF_VALUES


def folder() -> Path:
    return cache_dir() / "draws"


@functools.lru_cache(maxsize=1)
def code_version() -> str:
    """The hash of the sampler's source text and the NumPy version (its generators' streams)."""
    h = hashlib.sha256(np.__version__.encode())
    here = Path(__file__).resolve().parent
    for name in SAMPLER_MODULES:
        h.update(name.encode() + b"\0" + (here / name).read_bytes())
    return h.hexdigest()


def _feed(h, value) -> None:
    """A canonical byte stream of `value` (arrays by dtype, shape and bytes; containers item by item)."""
    if isinstance(value, np.ndarray):
        a = np.ascontiguousarray(value)
        h.update(f"a{a.dtype.str}{a.shape}".encode())
        h.update(a.tobytes())
    elif isinstance(value, dict):
        h.update(f"d{len(value)}".encode())
        for k in sorted(value, key=repr):
            _feed(h, k)
            _feed(h, value[k])
    elif isinstance(value, (list, tuple)):
        h.update(f"l{len(value)}".encode())
        for v in value:
            _feed(h, v)
    elif value is None or isinstance(value, (bool, int, float, str, np.integer, np.floating)):
        h.update(f"{type(value).__name__}:{value!r};".encode())
    else:
        raise TypeError(f"draw cache key: cannot hash a {type(value).__name__}")


def key(kind: str, *parts) -> str:
    h = hashlib.sha256(kind.encode())
    _feed(h, code_version())
    _feed(h, parts)
    return f"{kind}-{h.hexdigest()[:40]}"


def load(name: str):
    """The cached value under `name`, or None (a miss: absent, unreadable, or the cache off)."""
    if not enabled():
        return None
    try:
        with open(folder() / f"{name}.pkl", "rb") as fh:
            return pickle.load(fh)
    except Exception:  # noqa: BLE001 - a missing, partial or foreign entry is a miss: the draw is sampled
        return None


def store(name: str, value) -> None:
    """Keep `value` under `name` (atomic; a full or read-only disk only costs the next run its draw)."""
    if not enabled():
        return
    try:
        with atomic_open(folder() / f"{name}.pkl", "wb") as fh:
            pickle.dump(value, fh, protocol=pickle.HIGHEST_PROTOCOL)
    except OSError:
        pass


def cached(name: str, compute):
    """load(name), else compute() stored under name."""
    value = load(name)
    if value is None:
        value = compute()
        store(name, value)
    return value
