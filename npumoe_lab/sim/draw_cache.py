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
from pathlib import Path

from npumoe_lab.sim import keyed_store
from npumoe_lab.utils import cache_dir

OFF_VALUES = keyed_store.OFF_VALUES
SAMPLER_MODULES = ("routing.py", "topk.py", "textlike.py")


def enabled() -> bool:
    """False where $NPUMOE_DRAW_CACHE says off (every draw sampled afresh)."""
    return keyed_store.switched_on("NPUMOE_DRAW_CACHE")


def folder() -> Path:
    return cache_dir() / "draws"


@functools.lru_cache(maxsize=1)
def code_version() -> str:
    """The hash of the sampler's source text and the NumPy version (its generators' streams)."""
    here = Path(__file__).resolve().parent
    return keyed_store.source_version([here / name for name in SAMPLER_MODULES])


def key(kind: str, *parts) -> str:
    return keyed_store.entry_name(kind, code_version(), parts)


def load(name: str):
    """The cached value under `name`, or None (a miss: absent, unreadable, or the cache off)."""
    return keyed_store.load(folder(), name) if enabled() else None


def store(name: str, value) -> None:
    """Keep `value` under `name` (atomic; a full or read-only disk only costs the next run its draw)."""
    if enabled():
        keyed_store.store(folder(), name, value)


def cached(name: str, compute):
    """load(name), else compute() stored under name."""
    value = load(name)
    if value is None:
        value = compute()
        store(name, value)
    return value
