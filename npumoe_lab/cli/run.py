"""`npumoe-lab run`: variants x platforms on a workload -> result rows (and the median table, the ablation line)."""
from __future__ import annotations

from contextlib import nullcontext

from npumoe_lab.cli.common import add_dtype_argument, cells, int_list, list_help, name_list, positive
from npumoe_lab.cli.decode_flags import add_decode_arguments, check_decode_args
from npumoe_lab.cli.knob_flags import add_knob_arguments, knobs_from_args
from npumoe_lab.cli.output import writes

WORKLOADS = ("ruler-multikey", "ruler-vt", "fewshot-cls", "lm-heldout", "lm-next", "boolq", "hellaswag")   # = list_workloads()
MEASURED_REPEATS = 3     # = experiments.runner.MEASURED_REPEATS (not imported: torch; tests/test_cli checks)


def check_inputs(a) -> list[dict]:
    """Every flag checked before torch, the model or a plan's weights load (one error naming the flag); returns
    the cells of the run: one per (workload, prompt length, chunk)."""
    for flag, value in (("--n-samples", a.n_samples), ("--repeats", a.repeats), ("--calib-tokens", a.calib_tokens),
                        ("--threads", a.threads)):
        positive(value, flag)
    positive(a.draws, "--draws", 0)
    grid = cells(workload=name_list(a.workload, "--workload"), prompt_len=int_list(a.prompt_len, "--prompt-len"),
                 chunk=int_list(a.chunk, "--chunk"))
    name_list(a.variants, "--variants"), name_list(a.platforms, "--platforms")
    from npumoe_lab.execution.config import check_chunk, check_lengths     # light: no torch
    for c in grid:
        check_chunk(c["chunk"])
        check_lengths(c["prompt_len"], c["chunk"])
    if a.plan is not None:      # a corrupt plan fails now, not after the model load
        from npumoe_lab.planning.plan import Plan  # lazy: the command loads only what it runs
        Plan.load(a.plan)
    return grid


def _loaded(name, dtype):
    """The model and tokenizer, loaded once for every cell."""
    from npumoe_lab.core.cpu_features import resolve_dtype  # lazy: the command loads only what it runs
    from npumoe_lab.models.loading import load_model  # lazy: the command loads only what it runs
    return load_model(name, dtype=resolve_dtype(dtype))


def contended_threads(a) -> int | None:
    """Measured platforms without --threads: the thread count that leaves the cores other processes hold to them,
    said in one line (the rows record it in torch_threads); None: torch's own choice (a quiet host, or modeled)."""
    from npumoe_lab.devices import as_platform  # lazy: the command loads only what it runs
    if not any(as_platform(p).kind == "measured" for p in name_list(a.platforms, "--platforms")):
        return a.threads
    if not getattr(a, "timeline", True):       # said up front, not when validate-device --runs finds no timeline
        print("note: measured rows without --timeline cannot be re-priced by `validate-device --runs` (it needs "
              "each row's op stream); add --timeline for that", flush=True)
    if a.threads is not None:
        return a.threads
    import torch
    from npumoe_lab.devices.hostload import others_cores, uncontended_threads  # lazy: the command loads only what it runs
    others, n_cpus = others_cores()
    wanted = torch.get_num_threads()
    threads = uncontended_threads(others, n_cpus, wanted)
    if threads < wanted:
        print(f"host busy: other processes use {others:.1f} of {n_cpus} cores, so the measured platforms run with "
              f"--threads {threads} (not {wanted}) for every variant alike; give --threads to choose", flush=True)
        return threads
    return None


def _run(a) -> int:
    grid = check_inputs(a)
    check_decode_args(a)                  # before the notes below: bad input is the only line printed
    threads = contended_threads(a)
    # lazy: torch, pandas and the model load only when the command runs (`--help` stays fast)
    import pandas as pd
    from npumoe_lab.experiments.runner import ablation_report, median_table, run_experiment
    from npumoe_lab.results.stats import change_statement
    from npumoe_lab.results.store import write_rows
    knobs = knobs_from_args(a)
    # rows are written after the table is printed (a full disk cannot lose them); timelines are written by the run
    early = a.out if a.timeline else None
    frames, model = [], (_loaded(a.model, a.dtype) if len(grid) > 1 else a.model)
    with writes(a.out, "the rows must be rerun") if early else nullcontext():
        for c in grid:       # one cell of rows per combination; the model loads once
            if len(grid) > 1:
                print(f"cell {c['workload']} prompt_len={c['prompt_len']} chunk={c['chunk']}", flush=True)
            frames.append(run_experiment(model=model, variants=a.variants, platforms=a.platforms, plan=a.plan,
                                         repeats=a.repeats, n_samples=a.n_samples, seed=a.seed, out=early,
                                         calib_workload=a.calib_workload, calib_tokens=a.calib_tokens,
                                         timeline=a.timeline, npu_backend=a.npu_backend, threads=threads,
                                         dtype=a.dtype, drift=a.drift, draws=a.draws,
                                         decode_tokens=a.decode_tokens, decode_policy=a.decode_policy,
                                         model_name=str(a.model), **c, **knobs))
    df = pd.concat(frames, ignore_index=True)
    cols = ["variant", "platform", "timing_source", "ttft_s", "ttft_s_lo", "ttft_s_hi", "ttft_iqr_s", "host_busy",
            "energy_per_token_mj", "cpu_busy_s", "n_npu_calls", "drop_rate", "pad_rate", "tpot_s", "e2e_s", "score",
            "accuracy_delta"]
    for c, cell in zip(grid, frames):    # ttft_s_lo/hi: the 90 % interval (modeled: over parameter draws)
        if len(grid) > 1:
            print(f"\n{c['workload']}, prompt_len {c['prompt_len']}, chunk {c['chunk']}:")
        print(median_table(cell, [k for k in cols if k in cell.columns]))
        for r in cell.drop_duplicates(["variant", "platform"]).itertuples():
            if r.variant != "reference" and pd.notna(getattr(r, "accuracy_lost", None)):
                print(f"  {r.variant} @ {r.platform}: " + change_statement(
                    r.accuracy_lost, r.accuracy_gained, r.n_samples, r.accuracy_loss_bound, r.accuracy_exact_low,
                    r.accuracy_exact_high))
        report = ablation_report(cell)
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
    p.add_argument("--workload", required=True, help=list_help(f"workloads, of: {', '.join(WORKLOADS)}", "none"))
    p.add_argument("--variants", "--variant", dest="variants", default="all",
                   help="comma list of variants, or 'all' (default)")
    p.add_argument("--platforms", "--platform", dest="platforms", default="cpu,m2-max",
                   help="comma list (default cpu,m2-max); see `npumoe-lab platforms`")
    p.add_argument("--prompt-len", default="1024", help=list_help("prompt tokens per sample", 1024))
    p.add_argument("--chunk", default="256", help=list_help("prefill chunk in tokens", 256))
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
