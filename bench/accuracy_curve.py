"""The speed target: the full accuracy curve (4 tasks x 6 percentiles x 2 saliency rules, n = 300) within
5 minutes on 2 quiet cores (docs/PERFORMANCE.md section 1: not reachable at exact numerics), with a progress bar; writes the curve (curve.csv, samples.csv, ACCURACY.md, figure) too.

Work splits over `--workers` processes (default 2, one torch thread each: one per core; the tiny model's ops are
too small for 2 threads to pay), tasks dealt round-robin. The reference forward of each sample is computed once
and reused by every plan (studies/accuracy_scoring.py), and kept on disk (studies/accuracy_cache.py): a re-run
reads it (the printout says how many references came from the cache; `--no-ref-cache` recomputes them).
`--reference-only`: only the reference scores of the tasks' settings at n (the 0.4-0.9 check; it fills the same
cache). `--partial K`: only K samples per task, and the full
n = 300 time is ESTIMATED from it (the per-sample part scaled by n / K, the fixed part - model load and
calibration - added once); the printout says which numbers are measured and which estimated. On a shared host the
wall time depends on the other processes: the load average and this run's process CPU time are printed with it.
"""
from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import pandas as pd  # noqa: E402

from npumoe_lab.results.atomic import atomic_open  # noqa: E402
from npumoe_lab.studies.accuracy_curve import (DEFAULT_BATCH, DEFAULT_N, DEFAULT_PERCENTILES,  # noqa: E402
                                               DEFAULT_SALIENCY)
from npumoe_lab.workloads.difficulty import DEFAULT_TASKS  # noqa: E402

TARGET_S = 5 * 60


class _QueueBar:
    def __init__(self, q):
        self.q = q

    def update(self, k=1):
        self.q.put(k)

    def close(self):
        pass


def _worker(tasks, kwargs, q, results, parts):
    import resource

    import torch
    torch.set_num_threads(1)
    from npumoe_lab.studies.accuracy_curve import accuracy_curve, reference_scan

    if kwargs.pop("reference_only", False):
        t0 = time.perf_counter()
        rows = reference_scan(workloads=tasks, bar=_QueueBar(q), **kwargs)
        ru = resource.getrusage(resource.RUSAGE_SELF)
        results.put((rows, pd.DataFrame(), time.perf_counter() - t0, ru.ru_utime + ru.ru_stime))
        return

    def keep(rows, samples):      # each finished task on disk at once: a run stopped early keeps them
        if parts is not None:
            parts.mkdir(parents=True, exist_ok=True)
            for name, df in (("curve", rows), ("samples", samples)):
                with atomic_open(parts / f"{name}-{'+'.join(tasks)}.csv", "w") as fh:
                    df.to_csv(fh, index=False)
    t0 = time.perf_counter()
    rows, samples = accuracy_curve(workloads=tasks, bar=_QueueBar(q), on_task=keep, **kwargs)
    ru = resource.getrusage(resource.RUSAGE_SELF)
    results.put((rows, samples, time.perf_counter() - t0, ru.ru_utime + ru.ru_stime))


def _run_workers(groups, kwargs, parts, total, desc, progress):
    """One spawned process per task group, their progress on one bar; (their results, time of the first step)."""
    ctx = mp.get_context("spawn")
    q, results = ctx.Queue(), ctx.Queue()
    procs = [ctx.Process(target=_worker, args=(g, dict(kwargs), q, results, parts)) for g in groups]
    for p in procs:
        p.start()
    bar, done, got, t_first = progress(total=total, desc=desc), 0, [], None
    while len(got) < len(procs):
        while not q.empty():
            k = q.get()
            t_first = t_first or time.perf_counter()
            bar.update(k)
            done += k
        while not results.empty():
            got.append(results.get())
        if any(p.exitcode not in (None, 0) for p in procs):
            raise SystemExit(f"a worker failed (exit codes {[p.exitcode for p in procs]})")
        time.sleep(0.2)
    for p in procs:
        p.join()
    bar.update(total - done)
    bar.close()
    return got, t_first


def _reference_only(args, tasks, kwargs, progress) -> dict:
    """The reference scan alone (studies.accuracy_curve.reference_scan): the chosen settings' reference scores at
    n, into the same cache the curve reads; reference-scan.csv in --out."""
    groups = [tasks[i::args.workers] for i in range(min(args.workers, len(tasks)))]
    load0, t0 = os.getloadavg()[0], time.perf_counter()
    got, _ = _run_workers(groups, kwargs, None, len(tasks) * kwargs["n"], f"reference scan n={kwargs['n']}",
                          progress)
    rows = pd.concat([g[0] for g in got], ignore_index=True)
    rows = rows.set_index("workload").loc[tasks].reset_index()
    if args.out:
        with atomic_open(Path(args.out) / "reference-scan.csv", "w") as fh:
            rows.to_csv(fh, index=False)
    print(rows[["workload", "difficulty", "n", "ref_score", "ref_score_lo", "ref_score_hi", "in_range",
                "ref_cached", "seconds"]].to_string(index=False))
    return dict(n=kwargs["n"], tasks=len(tasks), plans=0, workers=len(groups), wall_s=time.perf_counter() - t0,
                worker_wall_s=[g[2] for g in got], cpu_s=sum(g[3] for g in got), load_before=load0,
                load_after=os.getloadavg()[0], fixed_s=0.0)


def order_rows(rows: pd.DataFrame, tasks, rules) -> pd.DataFrame:
    """The workers' rows in the order asked: task, then saliency rule, then percentile."""
    key = {"workload": {t: i for i, t in enumerate(tasks)}, "saliency": {r: i for i, r in enumerate(rules)}}
    return rows.sort_values(["workload", "saliency", "percentile"],
                            key=lambda c: c.map(key[c.name]) if c.name in key else c).reset_index(drop=True)


def run(args) -> dict:
    from npumoe_lab.execution.calibrate import calibration_profile
    from npumoe_lab.models import load_model
    from npumoe_lab.utils import progress
    if not args.reference_only:
        model, tok = load_model(args.model)      # calibrate once here; the workers load the cached profile
        calibration_profile(model, tok, "mixed", 256, args.calib_tokens, args.seed)
        del model
    tasks = [t for t in args.workload.split(",") if t]
    n = args.partial or args.n
    if args.reference_only:
        kwargs = dict(model=args.model, n=n, seed=args.seed, ref_cache=not args.no_ref_cache, reference_only=True)
        return _reference_only(args, tasks, kwargs, progress)
    kwargs = dict(model=args.model, percentiles=[float(p) for p in args.percentiles.split(",")],
                  saliency=args.saliency.split(","), n=n, platform=args.platform, seed=args.seed,
                  draws=args.draws, ref_cache=not args.no_ref_cache, calib_tokens=args.calib_tokens,
                  batch=args.batch)
    groups = [tasks[i::args.workers] for i in range(min(args.workers, len(tasks)))]
    total = len(tasks) * n * (1 + len(kwargs["percentiles"]) * len(kwargs["saliency"]))
    load0, t0 = os.getloadavg()[0], time.perf_counter()
    parts = Path(args.out) / "parts" if args.out else None
    got, t_first = _run_workers(groups, kwargs, parts, total, f"accuracy curve n={n}", progress)
    wall = time.perf_counter() - t0
    rows = pd.concat([g[0] for g in got], ignore_index=True)
    samples = pd.concat([g[1] for g in got], ignore_index=True)
    rows = order_rows(rows, tasks, kwargs["saliency"])
    report = dict(n=n, tasks=len(tasks), plans=len(kwargs["percentiles"]) * len(kwargs["saliency"]),
                  workers=len(groups), wall_s=wall, worker_wall_s=[g[2] for g in got], cpu_s=sum(g[3] for g in got),
                  load_before=load0, load_after=os.getloadavg()[0],
                  fixed_s=(t_first or time.perf_counter()) - t0,   # start, imports, model load, calibration
                  ref_cached=int(rows.groupby("workload").ref_cached.first().sum()))
    if args.partial:
        # the per-sample part (from the first finished sample on) scales with n; the fixed part does not
        report["estimated_full_s"] = report["fixed_s"] + (wall - report["fixed_s"]) * args.n / n
    if args.out:
        write_outputs(Path(args.out), rows, samples, wall)
    return report


def slice_comparison(args) -> str:
    """On the same slice (K samples of the first task, two plans), interleaved in this process on one thread
    (process CPU seconds: what a quiet core takes; the host may be shared): the one-at-a-time curve, the batched
    one, and the batched one with this CPU's other choice of the group split: where the NPU's fp16 groups split
    expert by expert (emulated fp16), without it (engine.PER_EXPERT_SPLIT = 0, the path before the split); where
    they do not (a native fp16 GEMM: engine.SPLIT_CAST_GROUPS), with it forced on. One at a time and batched are
    asserted equal in every row and per-sample outcome; the other choice differs from them only in fp32 summation
    order inside the split groups (the count of samples whose NLL moved is printed)."""
    import tempfile

    import torch
    torch.set_num_threads(1)
    import npumoe_lab.execution.engine as engine
    from npumoe_lab.models import load_model
    from npumoe_lab.studies.accuracy_curve import accuracy_curve
    tiny = load_model(args.model)
    kw = dict(model=tiny, workloads=(args.workload.split(",")[0],),
              percentiles=[float(p) for p in args.percentiles.split(",")][-2:], saliency=args.saliency.split(",")[:1],
              n=args.slice, platform=args.platform, seed=args.seed, draws=args.draws,
              calib_tokens=args.calib_tokens, ref_cache=tempfile.mkdtemp(prefix="npumoe-slice-"))
    accuracy_curve(batch=args.batch, bar=_NoBar(), **kw)          # references into the cache, warm
    from npumoe_lab.core.numerics import FP16, emulates
    split, cast = engine.PER_EXPERT_SPLIT, engine.SPLIT_CAST_GROUPS
    splits_here = emulates(FP16) or cast                 # does the default split this CPU's fp16 groups?
    other = (0, cast) if splits_here else (split, True)
    runs = {"one": (1, split, cast), "batch": (args.batch, split, cast), "other": (args.batch, *other)}
    cpu, got = {k: [] for k in runs}, {}
    try:
        for r in range(3):
            for name in (list(runs) if r % 2 == 0 else list(runs)[::-1]):
                batch, engine.PER_EXPERT_SPLIT, engine.SPLIT_CAST_GROUPS = runs[name]
                c0 = time.process_time()
                got[name] = accuracy_curve(batch=batch, bar=_NoBar(), **kw)
                cpu[name].append(time.process_time() - c0)
    finally:
        engine.PER_EXPERT_SPLIT, engine.SPLIT_CAST_GROUPS = split, cast
    keep = [c for c in got["one"][0].columns if c not in ("created", "ref_cached")]
    pd.testing.assert_frame_equal(got["one"][0][keep], got["batch"][0][keep], check_exact=True)
    pd.testing.assert_frame_equal(got["one"][1], got["batch"][1], check_exact=True)
    import statistics
    c = {k: statistics.median(v) for k, v in cpu.items()}
    moved = int((got["other"][1].nll != got["batch"][1].nll).sum())
    how = ("without the group split (the split on, by default here" if splits_here else
           "with the group split forced on (native fp16: off by default here")
    return (f"slice {kw['workloads'][0]} n = {args.slice} x {len(kw['percentiles'])} plans (references cached), "
            f"process CPU (medians of 3, interleaved, measured): one at a time {c['one']:.1f} s, batch {args.batch} "
            f"{c['batch']:.1f} s ({c['one'] / c['batch']:.2f}x; rows and per-sample outcomes equal), batch "
            f"{args.batch} {how}) {c['other']:.1f} s (default / other: {c['batch'] / c['other']:.2f}x; "
            f"{moved} of {len(got['batch'][1])} sample NLLs moved in the last bits)")


class _NoBar:
    def update(self, k=1):
        pass

    def close(self):
        pass


def write_outputs(out: Path, rows: pd.DataFrame, samples: pd.DataFrame, wall_s: float | None) -> None:
    """curve.csv, samples.csv, ACCURACY.md and the figure of a finished curve."""
    from npumoe_lab.studies.accuracy_verdict import accuracy_markdown
    from npumoe_lab.viz.accuracy_curve import save_accuracy_curve
    out.mkdir(parents=True, exist_ok=True)
    for name, df in (("curve.csv", rows), ("samples.csv", samples)):
        with atomic_open(out / name, "w") as fh:
            df.to_csv(fh, index=False)
    with atomic_open(out / "ACCURACY.md", "w") as fh:
        fh.write(accuracy_markdown(rows, samples, wall_s))
    save_accuracy_curve(rows, out)


def assemble_parts(args) -> None:
    """The outputs of a run that stopped after its workers finished (or was killed: its finished tasks), from the
    per-task files the workers wrote to --out/parts; `--wall-s`: the run's measured wall time, for ACCURACY.md."""
    parts = Path(args.out) / "parts"
    rows = pd.concat([pd.read_csv(f) for f in sorted(parts.glob("curve-*.csv"))], ignore_index=True)
    samples = pd.concat([pd.read_csv(f) for f in sorted(parts.glob("samples-*.csv"))], ignore_index=True)
    tasks = [t for t in args.workload.split(",") if t in set(rows.workload)]
    write_outputs(Path(args.out), order_rows(rows, tasks, args.saliency.split(",")), samples, args.wall_s)
    print(f"assembled {len(rows)} rows of {', '.join(tasks)} from {parts}")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default="tiny")
    p.add_argument("--workload", default=",".join(DEFAULT_TASKS))
    p.add_argument("--percentiles", default=",".join(f"{x:g}" for x in DEFAULT_PERCENTILES))
    p.add_argument("--saliency", default=",".join(DEFAULT_SALIENCY))
    p.add_argument("--n", type=int, default=DEFAULT_N)
    p.add_argument("--partial", type=int, default=None, help="run K samples per task and estimate the n run")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--platform", default="m2-max")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--calib-tokens", type=int, default=8192, help="calibration tokens of the plans (default 8192)")
    p.add_argument("--draws", type=int, default=200, help="parameter draws of the modeled TTFT's 90 %% interval")
    p.add_argument("--batch", type=int, default=DEFAULT_BATCH,
                   help=f"prompts prefilled together per plan (default {DEFAULT_BATCH}; 1: one at a time)")
    p.add_argument("--slice", type=int, default=0, metavar="K",
                   help="first, on K samples of the first task and two plans: the batched curve vs the one-at-a-time "
                        "one side by side in this process (CPU seconds, equal results asserted); 0: skip")
    p.add_argument("--reference-only", action="store_true",
                   help="only the reference scores of the tasks' settings at n (the informative-range check)")
    p.add_argument("--no-ref-cache", action="store_true",
                   help="recompute the reference forwards (default: read / fill the on-disk cache)")
    p.add_argument("--out", default="results/accuracy-curve")
    p.add_argument("--assemble-parts", action="store_true",
                   help="only write the outputs from --out/parts (a run stopped after its workers finished)")
    p.add_argument("--wall-s", type=float, default=None, help="with --assemble-parts: the run's measured wall time")
    args = p.parse_args(argv)
    if args.assemble_parts:
        assemble_parts(args)
        return 0
    if args.slice:
        print(slice_comparison(args), flush=True)
    r = run(args)
    from npumoe_lab.core.cpu_features import cpu_flags, cpu_model
    simd = " ".join(sorted(f for f in cpu_flags() if f.startswith(("avx", "amx", "fma", "f16c")))) or "none listed"
    print(f"CPU: {cpu_model()} (flags: {simd}); {r['workers']} worker processes x 1 thread; load average {r['load_before']:.1f} before, "
          f"{r['load_after']:.1f} after (a shared host: other processes' load slows this run)")
    print(f"{r['tasks']} tasks x {r['plans']} plans x n = {r['n']}: wall {r['wall_s'] / 60:.1f} min (measured), "
          f"process CPU {r['cpu_s'] / 60:.1f} min (measured, all workers)")
    if "ref_cached" in r:
        print(f"reference records: {r['ref_cached']} of {r['tasks'] * r['n']} read from the on-disk cache (the rest "
              "computed in this run)")
    if "estimated_full_s" in r:
        est = r["estimated_full_s"]
        print(f"n = {args.n} ESTIMATED from this partial run: {est / 60:.1f} min wall = fixed part "
              f"{r['fixed_s']:.0f} s + per-sample part x {args.n}/{r['n']} "
              f"({'within' if est <= TARGET_S else 'OVER'} the 5 min target at this run's host load)")
    elif not args.reference_only:
        print(f"target 5 min: {'met' if r['wall_s'] <= TARGET_S else 'NOT met'} (measured)")
    if args.out:
        print(f"wrote {args.out}/" + ("reference-scan.csv" if args.reference_only
                                      else "curve.csv, samples.csv, ACCURACY.md, accuracy_curve.png/.pdf"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
