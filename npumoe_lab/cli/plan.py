"""`npumoe-lab plan`: a static capacity/group/residency plan from a calibration profile (or `--show` one)."""
from __future__ import annotations

from npumoe_lab.cli.common import add_dtype_argument
from npumoe_lab.cli.knob_flags import add_knob_arguments, knobs_from_args
from npumoe_lab.cli.output import writes
from npumoe_lab.errors import NpuMoeError


def _plan(args) -> int:
    # lazy: numpy, torch and the model load only when the command runs (`--help` stays fast)
    from npumoe_lab.core.cpu_features import resolve_dtype
    from npumoe_lab.models import load_model
    from npumoe_lab.planning.plan import Plan, build_plan, variant_plan
    if args.show:
        print(Plan.load(args.show).summary())
        return 0
    if not args.profile or not args.out:
        raise NpuMoeError("plan needs --profile DIR and --out PLAN.json (or --show PLAN.json)")
    model = load_model(args.model, dtype=resolve_dtype(args.dtype))[0] if args.model else None
    kw = dict(knobs_from_args(args), platform=None if args.platform == "none" else args.platform)
    plan = variant_plan(args.profile, args.variant, model, **kw) if args.variant else \
        build_plan(args.profile, model, **kw)
    print(plan.summary(), flush=True)
    with writes(args.out, "the summary is printed above"):
        plan.save(args.out)
    print(f"wrote {args.out}")
    return 0


def register_cli(subparsers) -> None:
    p = subparsers.add_parser("plan", help="build a static capacity/group/residency plan from a calibration profile")
    p.add_argument("--profile", help="calibration profile directory (npumoe-lab calibrate --out)")
    p.add_argument("--out", help="plan JSON to write")
    p.add_argument("--show", metavar="PLAN.json", help="print the summary of an existing plan and exit")
    p.add_argument("--model", help="check the profile against this model ('tiny' or a directory)")
    p.add_argument("--variant", help="force a variant's knobs (npumoe-base, npumoe-t, npumoe-tg, npumoe, naive-npu)")
    p.add_argument("--platform", default="m2-max", help="platform name, or 'none' for no device limits")
    add_dtype_argument(p)
    add_knob_arguments(p)
    p.set_defaults(func=_plan)
