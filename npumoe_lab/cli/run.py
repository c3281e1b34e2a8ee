"""`npumoe-lab run`: variants x platforms on a workload -> result rows (and the median table, the ablation line)."""
from __future__ import annotations

from contextlib import nullcontext

from npumoe_lab.cli.common import add_dtype_argument
from npumoe_lab.cli.decode_flags import add_decode_arguments, check_decode_args
from npumoe_lab.cli.knob_flags import add_knob_arguments, knobs_from_args
from npumoe_lab.cli.output import writes

WORKLOADS = ("ruler-multikey", "ruler-vt", "fewshot-cls", "lm-heldout", "lm-next", "boolq", "hellaswag")   # = list_workloads()
MEASURED_REPEATS = 3     # = experiments.runner.MEASURED_REPEATS (not imported: torch; tests/test_cli checks)


def _run(a) -> int:
    # lazy: torch, pandas and the model load only when the command runs (`--help` stays fast)
    import pandas as pd
    from npumoe_lab.experiments.runner import ablation_report, median_table, run_experiment
    from npumoe_lab.results.stats import change_statement
    from npumoe_lab.results.store import write_rows
    knobs = knobs_from_args(a)
    check_decode_args(a)
    # rows are written after the table is printed (a full disk cannot lose them); timelines are written by the run
    early = a.out if a.timeline else None
    with writes(a.out, "the rows must be rerun") if early else nullcontext():
        df = run_experiment(model=a.model, workload=a.workload, variants=a.variants, platforms=a.platforms,
                            prompt_len=a.prompt_len, chunk=a.chunk, plan=a.plan, repeats=a.repeats,
                            n_samples=a.n_samples, seed=a.seed, out=early, calib_workload=a.calib_workload,
                            calib_tokens=a.calib_tokens, timeline=a.timeline, npu_backend=a.npu_backend,
                            threads=a.threads, dtype=a.dtype, drift=a.drift, draws=a.draws,
                            decode_tokens=a.decode_tokens, decode_policy=a.decode_policy, **knobs)
    cols = ["variant", "platform", "timing_source", "ttft_s", "ttft_iqr_s", "host_busy", "energy_per_token_mj",
            "cpu_busy_s", "n_npu_calls", "drop_rate", "pad_rate", "tpot_s", "e2e_s", "score", "accuracy_delta"]
    print(median_table(df, [c for c in cols if c in df.columns]))
    for r in df.drop_duplicates(["variant", "platform"]).itertuples():
        if r.variant != "reference" and pd.notna(getattr(r, "accuracy_lost", None)):
            print(f"  {r.variant} @ {r.platform}: " + change_statement(
                r.accuracy_lost, r.accuracy_gained, r.n_samples, r.accuracy_loss_bound, r.accuracy_exact_low,
                r.accuracy_exact_high))
    report = ablation_report(df)
    if report:
        print("\nablation (TTFT speedup vs npumoe-base):\n" + report)
    if not early:
        with writes(a.out, "the table is printed above"):
            write_rows(df, a.out)
    print(f"\nrows written to {a.out}")
    return 0


def register_cli(sub) -> None:
    p = sub.add_parser("run", help="run variants on a workload and write result rows")
    p.add_argument("--model", default="tiny", help="'tiny' (the bundled model) or a local HF checkpoint directory")
    p.add_argument("--workload", required=True, help=f"one of: {', '.join(WORKLOADS)}")
    p.add_argument("--variants", "--variant", dest="variants", default="all",
                   help="comma list of variants, or 'all' (default)")
    p.add_argument("--platforms", "--platform", dest="platforms", default="cpu,m2-max",
                   help="comma list (default cpu,m2-max); see `npumoe-lab platforms`")
    p.add_argument("--prompt-len", type=int, default=1024, help="prompt tokens per sample (default 1024)")
    p.add_argument("--chunk", type=int, default=256, help="prefill chunk in tokens (default 256)")
    p.add_argument("--plan", default=None, help="a plan JSON for the npumoe variants (else built from calibration)")
    p.add_argument("--repeats", type=int, default=None,
                   help=f"timed repeats per sample (default: {MEASURED_REPEATS} on a measured platform, 1 modeled)")
    p.add_argument("--n-samples", "--samples", dest="n_samples", type=int, default=4,
                   help="workload samples scored (default 4)")
    p.add_argument("--seed", type=int, default=0, help="seed of the samples and the bootstrap (default 0)")
    p.add_argument("--calib-workload", default="mixed", help="calibration text: a workload, a domain or 'mixed'")
    p.add_argument("--calib-tokens", type=int, default=8192, help="calibration tokens (default 8192)")
    add_knob_arguments(p, with_defaults=False)       # unset: the plan's / variant's own knobs
    add_decode_arguments(p)
    p.add_argument("--timeline", action="store_true", help="also write the per-op timeline")
    p.add_argument("--npu-backend", default=None, choices=["torch", "onnxruntime", "coreml"],
                   help="what runs resident groups on a measured platform (default: torch in process)")
    p.add_argument("--threads", type=int, default=None,
                   help="torch intra-op threads for the run (default: torch's own choice); recorded per row")
    add_dtype_argument(p)
    p.add_argument("--drift", action="store_true", help="monitor routing drift of the plan variants (drift_* columns)")
    p.add_argument("--draws", type=int, default=200,
                   help="modeled platforms: parameter draws for the 90%% interval columns (*_lo/_hi) (the platform's posterior, else a prior from its sourced alternatives; 0: none; "
                        "default 200)")
    p.add_argument("--out", default="results/run", help="results folder (default results/run; rows never replace earlier rows)")
    p.set_defaults(func=_run)
