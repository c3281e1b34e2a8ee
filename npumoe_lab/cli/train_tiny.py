"""`npumoe-lab train-tiny`: the training recipe of the bundled model."""
from __future__ import annotations

import argparse
import os

from npumoe_lab.utils import DATA_DIR

DEFAULT_RUN = DATA_DIR / "train-runs" / "tiny"          # = train.trainer.DEFAULT_RUN (tests/test_cli checks)
DEFAULT_EXPORT = DATA_DIR / "models" / "npumoe-tiny"    # = train.trainer.DEFAULT_EXPORT


def add_args(p: argparse.ArgumentParser):
    p.add_argument("--minutes", type=float, default=60.0, help="training time budget (wall clock)")
    p.add_argument("--stages", default="512:0.45,1024:0.35,2304:0.2",
                   help="length curriculum SEQ_LEN:TIME_FRACTION,... (default: %(default)s)")
    p.add_argument("--batch-tokens", type=int, default=6144, help="tokens per optimizer step (default %(default)s)")
    p.add_argument("--lr", type=float, default=2e-3, help="peak learning rate (default %(default)s)")
    p.add_argument("--warmup", type=int, default=60, help="warm-up steps (default %(default)s)")
    p.add_argument("--synth-frac", type=float, default=0.5, help="share of sequences that are synthetic tasks")
    p.add_argument("--task-weights", default="multikey:0.4,vt:0.4,fewshot:0.2",
                   help="shares of the synthetic tasks (default: %(default)s)")
    p.add_argument("--max-queries", type=int, default=4, help="answered multi-key queries per sequence: 1..N")
    p.add_argument("--weight-copies", action="store_true",
                   help="repeat task: the copied halves get the answer-token loss weight")
    p.add_argument("--answer-weight", type=float, default=4.0, help="extra loss weight of answer tokens")
    p.add_argument("--probe-len", type=int, default=512, help="prompt length of the induction probe")
    p.add_argument("--eval-minutes", type=float, default=4.0, help="wall-clock minutes between evaluations")
    p.add_argument("--threads", default="2", help="torch threads, or 'auto' (switch between 1 and 2 by measured "
                   "speed: on a shared 2-core machine 1 thread is often faster)")
    p.add_argument("--seed", type=int, default=0, help="seed of the data order and the initial weights")
    p.add_argument("--experts-impl", default="grouped_mm", help="transformers experts implementation while training")
    p.add_argument("--run-dir", default=str(DEFAULT_RUN), help="checkpoints and logs (resumed if present)")
    p.add_argument("--export", default=str(DEFAULT_EXPORT), help="export dir ('' to skip)")
    p.add_argument("--fresh", action="store_true", help="ignore an existing checkpoint in --run-dir")


def _train(args) -> int:
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # no spinning OpenMP threads on a shared CPU
    from npumoe_lab.train.trainer import train     # lazy: torch loads only when the command runs, not at --help
    return train(args)


def register_cli(subparsers) -> None:
    p = subparsers.add_parser("train-tiny", help="train the bundled tiny MoE (time-budgeted, resumable)")
    add_args(p)
    p.set_defaults(func=_train)
