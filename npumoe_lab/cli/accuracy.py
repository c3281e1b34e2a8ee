"""`npumoe-lab accuracy`: accuracy change (exact bounds, McNemar p), NLL change and top-1 agreement against the
measured drop rate of plans, with the modeled TTFT of the same plans (studies/accuracy_curve.py)."""
from __future__ import annotations

from npumoe_lab.cli.common import list_help, over_cells
from npumoe_lab.errors import NpuMoeError


def _floats(text: str, what: str) -> list[float]:
    try:
        return [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise NpuMoeError(f"{what} must be numbers separated by commas (e.g. 50,70,80,90,95,100); got {text!r}")


def _difficulty(items, workloads) -> dict:
    """--difficulty TASK:KEY=VALUE (repeatable) -> {task: {key: value}}; values int where they parse as int."""
    out: dict = {}
    for item in items or ():
        task, sep, kv = item.partition(":")
        key, sep2, val = kv.partition("=")
        if not sep or not sep2 or not key:
            raise NpuMoeError(f"--difficulty takes TASK:KEY=VALUE (e.g. ruler-multikey:n_needles=16); got {item!r}")
        if task not in workloads:
            raise NpuMoeError(f"--difficulty {item!r} names {task!r}, which is not among --workload "
                              f"{','.join(workloads)}")
        out.setdefault(task, {})[key] = _value(val)
    return out


def _value(text: str):
    """A --difficulty value: none / true / false, an int where it parses as one, else the string."""
    special = {"none": None, "true": True, "false": False}
    if text.lower() in special:
        return special[text.lower()]
    return int(text) if text.lstrip("-").isdigit() else text


def _accuracy(args) -> int:
    # lazy: torch and the model load only when the command runs (`--help` stays fast)
    from npumoe_lab.studies.accuracy_curve import DEFAULT_N, DEFAULT_PERCENTILES, DEFAULT_SALIENCY, run_curve
    from npumoe_lab.studies.accuracy_verdict import verdict, verdict_lines
    from npumoe_lab.workloads.difficulty import DEFAULT_TASKS
    args.workload = args.workload or ",".join(DEFAULT_TASKS)
    args.percentiles = args.percentiles or ",".join(f"{p:g}" for p in DEFAULT_PERCENTILES)
    args.saliency = args.saliency or ",".join(DEFAULT_SALIENCY)
    args.n = DEFAULT_N if args.n is None else args.n
    workloads = [w.strip() for w in args.workload.split(",") if w.strip()]
    saliency = [s.strip() for s in args.saliency.split(",") if s.strip()]
    rows, samples = run_curve(args.out, model=args.model, workloads=workloads, prompt_len=args.prompt_len,
                        difficulty=_difficulty(args.difficulty, workloads),
                        percentiles=_floats(args.percentiles, "--percentiles"), saliency=saliency, n=args.n,
                        platform=args.platform, chunk=args.chunk, variant=args.variant, seed=args.seed,
                        calib_workload=args.calib_workload, calib_tokens=args.calib_tokens,
                        draws=args.draws, ref_cache=not args.no_ref_cache, threads=args.threads)
    print("\n".join(verdict_lines(verdict(rows, samples), rows)))
    if args.out:     # the curve's rows also as result rows: load_results(DIR) reads them like every command's
        from npumoe_lab.cli.output import writes  # lazy: with the rest of the command
        from npumoe_lab.results.store import write_rows  # lazy: pandas
        with writes(args.out, "curve.csv is written and the verdict printed above"):
            write_rows(rows.assign(repeat=0), args.out)
        print(f"wrote {args.out}/curve.csv, samples.csv, rows-*.parquet, ACCURACY.md, accuracy_curve.png/.pdf")
    return 0


def register_cli(sub) -> None:
    p = sub.add_parser("accuracy", help="accuracy change vs measured drop rate of plans (exact bounds), with "
                                        "the modeled TTFT of the same plans")
    p.add_argument("--model", default="tiny", help="model name or path (default tiny)")
    p.add_argument("--workload", default=None,
                   help="tasks: one or a comma list, all in one curve (default ruler-multikey,ruler-vt,fewshot-cls,lm-next, each at its "
                        "calibrated difficulty; 0/1-scored tasks only)")
    p.add_argument("--prompt-len", default=None,
                   help="prompt tokens for every task: one value or a comma list, one cell of rows per combination "
                        "(default: each task's calibrated setting)")
    p.add_argument("--difficulty", action="append", metavar="TASK:KEY=VALUE",
                   help="override a task's difficulty option, e.g. ruler-multikey:n_needles=16 (repeatable)")
    p.add_argument("--percentiles", default=None,
                   help="tier percentiles of the plans, in (0, 100] (default 50,70,80,90,95,100)")
    p.add_argument("--saliency", default=None,
                   help="saliency rules (default weight_x_norm,random; random = the control)")
    p.add_argument("--n", type=int, default=None, help="samples per task (default 300)")
    p.add_argument("--out", help="folder for curve.csv, samples.csv, ACCURACY.md, accuracy_curve.png/.pdf")
    p.add_argument("--platform", "--platforms", dest="platform", default="m2-max",
                   help=list_help("platform(s) the plans are built for and TTFT modeled on", "m2-max"))
    p.add_argument("--variant", "--variants", dest="variant", default="npumoe-tg",
                   help=list_help("plan variant(s)", "npumoe-tg: every group resident"))
    p.add_argument("--chunk", default="256", help=list_help("prefill chunk in tokens", 256))
    p.add_argument("--seed", type=int, default=0, help="seed of the samples and the random saliency (default 0)")
    p.add_argument("--calib-workload", default="mixed", help="calibration text (default mixed)")
    p.add_argument("--calib-tokens", type=int, default=8192, help="calibration tokens (default 8192)")
    p.add_argument("--draws", type=int, default=200,
                   help="parameter draws for the modeled TTFT's 90%% interval (ttft_s_lo/_hi; the platform's "
                        "posterior, else a prior from its sourced alternatives; 0: none)")
    p.add_argument("--no-ref-cache", action="store_true",
                   help="recompute every reference forward instead of reading the on-disk cache "
                        "(cache_dir()/accuracy-refs, keyed by weights, dtype, task, difficulty, seed, chunk)")
    p.add_argument("--threads", type=int, default=None, help="torch intra-op threads")
    p.set_defaults(func=lambda a: over_cells(_accuracy, a, {"prompt_len": "--prompt-len", "chunk": "--chunk",
                                                          "platform": "--platforms", "variant": "--variants"}))
