"""`npumoe-lab calibrate`: per-expert routed-token counts per prefill chunk (a calibration profile folder)."""
from __future__ import annotations

from npumoe_lab.cli.common import add_device_argument, add_dtype_argument
from npumoe_lab.cli.output import writes


def _calibrate(args) -> int:
    # lazy: torch and the model load only when the command runs (`--help` stays fast)
    from npumoe_lab.execution.calibrate import calibrate
    from npumoe_lab.core.cpu_features import resolve_dtype
    from npumoe_lab.models import load_model
    model, tokenizer = load_model(args.model, dtype=resolve_dtype(args.dtype), device=args.device)  # run's policy
    profile = calibrate(model, tokenizer, args.workload, args.chunk, args.tokens, args.seed)
    print(profile.summary().to_string(index=False, float_format=lambda x: f"{x:.3f}"), flush=True)
    with writes(args.out, "the summary is printed above"):       # after printing: a full disk cannot lose it
        profile.save(args.out)
    print(f"wrote {args.out} ({profile.meta['n_tokens']} tokens, {profile.meta['n_chunks']} chunks)")
    return 0


def register_cli(subparsers) -> None:
    p = subparsers.add_parser("calibrate", help="record per-expert routed-token counts per prefill chunk")
    p.add_argument("--model", required=True, help="'tiny' or a local HF checkpoint directory")
    p.add_argument("--workload", "--calib-workload", dest="workload", default="mixed", help="a workload name, a domain name, or 'mixed' (default)")
    p.add_argument("--chunk", type=int, default=512, help="prefill chunk in tokens (default 512)")
    p.add_argument("--tokens", "--calib-tokens", dest="tokens", type=int, default=16384,
                   help="calibration tokens (default 16384; `--calib-tokens` as in run/tune/drift)")
    p.add_argument("--seed", type=int, default=0, help="seed of the document order (default 0)")
    add_dtype_argument(p)
    add_device_argument(p)
    p.add_argument("--out", default="results/profile", help="output directory of the profile (default results/profile)")
    p.set_defaults(func=_calibrate)
