"""Keyed on-disk stores of pure results (the routing draws, the built plans): a canonical hash of everything a
result reads is its name, a pickle of the result its content.

What both stores share: `feed` (a canonical byte stream of a key's parts: arrays by dtype, shape and bytes, object
arrays item by item, containers in order, dicts by sorted key), `source_version` (the hash of some modules'
source text and NumPy's version: a change in the code that computes a result is a miss), and atomic `load` /
`store` (parallel workers may share a folder; an absent, partial or foreign entry is a miss, a full or read-only
disk only costs the next run its result).
"""
from __future__ import annotations

import hashlib
import os
import pickle
from pathlib import Path

import numpy as np

from npumoe_lab.results.atomic import atomic_open
from npumoe_lab.utils import OFF_VALUES, switched_on  # noqa: F401  (the caches' switches, re-exported)

PACKAGE_ROOT = Path(__file__).resolve().parents[1]


def feed(h, value) -> None:
    """A canonical byte stream of `value` into the hash `h`; TypeError for a value with no canonical bytes."""
    if isinstance(value, np.ndarray):
        if value.dtype.kind == "O":       # object arrays (pandas string columns): their items, not their pointers
            items = value.ravel().tolist()
            h.update(f"o{value.shape}".encode())
            if all(type(v) in (str, int, float, bool) or v is None for v in items):
                h.update(repr([(type(v).__name__, v) for v in items]).encode())     # one call for many scalars
            else:
                feed(h, items)
            return
        a = np.ascontiguousarray(value)
        h.update(f"a{a.dtype.str}{a.shape}".encode())
        h.update(a.tobytes())
    elif isinstance(value, dict):
        h.update(f"d{len(value)}".encode())
        for k in sorted(value, key=repr):
            feed(h, k)
            feed(h, value[k])
    elif isinstance(value, (list, tuple)):
        h.update(f"l{len(value)}".encode())
        for v in value:
            feed(h, v)
    elif value is None or isinstance(value, (bool, int, float, str, np.integer, np.floating, np.bool_)):
        h.update(f"{type(value).__name__}:{value!r};".encode())
    else:
        raise TypeError(f"keyed store: cannot hash a {type(value).__name__}")


def source_version(paths) -> str:
    """The hash of the files' source text (relative to the package, in the given order) and NumPy's version."""
    h = hashlib.sha256(np.__version__.encode())
    for p in paths:
        p = Path(p)
        h.update(str(p.relative_to(PACKAGE_ROOT)).encode() + b"\0" + p.read_bytes())
    return h.hexdigest()


def entry_name(kind: str, code: str, parts) -> str:
    h = hashlib.sha256(kind.encode())
    feed(h, code)
    feed(h, parts)
    return f"{kind}-{h.hexdigest()[:40]}"


def load(folder: Path, name: str):
    """The value stored under `name` in `folder`, or None (absent or unreadable)."""
    try:
        with open(folder / f"{name}.pkl", "rb") as fh:
            return pickle.load(fh)
    except Exception:  # noqa: BLE001 - a missing, partial or foreign entry is a miss: the result is computed
        return None


def store(folder: Path, name: str, value) -> None:
    """Keep `value` under `name` in `folder` (atomic, not fsynced: a crash may lose an entry, which is a miss;
    OSError swallowed: a cache must never fail a run)."""
    try:
        with atomic_open(folder / f"{name}.pkl", "wb", durable=False) as fh:
            pickle.dump(value, fh, protocol=pickle.HIGHEST_PROTOCOL)
    except OSError:
        pass
