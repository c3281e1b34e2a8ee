"""`npumoe-lab figures`: every paper figure the result rows allow (PDF + PNG)."""
from __future__ import annotations

import sys
from pathlib import Path

from npumoe_lab.cli.output import writes
from npumoe_lab.results.outdir import check_writable


def _figures(args) -> int:
    from npumoe_lab.viz.plots import make_all_figures      # lazy: matplotlib and pandas load only when run
    out = args.out or str(Path(args.results) / "figures")
    check_writable(out)
    with writes(out, "no figure is kept half-drawn"):
        paths = make_all_figures(args.results, out, log=lambda line: print(line, file=sys.stderr))
    for path in paths:
        print(path)
    return 0


def register_cli(subparsers) -> None:
    p = subparsers.add_parser("figures", help="make every paper figure the results allow (PDF + PNG)")
    p.add_argument("results", help="results folder (rows from `npumoe-lab run` / `sweep`)")
    p.add_argument("--out", default=None, help="folder for the figures (default RESULTS/figures)")
    p.set_defaults(func=_figures)
