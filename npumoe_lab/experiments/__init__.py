"""Experiments: runs of variants (runner), notebook sweeps (papermill; local pool or Dask).

Notebook contract: every notebook has a `parameters` cell with `out_dir = None` and writes its rows with
`write_rows(rows, out_dir)` when `out_dir` is set. Imports are lazy so `import npumoe_lab.experiments` stays cheap
inside every papermill kernel.
"""
from __future__ import annotations

import importlib

_EXPORTS = {
    "write_rows": "npumoe_lab.results.store", "load_results": "npumoe_lab.results.store",
    "write_timeline": "npumoe_lab.results.store", "load_timelines": "npumoe_lab.results.store",
    "KEY_COLUMNS": "npumoe_lab.results.store", "run_sweep": "npumoe_lab.experiments.sweep",
    "SweepReport": "npumoe_lab.experiments.sweep", "load_spec": "npumoe_lab.experiments.sweep_spec",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name):
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
