"""`npumoe-lab demo` (`make demo`): calibrate, plan, the demo sweep, every
figure and SUMMARY.md in one folder."""
from __future__ import annotations

import argparse

from npumoe_lab.utils import REPO_ROOT

DEMO_SWEEP = REPO_ROOT / "sweeps" / "demo.yaml"      # = experiments.demo.DEMO_SWEEP


def add_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--out", default="results/demo", help="output folder (default %(default)s)")
    p.add_argument("--sweep", default=str(DEMO_SWEEP), help="the sweep YAML to run (default sweeps/demo.yaml)")
    p.add_argument("--workers", type=int, default=1, help="sweep cells run at once (default 1)")
    p.add_argument("--fresh", action="store_true",
                   help="re-measure every measured cell of the demo sweep instead of reusing the last run's")


def _demo(a) -> int:
    from npumoe_lab.experiments.demo import run_demo    # lazy: torch, papermill, matplotlib load only when run
    run_demo(a.out, a.sweep, a.workers, fresh=a.fresh)
    return 0


def register_cli(sub) -> None:
    p = sub.add_parser("demo", help="the demo: calibrate, plan, sweep, figures and SUMMARY.md in one folder")
    add_args(p)
    p.set_defaults(func=_demo)
