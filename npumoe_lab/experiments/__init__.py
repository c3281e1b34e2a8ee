"""Experiments: results store (atomic parquet rows) and notebook sweeps (papermill; local pool or Dask).

Notebook contract: every notebook has a `parameters` cell with `out_dir = None` and writes its rows with
`write_rows(rows, out_dir)` when `out_dir` is set. Imports are lazy so `import npumoe_lab.experiments` stays cheap
inside every papermill kernel.
"""
from __future__ import annotations

import importlib

_EXPORTS = {
    "write_rows": "store", "load_results": "store", "write_timeline": "store", "load_timelines": "store",
    "KEY_COLUMNS": "store", "run_sweep": "sweep", "SweepReport": "sweep", "load_spec": "sweep_spec",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name):
    if name in _EXPORTS:
        return getattr(importlib.import_module(f".{_EXPORTS[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
