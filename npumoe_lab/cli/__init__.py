"""`npumoe-lab` console script. Each subcommand lives next to the code it drives: a module listed in
SUBCOMMANDS defines `register_cli(subparsers)` that adds its parser and sets `func=handler(args) -> int`."""
from __future__ import annotations

import argparse
import importlib
import sys

from npumoe_lab.errors import NpuMoeError
from npumoe_lab.results.outdir import check_writable

# module (relative to npumoe_lab) -> subcommands it provides (imported lazily so `--help` stays fast)
SUBCOMMANDS = {
    "train.trainer": ["train-tiny"],
    "execution.calibrate": ["calibrate"],
    "planning.plan": ["plan"],
    "experiments.runner": ["run", "platforms"],
    "experiments.sweep": ["sweep"],
    "sim.run": ["simulate"],
    "sim.sensitivity": ["sensitivity"],
    "sim.papercheck": ["paper-check"],
    "sim.routing_stats": ["routing-stats"],
    "viz.plots": ["figures"],
    "graphs.convert": ["convert"],
    "studies.tune": ["tune"],
    "studies.adaptive": ["drift"],
}


# commands whose --out is a file (the others write into a folder)
OUT_IS_FILE = {"plan", "routing-stats"}


# one line per command for the top-level --help, which must not import torch/pandas (it answers in < 1 s)
SUMMARIES = {
    "train-tiny": "train the bundled tiny MoE (time-budgeted, resumable)",
    "calibrate": "count expert routing on a workload (calibration profile)",
    "plan": "build a static capacity/group/residency plan from a calibration profile",
    "run": "run variants on a workload and write result rows",
    "platforms": "list the platforms with their sources (and describe this host)",
    "sweep": "run a notebook over a parameter grid (papermill), resumably",
    "figures": "make every paper figure the results allow (PDF + PNG)",
    "convert": "build static NPU graphs (Core ML / ONNX) of a plan",
    "simulate": "paper-scale prefill from a model's geometry and routing statistics (no weights; times modeled)",
    "sensitivity": "rerun a simulation at every sourced alternative of the uncertain device parameters",
    "paper-check": "the device model against every number of the paper's results it can predict",
    "routing-stats": "measure simulation's routing defaults (per-chunk dispersion, cross-workload overlap)",
    "tune": "search plan knobs for a drop-rate or TTFT budget (Pareto front)",
    "drift": "calibrate on one domain, run another: the drift monitor and recalibration",
}


def build_parser(argv) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="npumoe-lab", description="NPUMoE research workbench",
                                     epilog="`npumoe-lab COMMAND --help` describes a command's options")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    wanted = argv[0] if argv else None
    if wanted in (None, "-h", "--help") or not any(wanted in c for c in SUBCOMMANDS.values()):
        for commands in SUBCOMMANDS.values():     # names only: argparse lists (or rejects) them
            for name in commands:
                sub.add_parser(name, help=SUMMARIES.get(name, ""))
        return parser
    for module, commands in SUBCOMMANDS.items():
        if wanted in commands:
            try:
                mod = importlib.import_module(f"npumoe_lab.{module}")
            except ModuleNotFoundError as exc:  # a part not built yet: keep the others working
                if not exc.name or not exc.name.startswith("npumoe_lab"):
                    raise
                continue
            mod.register_cli(sub)
    return parser


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser(argv)
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        if getattr(args, "out", None):    # before any compute: a late PermissionError would lose the work
            check_writable(args.out, is_file=args.command in OUT_IS_FILE)
        return int(args.func(args) or 0)
    except NpuMoeError as exc:
        print(f"npumoe-lab {args.command}: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
