"""Runs inside a warm sweep kernel (warm_kernel.py) between cells: IPython's own namespace reset, minus its cost.

`%reset -f` is `shell.reset(new_session=False)` (user names, output cache `Out`/`_N`, input history) followed by
a full `gc.collect()`, and the reset's output-cache flush runs another one: ~0.5 s a cell once torch and a model
are loaded, a tenth of a small sweep cell. Here the same reset runs with those two collections skipped; what the
previous cell dropped is freed by reference counting at once, and its cycles by Python's generational collector.
"""
from __future__ import annotations

import gc


def reset(shell) -> None:
    """`%reset -f` on `shell` (an IPython InteractiveShell) without its full garbage collections."""
    collect = gc.collect
    gc.collect = lambda generation=2: 0      # IPython calls gc.collect() itself: skipped for this call only
    try:
        shell.reset(new_session=False)
    finally:
        gc.collect = collect
