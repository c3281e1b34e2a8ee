"""The decode flags of run / simulate / sweep / paper-check (`--decode-tokens`, `--decode-policy`): one definition.

Values are checked by `execution.decode_policy.check_decode` when the command runs (one line, exit 2), not by
argparse choices, so a wrong policy gets the same one-line error from the CLI and the API."""
from __future__ import annotations

DECODE_POLICIES = ("pipeline", "cpu", "npu-decode")   # = execution.decode_policy.DECODE_POLICIES (tests/test_cli)


def add_decode_arguments(p) -> None:
    p.add_argument("--decode-tokens", type=int, default=8,
                   help="greedy decode steps after the prefill (default 8, the paper's end-to-end setting; 0: "
                        "prefill only, no e2e columns)")
    p.add_argument("--decode-policy", default="pipeline",
                   help=f"where decode steps run: {' | '.join(DECODE_POLICIES)} (default pipeline: the prefill's "
                        "static graphs, padded, as the paper's prototype; docs/END_TO_END.md)")


def check_decode_args(a) -> None:
    """The decode flags checked before anything is computed."""
    from npumoe_lab.execution.decode_policy import check_decode     # lazy: --help loads no engine code
    check_decode(a.decode_tokens, a.decode_policy)
