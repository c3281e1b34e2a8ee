"""`npumoe-lab tune`: the plan that meets a drop-rate or a TTFT budget, searched over the plan knobs."""
from __future__ import annotations

from pathlib import Path

from contextlib import nullcontext

from npumoe_lab.cli.common import list_help, over_cells
from npumoe_lab.cli.output import writes
from npumoe_lab.errors import NpuMoeError


def parse_space(items) -> dict:
    """`--space tiers=2,3 --space order=popularity` -> {"tiers": [2, 3], "order": ["popularity"]}."""
    space = {}
    for item in items or []:
        name, sep, values = item.partition("=")
        if not sep or not values:
            raise NpuMoeError(f"--space {item!r}: use NAME=V1,V2 (e.g. tiers=2,3)")
        space[name.replace("-", "_")] = [_value(v) for v in values.split(",")]
    return space


def _value(text: str):
    if text == "none":
        return None
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def _tune(args) -> int:
    from npumoe_lab.studies.tune import tune      # lazy: torch and the model load only when the command runs
    guard = writes(args.out, "the search must be rerun") if args.out else nullcontext()   # tune writes as it ends
    with guard:
        report = tune(model=args.model, geometry=args.geometry, budget_drop=args.budget_drop,
                      budget_ttft_ms=args.budget_ttft_ms, platform=args.platform, out=args.out, chunk=args.chunk,
                      prompt_len=args.prompt_len, calib_workload=args.calib_workload,
                      calib_tokens=args.calib_tokens, routing=args.routing, profile=args.profile,
                      space=parse_space(args.space),
                      n_candidates=args.candidates, confirm=args.confirm, seed=args.seed)
    c, d = report["chosen"], report["default"]
    print(f"tune {report['target']} on {report['platform']}: {report['n_candidates']} candidates, "
          f"{report['front_size']} on the Pareto front, {report['elapsed_s_measured']:.1f} s (measured)")
    print(f"chosen knobs {report['chosen_knobs'] or '(defaults)'}: TTFT {c['ttft_ms_modeled']:.3f} ms (modeled), "
          f"drop {c['drop_rate']:.2%} ({c['drop_source']}), energy {c['energy_mj_modeled']:.3f} mJ (modeled)"
          + ("" if report["met"] else "  -- BUDGET NOT MET by any confirmed candidate"))
    print(f"default knobs: TTFT {d['ttft_ms_modeled']:.3f} ms (modeled), drop {d['drop_rate']:.2%} "
          f"({d['drop_source']})")
    if args.out:
        print(f"wrote {Path(args.out) / 'plan.json'}, candidates.csv, front.csv, front.png, tune.json")
    return 0


def register_cli(sub) -> None:
    p = sub.add_parser("tune", help="search plan knobs for a drop-rate or TTFT budget (Pareto front)")
    who = p.add_mutually_exclusive_group()
    who.add_argument("--model", default="tiny", help="model name or path (default tiny)")
    who.add_argument("--geometry", help="a geometry name or config.json: simulation only, nothing confirmed")
    b = p.add_mutually_exclusive_group(required=True)
    b.add_argument("--budget-drop", type=float, help="largest drop rate (share of routed assignments, e.g. 0.05)")
    b.add_argument("--budget-ttft-ms", type=float, help="largest modeled TTFT in ms")
    p.add_argument("--platform", "--platforms", dest="platform", default="m2-max",
                   help=list_help("the modeled platform(s) TTFT and energy are priced on", "m2-max"))
    p.add_argument("--out", help="directory for plan.json, front.csv/png, candidates.csv, tune.json")
    p.add_argument("--chunk", default="128", help=list_help("prefill chunk in tokens", 128))
    p.add_argument("--prompt-len", default="512", help=list_help("prompt tokens scored", 512))
    p.add_argument("--calib-workload", default="mixed", help="calibration text: a workload, a domain or 'mixed'")
    p.add_argument("--calib-tokens", type=int, default=4096, help="calibration tokens (default 4096)")
    p.add_argument("--profile", help="a calibration profile directory of this model (default: calibrate, cached)")
    p.add_argument("--routing", help="routing source with --geometry (default tiny; see `npumoe-lab simulate`)")
    p.add_argument("--space", action="append", metavar="KNOB=V1,V2", help="values to try for a knob (repeatable)")
    p.add_argument("--candidates", type=int, default=40, help="random candidates besides the defaults")
    p.add_argument("--confirm", type=int, default=2, help="top candidates confirmed with real numerics")
    p.add_argument("--seed", type=int, default=0, help="seed of the random candidates (default 0)")
    p.set_defaults(func=lambda a: over_cells(_tune, a, {"prompt_len": "--prompt-len", "chunk": "--chunk",
                                                      "platform": "--platforms"}))
