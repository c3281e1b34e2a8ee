"""The `--operating-point` flag of simulate, paper-check and the explorer (sim/operating_point.py)."""
from __future__ import annotations

OPERATING_POINTS = ("default", "paper")     # = sim.operating_point.OPERATING_POINTS (tests/cli check)


def add_operating_point_argument(parser, default: str = "default") -> None:
    parser.add_argument("--operating-point", default=default, choices=OPERATING_POINTS,
                        help="default: the plan knobs as given; paper: the tier percentile solved per (model, chunk, "
                             "platform) so that npumoe drops the paper's 10-22%% of routed assignments (at 16%%); "
                             "rows say what was chosen (percentile, op_drop_rate)")
