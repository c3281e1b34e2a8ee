"""`npumoe-lab drift`: a plan calibrated on one domain prefilling another's held-out text, with the drift monitor and
recalibration."""
from __future__ import annotations

from npumoe_lab.cli.common import list_help, over_cells
from npumoe_lab.cli.output import writes

CELL_FLAGS = {"prompt_len": "--prompt-len", "chunk": "--chunk", "platform": "--platforms"}
from npumoe_lab.execution.drift_limits import POLICIES, DriftLimits
from npumoe_lab.workloads.texts import DOMAINS


def _drift(args) -> int:
    from npumoe_lab.cli.common import positive  # lazy: the command loads only what it runs
    from npumoe_lab.execution.config import check_lengths     # light: no torch
    check_lengths(args.prompt_len, args.chunk)                # every input checked before the model loads
    for flag, value in (("--calib-tokens", args.calib_tokens), ("--persist", args.persist),
                        ("--window", args.window)):
        positive(value, flag)
    # lazy: torch and the model load only when the command runs (`--help` stays fast)
    from npumoe_lab.models import load_model
    from npumoe_lab.studies.adaptive import drift_run
    limits = {k: getattr(args, f"limit_{k}") for k in DriftLimits.__dataclass_fields__
              if getattr(args, f"limit_{k}", None) is not None}
    model, tok = load_model(args.model)
    rep = drift_run(model, tok, args.calib, args.run, prompt_len=args.prompt_len, chunk=args.chunk,
                    calib_tokens=args.calib_tokens, recalibrate=args.recalibrate, platform=args.platform,
                    limits=limits, persist=args.persist, window=args.window)
    print(rep.text())
    print(rep.per_chunk.to_string(index=False))
    if args.out:
        with writes(args.out, "the report is printed above"):
            paths = rep.save(args.out)
        print("wrote " + ", ".join(str(p) for p in paths))
    return 0


def register_cli(sub) -> None:
    p = sub.add_parser("drift", help="routing drift: a plan calibrated on one domain prefilling another's "
                                     "held-out text, with the drift monitor and recalibration")
    p.add_argument("--model", default="tiny", help="'tiny' or a local HF checkpoint directory")
    p.add_argument("--calib", default="scripture", help=f"calibration domain ({', '.join(DOMAINS)})")
    p.add_argument("--run", default="code", help="domain of the lm-heldout prompt")
    p.add_argument("--prompt-len", default="2048", help=list_help("prompt tokens", 2048))
    p.add_argument("--chunk", default="128", help=list_help("prefill chunk in tokens", 128))
    p.add_argument("--calib-tokens", type=int, default=4096, help="calibration tokens (default 4096)")
    p.add_argument("--recalibrate", default="rebuild", choices=POLICIES,
                   help="what the monitor does on drift: rebuild the plan (default), warn, or off")
    p.add_argument("--persist", type=int, default=2, help="drifting chunks in a row before a rebuild")
    p.add_argument("--window", type=int, default=8, help="live chunks the running profile keeps")
    p.add_argument("--platform", "--platforms", dest="platform", default="m2-max",
                   help=list_help("the modeled platform(s) TTFT is priced on", "m2-max"))
    for k in DriftLimits.__dataclass_fields__:
        p.add_argument(f"--limit-{k.replace('_', '-')}", dest=f"limit_{k}", type=int if k == "hot_k" else float,
                       help=f"drift limit {k} (default {getattr(DriftLimits(), k)})")
    p.add_argument("--out", help="directory for drift_per_chunk.csv, drift_records.csv, drift_summary.json")
    p.set_defaults(func=lambda a: over_cells(_drift, a, CELL_FLAGS))
