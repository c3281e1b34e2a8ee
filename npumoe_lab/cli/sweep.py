"""`npumoe-lab sweep`: a notebook run once per grid cell (papermill), resumably."""
from __future__ import annotations

import os

from npumoe_lab.cli.operating_point import OPERATING_POINTS

EXECUTORS = ("local", "dask")      # = experiments.sweep.EXECUTORS (tests/test_cli checks)


def _sweep(args) -> int:
    from npumoe_lab.experiments.sweep import run_sweep     # lazy: papermill and the pool load only when run
    if args.no_cache:      # every cell's routing draws sampled and plans built afresh (the workers inherit it)
        os.environ["NPUMOE_DRAW_CACHE"] = os.environ["NPUMOE_PLAN_CACHE"] = "off"
    report = run_sweep(args.sweep, args.out, workers=args.workers, executor=args.executor,
                       scheduler=args.scheduler, warm=not args.fresh_kernels,
                       fresh=args.fresh, overrides=_overrides(args))
    print(report.summary())
    return 0 if report.ok else 1


def _overrides(args) -> dict:
    return {} if args.operating_point is None else {"operating_point": args.operating_point}


def register_cli(subparsers) -> None:
    p = subparsers.add_parser("sweep", help="run a notebook over a parameter grid (papermill), resumably",
                              description="Run SWEEP.yaml's notebook once per grid cell. Re-running skips "
                                          "cells with DONE.json and retries failed ones.")
    p.add_argument("sweep", help="sweep YAML (notebook, parameters, grid, optional include/name)")
    p.add_argument("--out", required=True, help="results folder (created; reused to resume)")
    p.add_argument("--workers", type=int, default=1, help="cells run at once (default 1)")
    p.add_argument("--executor", choices=EXECUTORS, default="local",
                   help="local process pool, or Dask distributed (a LocalCluster unless --scheduler)")
    p.add_argument("--scheduler", default=None, help="address of a running Dask scheduler (tcp://host:8786)")
    p.add_argument("--fresh-kernels", action="store_true",
                   help="a new kernel per cell (default for local workers: one warm kernel each, reused)")
    p.add_argument("--fresh", action="store_true",
                   help="re-measure: run again every done cell that times a measured platform (the old attempt is "
                        "kept in the cell's _attempts/, never loaded); modeled-only cells are kept")
    p.add_argument("--operating-point", default=None, choices=OPERATING_POINTS,
                   help="every cell at this operating point (default: as the YAML says): its `operating_point` "
                        "parameter or grid entry is replaced; the sweep's notebook or simulate must take it "
                        "(docs/OPERATING_POINT.md)")
    p.add_argument("--no-cache", action="store_true",
                   help="simulate cells sample every routing draw and build every plan afresh instead of reading "
                        "the keyed caches (cache_dir()/draws and /plans; the same rows either way; = "
                        "NPUMOE_DRAW_CACHE=off NPUMOE_PLAN_CACHE=off)")
    p.set_defaults(func=_sweep)
