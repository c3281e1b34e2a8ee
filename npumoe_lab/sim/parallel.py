"""A simulation grid over worker processes: its (geometry, chunk) units are independent, so they run apart.

Everything a unit draws is keyed by (geometry, chunk, seed) (the calibration profile, the prompt's routing, the
parameter draws), so one unit's rows do not depend on which others ran before it: the rows come back in the
sequential order with the same values (tests/sim/test_parallel_simulation.py holds them equal). The routing
source is parsed once in the parent (the synthetic popularity's fit) and inherited by forked workers. Where fork is
unavailable, or the grid has a single unit, the caller runs sequentially.
"""
from __future__ import annotations

import multiprocessing as mp
import os

from npumoe_lab.errors import NpuMoeError

MIN_UNITS = 2          # fewer units than this: a worker pool only adds its start-up


def default_workers() -> int:
    """The cores this process may use (NPUMOE_WORKERS overrides; 1: sequential)."""
    env = os.environ.get("NPUMOE_WORKERS")
    if env:
        try:
            return max(1, int(env))
        except ValueError:
            raise NpuMoeError(f"NPUMOE_WORKERS={env!r} is not a whole number of worker processes") from None
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:       # not on Linux
        return os.cpu_count() or 1


def _quiet():
    os.environ["NPUMOE_NO_PROGRESS"] = "1"     # one bar: the parent's


def _unit(job):
    from npumoe_lab.sim.run import iter_simulation    # lazy: run.py imports this module (a cycle at the top)
    i, geometry, chunk, kwargs = job
    return i, [row for row, _ in iter_simulation(geometry, chunk=chunk, **kwargs)]


def parallel_rows(units: list, kwargs: dict, workers: int, make_bar=None, cost=None) -> list | None:
    """Rows of every (geometry, chunk) unit, in unit order, over `workers` forked processes; None where it does
    not pay or cannot run (one worker, fewer than MIN_UNITS units, no fork, inside a daemonic worker): the caller
    runs sequentially. `make_bar()`: the progress bar, made after the fork (no bar thread is forked). `cost[i]`:
    unit i's expected work; the costliest start first (so no long unit is left for last on one core)."""
    n = min(int(workers), len(units))
    if n < 2 or len(units) < MIN_UNITS or "fork" not in mp.get_all_start_methods() or mp.current_process().daemon:
        return None
    order = sorted(range(len(units)), key=lambda i: -(cost[i] if cost is not None else 0))   # stable: ties in order
    done = [None] * len(units)
    with mp.get_context("fork").Pool(n, initializer=_quiet) as pool:
        bar = make_bar() if make_bar is not None else None
        try:
            jobs = [(i, *units[i], kwargs) for i in order]
            for i, got in pool.imap_unordered(_unit, jobs, chunksize=1):
                done[i] = got
                if bar is not None:
                    bar.update(len(got))
        finally:
            if bar is not None:
                bar.close()
    return [row for got in done for row in got]                     # the sequential order


__all__ = ["parallel_rows", "default_workers"]
