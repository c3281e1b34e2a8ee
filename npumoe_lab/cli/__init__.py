"""`npumoe-lab` console script (`npumoe_lab.cli:main`, `python -m npumoe_lab.cli`). Every argparse wiring lives in
this package, one module per command: SUBCOMMANDS maps a command to its module (npumoe_lab/cli/<module>.py), which
defines `register_cli(subparsers)` adding the command's parser with `func=handler(args) -> int`. Handlers import
the domain code they drive inside the function (domain modules expose plain functions and know nothing of argparse),
so a command's `--help` parses without torch or pandas."""
from __future__ import annotations

import argparse
import errno
import importlib
import sys

from npumoe_lab.errors import NpuMoeError
from npumoe_lab.results.outdir import check_writable

# command -> its module in npumoe_lab/cli/ (imported only for the command asked for, so `--help` stays fast)
SUBCOMMANDS = {
    "train-tiny": "train_tiny",
    "card": "card",
    "calibrate": "calibrate",
    "plan": "plan",
    "run": "run",
    "platforms": "platforms",
    "sweep": "sweep",
    "figures": "figures",
    "convert": "convert",
    "simulate": "simulate",
    "sensitivity": "sensitivity",
    "paper-check": "paper_check",
    "tune": "tune",
    "drift": "drift",
    "demo": "demo",
    "measure": "measure",
    "fit-device": "fit_device",
    "validate-device": "validate_device",
    "accuracy": "accuracy",
    "routing-stats": "routing_stats",
    "routing-import": "routing_import",
}


DISK_ERRORS = {errno.ENOSPC, errno.EDQUOT, errno.EROFS}   # a write the user can fix: one line, not a traceback

# commands whose --out is a file (the others write into a folder)
OUT_IS_FILE = {"plan", "routing-stats"}


# one line per command for the top-level --help, which must not import torch/pandas (it answers in < 1 s)
SUMMARIES = {
    "train-tiny": "train the bundled tiny MoE (time-budgeted, resumable)",
    "card": "measure the bundled tiny model's card (card_metrics.json + README.md)",
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
    "routing-import": "import routing of llama.cpp / vLLM / SGLang / TensorRT-LLM / HF / public files (schema)",
    "tune": "search plan knobs for a drop-rate or TTFT budget (Pareto front)",
    "drift": "calibrate on one domain, run another: the drift monitor and recalibration",
    "demo": "the demo: calibrate, plan, the demo sweep, every figure and SUMMARY.md in one folder",
    "measure": "micro-benchmark this machine's ops (cpu | onnxruntime | coreml) into measurement rows",
    "fit-device": "fit a platform's free parameters on its chip's micro-benchmark rows (least squares + emcee)",
    "validate-device": "predict every measurement row (or measured run) of a platform; validation table + figure",
    "accuracy": "accuracy change (exact bounds) vs measured drop rate of plans, with their modeled TTFT",
}


def build_parser(argv) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="npumoe-lab", description="NPUMoE research workbench",
                                     epilog="`npumoe-lab COMMAND --help` describes a command's options")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    wanted = argv[0] if argv else None
    if wanted not in SUBCOMMANDS:
        for name in SUBCOMMANDS:     # names only: argparse lists (or rejects) them
            sub.add_parser(name, help=SUMMARIES.get(name, ""))
        return parser
    importlib.import_module(f"npumoe_lab.cli.{SUBCOMMANDS[wanted]}").register_cli(sub)
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
            check_writable(args.out, is_file=args.command in OUT_IS_FILE and not getattr(args, "routing", None))
        return int(args.func(args) or 0)
    except NpuMoeError as exc:
        print(f"npumoe-lab {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        if exc.errno not in DISK_ERRORS:
            raise
        print(f"npumoe-lab {args.command}: error: could not write {exc.filename or 'a file'} ({exc.strerror}); "
              "free some space or choose another --out", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
