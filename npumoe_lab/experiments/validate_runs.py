"""`validate-device --platform DIR/cpu-fit.yaml --runs RUNDIR`: re-price the op stream of every measured run with
the fitted host model and compare with the TTFT the run measured.

A `run --platform cpu --timeline` keeps, per (model, variant, prompt, chunk, sample), every op the engine ran with
its kind, FLOPs, bytes, calls, GEMM shape and shape (timeline.to_frame with ops). The fitted model (cpu_model.py,
parameters from cpu-fit.yaml) prices each op; on the cpu platform both roles share one queue (npu_shares_cpu), so
a prefill's modeled TTFT is the sum of its ops. Per result row the modeled TTFT is the mean over samples (the row's
ttft_s is the mean over samples of one repeat) and is compared with the row's median over repeats
(ttft_median_s). Rows flagged host_busy are excluded from the statistics and counted.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from npumoe_lab.devices import cpu_model
from npumoe_lab.devices.cpu_fit import load_host_model
from npumoe_lab.errors import NpuMoeError
from npumoe_lab.results.atomic import atomic_open
from npumoe_lab.results.store import load_results, load_timelines

KEYS = ["model", "variant", "prompt_len", "chunk"]
TL_KEYS = ["model", "variant", "prompt_len", "run_chunk"]


def reprice_timeline(params: dict, tl: pd.DataFrame) -> float:
    """Modeled seconds of one prefill's events (one queue: their sum), each op priced with the context of the op
    stream around it (cpu_model.annotate), as measure prices its rows."""
    if "kind" not in tl.columns:
        raise NpuMoeError("the timeline has no op kinds (kind/shape/gemm columns); re-run `npumoe-lab run "
                          "--platform cpu --timeline` with this version")
    ops = cpu_model.annotate([cpu_model.op_record(r.kind, r.flops, r.bytes, r.calls, r.gemm, r.shape, chunk=r.chunk,
                                                  layer=r.layer) for r in tl.itertuples()])
    return float(cpu_model.price_many(params, ops).sum())


def validate_runs(platform_path, runs_dir) -> pd.DataFrame:
    """One row per measured result row group: measured and modeled TTFT, their ratio, whether it counts."""
    params = load_host_model(platform_path)
    rows = load_results(runs_dir)
    rows = rows[rows["platform_kind"] == "measured"] if "platform_kind" in rows else rows.iloc[0:0]
    if rows.empty:
        raise NpuMoeError(f"no measured result rows under {runs_dir}; run `npumoe-lab run --platform cpu --timeline`")
    tls = load_timelines(runs_dir)
    missing = [k for k in TL_KEYS + ["kind"] if k not in tls.columns]
    if missing:
        raise NpuMoeError(f"timelines under {runs_dir} lack {', '.join(missing)}; re-run `npumoe-lab run "
                          "--platform cpu --timeline` with this version")
    tls = tls[tls["platform"].isin(rows["platform"].unique())]
    modeled = {}
    for key, g in tls.groupby(TL_KEYS + ["platform", "sample"], sort=False):
        modeled.setdefault(key[:-1], []).append(reprice_timeline(params, g))
    out = []
    for key, g in rows.groupby(KEYS + ["platform"], sort=False):
        per_sample = modeled.get(tuple(key))
        if not per_sample:
            raise NpuMoeError(f"no timeline for the measured rows {dict(zip(KEYS + ['platform'], key))}; "
                              "run with --timeline")
        measured = float(g["ttft_median_s"].iloc[0]) if "ttft_median_s" in g else float(g["ttft_s"].median())
        pred = float(np.mean(per_sample))
        busy = bool(g["host_busy"].any()) if "host_busy" in g else False
        out.append(dict(zip(KEYS + ["platform"], key), measured_ttft_s=measured, modeled_ttft_s=pred,
                        ratio=pred / measured, abs_err=abs(pred / measured - 1), host_busy=busy,
                        host_busy_reason=str(g["host_busy_reason"].iloc[0]) if busy else "",
                        counted=not busy, n_samples=len(per_sample)))
    return pd.DataFrame(out)


def summary(df: pd.DataFrame) -> dict:
    c = df[df["counted"]]
    return {"n_rows": int(len(df)), "n_counted": int(len(c)), "n_host_busy_excluded": int((~df["counted"]).sum()),
            "median_abs_err": float(c["abs_err"].median()) if len(c) else float("nan"),
            "worst_abs_err": float(c["abs_err"].max()) if len(c) else float("nan")}


def report(df: pd.DataFrame, platform_path, runs_dir) -> str:
    """RUNS_VALIDATION.md: the table (measured vs modeled TTFT) and the acceptance numbers."""
    s = summary(df)
    ok = s["n_counted"] > 0 and s["median_abs_err"] <= 0.10 and s["worst_abs_err"] <= 0.25
    lines = [f"# Held-out runs re-priced with {platform_path}", "",
             f"Runs: {runs_dir}. measured = the run's TTFT (median over repeats, MEASURED on this host); "
             "modeled = the fitted host model's price of the same op stream (MODELED).", "",
             "| model | variant | prompt | chunk | measured TTFT (s) | modeled TTFT (s) | modeled/measured | counted |",
             "|---|---|---|---|---|---|---|---|"]
    for r in df.itertuples():
        lines.append(f"| {r.model} | {r.variant} | {r.prompt_len} | {r.chunk} | {r.measured_ttft_s:.4f} | "
                     f"{r.modeled_ttft_s:.4f} | {r.ratio:.3f} | {'yes' if r.counted else 'no: ' + r.host_busy_reason} |")
    lines += ["", f"Counted rows: {s['n_counted']} of {s['n_rows']} ({s['n_host_busy_excluded']} flagged host_busy, "
              f"excluded). Median |error| {100 * s['median_abs_err']:.1f} %, worst {100 * s['worst_abs_err']:.1f} % "
              f"(acceptance on a quiet host: <= 10 % and <= 25 %: {'met' if ok else 'NOT met'})."]
    return "\n".join(lines) + "\n"


def write_validation(df: pd.DataFrame, out_dir, platform_path, runs_dir) -> Path:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    with atomic_open(out / "runs_validation.csv", "w") as fh:
        df.to_csv(fh, index=False)
    with atomic_open(out / "RUNS_VALIDATION.md", "w") as fh:
        fh.write(report(df, platform_path, runs_dir))
    return out / "RUNS_VALIDATION.md"


__all__ = ["validate_runs", "reprice_timeline", "summary", "report", "write_validation"]
