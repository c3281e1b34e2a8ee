"""`validate-device --platform DIR/cpu-fit.yaml --runs RUNDIR`: re-price the op stream of every measured run with
the fitted host model and compare with the TTFT the run measured.

A `run --platform cpu --timeline` keeps, per (model, variant, prompt, chunk, sample), every op the engine ran with
its kind, FLOPs, bytes, calls, GEMM shape and shape (timeline.to_frame with ops). The fitted model (cpu_model.py,
parameters from cpu-fit.yaml) prices each op; on the cpu platform both roles share one queue (npu_shares_cpu), so
a prefill's modeled TTFT is the sum of its ops. Per result row the modeled TTFT is the mean over samples (the row's
ttft_s is the mean over samples of one repeat) and is compared with the row's median over repeats
(ttft_median_s). Rows flagged host_busy and runs at another torch thread count than the fit's rows are excluded
from the statistics and counted. The fit's price is scaled by the speed factor: the speed anchor's median reading
over the run's repeats divided by its median over the fit rows, raised to the fit's tracking slope (how far the
error of `measure`'s own prefills against the fit's price followed their anchor, across prefills:
cpu_fit.anchor_tracking, cpu_fit.pricing_slope), for runs of the anchor's geometry (the tiny one,
`anchor_geometry`; hostspeed.py: the speed of its prefills moves by 20-40 % over minutes on these VMs and the
anchor follows it, while the Qwen3 geometry's GEMM-bound prefills barely move and the anchor would only add noise
to them); `fit_price_s` / `unanchored_abs_err` keep the unscaled price. A run's host speed probe is shown beside
the fit rows' median (`host_speed_note`): a reading, not a
rule (the rule it was, and why it went: hostspeed.py).
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
from scipy.stats import norm

from npumoe_lab.devices import cpu_model
from npumoe_lab.devices.cpu_fit import load_host_model, load_host_uncertainty, pricing_slope
from npumoe_lab.devices.hostspeed import PROBE_LIMIT, anchor_factor, speed_note
from npumoe_lab.errors import NpuMoeError
from npumoe_lab.results.atomic import atomic_open
from npumoe_lab.results.store import normalize

KEYS = ["model", "variant", "prompt_len", "chunk"]
TL_KEYS = ["model", "variant", "prompt_len", "run_chunk"]


def timeline_ops(tl: pd.DataFrame) -> list:
    """The annotated op records of one prefill's events (cpu_model.annotate), as measure prices its rows."""
    if "kind" not in tl.columns:
        raise NpuMoeError("the timeline has no op kinds (kind/shape/gemm columns); re-run `npumoe-lab run "
                          "--platform cpu --timeline` with this version")
    return cpu_model.annotate([cpu_model.op_record(r.kind, r.flops, r.bytes, r.calls, r.gemm, r.shape, chunk=r.chunk,
                                                   layer=r.layer) for r in tl.itertuples()])


def reprice_timeline(params: dict, tl: pd.DataFrame) -> float:
    """Modeled seconds of one prefill's events (one queue: their sum)."""
    return float(cpu_model.price_many(params, timeline_ops(tl)).sum())


def ttft_interval(params: dict, unc: dict | None, samples: list, level: float = 0.90) -> tuple:
    """(point, lo, hi) of a row's modeled TTFT (the mean over its samples' op streams): the fit's posterior
    (Laplace: log-parameter covariance, propagated to log TTFT through its gradient) x the cross-validated
    whole-prefill noise, sd = sqrt(g' C g + sigma_cv^2); lognormal, so the point (the posterior mode's price) is
    inside by construction. unc None (a fit from before intervals): lo = hi = nan."""
    def ttft(p):
        return float(np.mean([cpu_model.price_many(p, ops).sum() for ops in samples]))
    t0 = ttft(params)
    if unc is None:
        return t0, float("nan"), float("nan")
    free, eps = unc["free"], 1e-3
    g = np.array([np.log(ttft({**params, k: params[k] * np.exp(eps)}) / t0) / eps for k in free])
    sd = float(np.sqrt(max(g @ unc["cov_log"] @ g, 0.0) + unc["sigma_log"] ** 2))
    z = float(norm.ppf(0.5 + level / 2))
    return t0, t0 * np.exp(-z * sd), t0 * np.exp(z * sd)


def _run_dirs(runs_dir) -> list:
    """Every folder under runs_dir holding result files (each priced apart: drawn runs may share their keys)."""
    dirs = sorted({f.parent for f in Path(runs_dir).rglob("rows-*.parquet")})
    if not dirs:
        raise NpuMoeError(f"no result rows under {runs_dir}; run `npumoe-lab run --platform cpu --timeline`")
    return dirs


def _read(d: Path, prefix: str, run_dirs=()) -> pd.DataFrame:
    """d's rows (its own files), or its timelines (below it, e.g. d/timelines/, but not below another run dir)."""
    if prefix == "rows":
        files = sorted(d.glob("rows-*.parquet"))
    else:
        others = [o for o in run_dirs if o != d and d in o.parents]
        files = sorted(f for f in d.rglob(f"{prefix}-*.parquet") if not any(o in f.parents for o in others))
    if not files:
        raise NpuMoeError(f"no {prefix} files in {d}; run `npumoe-lab run --platform cpu --timeline`")
    frames = [pd.read_parquet(f).assign(_file=f.name) for f in files]
    return normalize(pd.concat(frames, ignore_index=True))


LEGACY_RUN = "(no run_id)"       # rows and timelines written before runs carried an id


def _with_run_id(df: pd.DataFrame) -> pd.DataFrame:
    ids = df["run_id"] if "run_id" in df else pd.Series(None, index=df.index, dtype=object)
    return df.assign(run_id=ids.where(ids.notna(), LEGACY_RUN).astype(str))


def _check_one_legacy_run(df: pd.DataFrame, keys: list, d: Path) -> None:
    """Rows and timelines without a run id can be paired only when one run wrote each setting's."""
    old = df[df["run_id"] == LEGACY_RUN]
    if old.empty:
        return
    files = old.groupby(keys + ["platform"], sort=False)["_file"].nunique()
    if (files > 1).any():
        key = ", ".join(f"{k} {v}" for k, v in zip(keys + ["platform"], files[files > 1].index[0]))
        raise NpuMoeError(f"{d} holds {int(files.max())} runs of the same settings ({key}) written before runs "
                          "carried a run_id, so their op streams cannot be told apart; move the older run's "
                          f"rows-*.parquet and timelines/timeline-*.parquet out of {d} (or run into an empty folder)")


def _measured_groups(runs_dir):
    """(run dir, key, result rows, [(op records, timeline) per sample]) of every measured result row group. `key`
    ends with the run's id: runs of the same settings in one folder (a command run again into it) are priced apart,
    each with its own op streams."""
    dirs = _run_dirs(runs_dir)
    for d in dirs:
        rows = _read(d, "rows")
        rows = rows[rows["platform_kind"] == "measured"] if "platform_kind" in rows else rows.iloc[0:0]
        if rows.empty:
            continue
        tls = _read(d, "timeline", dirs)
        missing = [k for k in TL_KEYS + ["kind"] if k not in tls.columns]
        if missing:
            raise NpuMoeError(f"timelines in {d} lack {', '.join(missing)}; re-run `npumoe-lab run "
                              "--platform cpu --timeline` with this version")
        rows, tls = _with_run_id(rows), _with_run_id(tls)
        tls = tls[tls["platform"].isin(rows["platform"].unique())]
        _check_one_legacy_run(rows, KEYS, d)
        _check_one_legacy_run(tls, TL_KEYS, d)
        samples = {}
        for key, g in tls.groupby(TL_KEYS + ["platform", "run_id", "sample"], sort=False):
            samples.setdefault(key[:-1], []).append((timeline_ops(g), g))
        for key, g in rows.groupby(KEYS + ["platform", "run_id"], sort=False):
            per_sample = samples.get(tuple(key))
            if not per_sample:
                raise NpuMoeError(f"no timeline for the measured rows {dict(zip(KEYS + ['platform', 'run_id'], key))}"
                                  f" in {d}; run with --timeline")
            yield d, key, g, per_sample


def _measured_ttft(g) -> float:
    return float(g["ttft_median_s"].iloc[0]) if "ttft_median_s" in g else float(g["ttft_s"].median())


def _dtype(g) -> str | None:
    return str(g["dtype"].iloc[0]) if "dtype" in g and pd.notna(g["dtype"].iloc[0]) else None


def validate_runs_by_kind(platform_path, runs_dir, use_anchor: bool = True) -> tuple:
    """(validate_runs' table, op_kind_errors' table) from one pass over the runs (each timeline read and priced
    once). `use_anchor=False`: the fit's price as is (speed_factor 1), for the comparison."""
    load_host_model(platform_path)                         # one clear error before any work
    out, kinds = [], []
    for d, key, g, sampled in _measured_groups(runs_dir):
        per_sample = [ops for ops, _ in sampled]
        dtype = _dtype(g)
        params = load_host_model(platform_path, dtype)
        unc = load_host_uncertainty(platform_path, dtype)
        price, lo, hi = ttft_interval(params, unc, per_sample)
        # the host's speed at the run vs at the fit rows (hostspeed.py's anchor): the fit's price scaled by it
        anchor = float(g["host_anchor_s"].median()) if "host_anchor_s" in g else float("nan")
        same = bool(g["anchor_geometry"].eq(True).all()) if "anchor_geometry" in g else False
        beta = pricing_slope(unc)
        factor = anchor_factor(anchor, (unc or {}).get("anchor_s")) ** beta if use_anchor and same else 1.0
        pred, lo, hi = price * factor, lo * factor, hi * factor
        measured = _measured_ttft(g)
        busy = bool(g["host_busy"].any()) if "host_busy" in g else False
        # a fit prices the thread count it was measured at: a run at another is not comparable (not counted)
        ran = int(g["torch_threads"].iloc[0]) if "torch_threads" in g and pd.notna(g["torch_threads"].iloc[0]) \
            else None
        other_threads = bool(unc and unc.get("threads") and ran and ran != unc["threads"])
        # and the allocator policy (core/host_memory.py): page faults are not in a keep-freed fit's prices
        malloc = str(g["host_malloc"].iloc[0]) if "host_malloc" in g and pd.notna(g["host_malloc"].iloc[0]) else None
        other_malloc = bool(unc and unc.get("malloc") and malloc and malloc != unc["malloc"])
        # the host speed probe beside the fit rows' (hostspeed.py): shown, never a reason not to count
        probe = float(g["host_probe_s"].median()) if "host_probe_s" in g else float("nan")
        speed = speed_note(probe, (unc or {}).get("probe_s") or float("nan"))
        why = str(g["host_busy_reason"].iloc[0]) if busy else \
            (f"ran at {ran} torch threads, the fit's rows at {unc['threads']}" if other_threads else
             f"ran under malloc policy {malloc}, the fit's rows under {unc['malloc']}" if other_malloc else "")
        ident = dict(zip(KEYS + ["platform", "run_id"], key), dtype=dtype or "")
        out.append(dict(ident, workload=str(g["workload"].iloc[0])
                        if "workload" in g else "", measured_ttft_s=measured, modeled_ttft_s=pred,
                        modeled_ttft_lo_s=lo, modeled_ttft_hi_s=hi, covered=bool(lo <= measured <= hi),
                        ratio=pred / measured, abs_err=abs(pred / measured - 1), host_busy=busy,
                        fit_price_s=price, speed_factor=factor, host_anchor_s=anchor,
                        fit_anchor_s=(unc or {}).get("anchor_s") or float("nan"),
                        unanchored_abs_err=abs(price / measured - 1),
                        host_busy_reason=why, host_probe_s=probe,
                        fit_probe_s=(unc or {}).get("probe_s") or float("nan"), host_speed_note=speed,
                        counted=not (busy or other_threads or other_malloc), n_samples=len(per_sample),
                        run_dir=str(d)))
        kinds += _kind_rows(params, sampled, measured, dict(ident, run_dir=str(d), measured_ttft_s=measured), factor)
    if not out:
        raise NpuMoeError(f"no measured result rows under {runs_dir}; run `npumoe-lab run --platform cpu --timeline`")
    return pd.DataFrame(out), pd.DataFrame(kinds)


def validate_runs(platform_path, runs_dir, use_anchor: bool = True) -> pd.DataFrame:
    """One row per measured result row group: measured and modeled TTFT (with its 90 % interval), their ratio,
    whether it counts. Each run is priced with the fit of its own dtype (measure --dtype), scaled by the speed
    anchor's reading at the run over the fit rows' (`speed_factor`; `fit_price_s` is the unscaled price and
    `unanchored_abs_err` its error)."""
    return validate_runs_by_kind(platform_path, runs_dir, use_anchor)[0]


def op_kind_errors(platform_path, runs_dir) -> pd.DataFrame:
    """Where each run's modeled TTFT departs from its measured one, op kind by op kind: per measured row group and
    op kind, the measured seconds of those ops (their timeline durations; the mean over samples of repeat 0) and
    their modeled seconds (the fit of the run's dtype), and their difference over the run's measured TTFT
    (`of_ttft`). One more kind, "(TTFT - ops)", modeled 0: the measured TTFT (median over repeats) minus the
    measured ops' sum (repeat 0's stream, the one priced): the time between ops plus how far repeat 0 ran from
    the median (a large value says the per-kind measured times are repeat 0's, not typical). Summed over the kinds,
    `of_ttft` is the run's error. What the structure discussion of the CPU loop reads (docs/CPU_LOOP.md); a
    reading of runs, never a fit input."""
    return validate_runs_by_kind(platform_path, runs_dir)[1]


def _kind_rows(params: dict, sampled: list, measured_ttft: float, base: dict, factor: float = 1.0) -> list:
    """op_kind_errors' rows of one row group (its samples' timelines and op records; modeled x the speed factor)."""
    per = pd.concat([pd.DataFrame({"kind": tl["kind"].astype(str).to_numpy(),
                                   "measured_s": tl["duration_s"].to_numpy(dtype=float),
                                   "modeled_s": factor * cpu_model.price_many(params, ops)})
                     for ops, tl in sampled])
    by = per.groupby("kind")[["measured_s", "modeled_s"]].sum() / len(sampled)
    by.loc["(TTFT - ops)"] = [measured_ttft - by["measured_s"].sum(), 0.0]
    return [dict(base, kind=k, measured_s=float(r.measured_s), modeled_s=float(r.modeled_s),
                 of_ttft=float((r.modeled_s - r.measured_s) / measured_ttft)) for k, r in by.sort_index().iterrows()]


def summary(df: pd.DataFrame) -> dict:
    c = df[df["counted"]]
    cov = c["covered"] if "covered" in c else pd.Series(dtype=bool)
    has_iv = "modeled_ttft_lo_s" in c and c["modeled_ttft_lo_s"].notna().any()
    return {"n_rows": int(len(df)), "n_counted": int(len(c)), "n_host_busy_excluded": int((~df["counted"]).sum()),
            "median_abs_err": float(c["abs_err"].median()) if len(c) else float("nan"),
            "worst_abs_err": float(c["abs_err"].max()) if len(c) else float("nan"),
            "coverage": float(cov.mean()) if len(c) and has_iv else float("nan"),
            "n_covered": int(cov.sum()) if has_iv else 0,
            "median_width": float((c["modeled_ttft_hi_s"] / c["modeled_ttft_lo_s"]).median()) if len(c) and has_iv
            else float("nan"), **_speed_split(c),
            "median_abs_err_unanchored": float(c["unanchored_abs_err"].median())
            if len(c) and "unanchored_abs_err" in c else float("nan"),
            "worst_abs_err_unanchored": float(c["unanchored_abs_err"].max())
            if len(c) and "unanchored_abs_err" in c else float("nan"),
            "anchored": bool("speed_factor" in c and (c["speed_factor"] != 1.0).any())}


def _speed_split(c: pd.DataFrame) -> dict:
    """How many counted runs read the host speed probe beyond its limit from the fit's, and the median |error| of
    the others: a reading beside the goal (the goal counts every run), since a fit prices the host speed it was
    taken at (docs/CPU_LOOP.md: draws 13 and 14)."""
    off = c["host_speed_note"].fillna("").astype(str) != "" if "host_speed_note" in c else pd.Series(False, c.index)
    steady = c.loc[~off, "abs_err"]
    return {"n_speed_off": int(off.sum()),
            "median_abs_err_speed_steady": float(steady.median()) if len(steady) else float("nan")}


def acceptance(s: dict) -> bool:
    """The loop's goal on a quiet host: median |error| <= 10 %, worst <= 25 %, 90 % coverage >= 80 %."""
    return bool(s["n_counted"] and s["median_abs_err"] <= 0.10 and s["worst_abs_err"] <= 0.25
                and not s["coverage"] < 0.80)


def _probe_cell(r) -> str:
    """The run's measured speed probe beside the fit rows' median (both ms; a reading, not a rule)."""
    ms = lambda v: f"{v * 1e3:.2f}" if np.isfinite(v) else "-"     # noqa: E731
    return f"{ms(r.host_probe_s)} vs {ms(r.fit_probe_s)}"


def _anchor_cell(r) -> str:
    """The speed factor the fit's price was scaled by, then the run's anchor and the fit rows' (ms, measured)."""
    ms = lambda v: f"{v * 1e3:.1f}" if np.isfinite(v) else "-"     # noqa: E731
    a, f = getattr(r, "host_anchor_s", float("nan")), getattr(r, "fit_anchor_s", float("nan"))
    return f"{getattr(r, 'speed_factor', 1.0):.3f} ({ms(a)} / {ms(f)})"


def table_lines(df: pd.DataFrame) -> list:
    lines = ["| model | workload | variant | dtype | prompt | chunk | measured TTFT (s) | modeled TTFT (s) [90 %] | "
             "error | inside | counted | host probe, run vs fit (ms, measured) | speed factor = (anchor run / fit) ** "
             "slope (anchors in ms, measured) |", "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    # a setting run more than once into one folder: each run is its own row, its variant cell names the run
    again = df.duplicated(KEYS + ["platform", "run_dir"], keep=False) if "run_id" in df else [False] * len(df)
    for r, twice in zip(df.itertuples(), again):
        iv = f" [{r.modeled_ttft_lo_s:.4f}, {r.modeled_ttft_hi_s:.4f}]" if np.isfinite(r.modeled_ttft_lo_s) else ""
        variant = f"{r.variant} (run {r.run_id[:8]})" if twice else r.variant
        lines.append(f"| {r.model} | {r.workload} | {variant} | {r.dtype} | {r.prompt_len} | {r.chunk} | "
                     f"{r.measured_ttft_s:.4f} | {r.modeled_ttft_s:.4f}{iv} | {100 * (r.ratio - 1):+.1f} % | "
                     f"{'yes' if r.covered else 'no'} | {'yes' if r.counted else 'no: ' + r.host_busy_reason} | "
                     f"{_probe_cell(r)} | {_anchor_cell(r)} |")
    return lines


def verdict(s: dict) -> str:
    err_ok = bool(s["n_counted"]) and s["median_abs_err"] <= 0.10 and s["worst_abs_err"] <= 0.25
    cov = "no counted rows" if not s["n_counted"] else "no intervals (a fit from before them)" \
        if not np.isfinite(s["coverage"]) else \
        f"{s['n_covered']} of {s['n_counted']} ({100 * s['coverage']:.0f} %; goal >= 80 %: " \
        f"{'met' if s['coverage'] >= 0.80 else 'NOT met'}), median width hi/lo {s['median_width']:.2f}x"
    return (f"Counted rows: {s['n_counted']} of {s['n_rows']} ({s['n_host_busy_excluded']} flagged host_busy, "
            f"excluded). Median |error| {100 * s['median_abs_err']:.1f} %, worst {100 * s['worst_abs_err']:.1f} % "
            f"(goal on a quiet host: <= 10 % and <= 25 %: {'met' if err_ok else 'NOT met'}). Measured TTFT "
            f"inside the modeled 90 % interval: {cov}.{_anchor_sentence(s)}{_speed_sentence(s)}")


def _anchor_sentence(s: dict) -> str:
    if not s.get("anchored") or not np.isfinite(s.get("median_abs_err_unanchored", float("nan"))):
        return ""
    return (f" Modeled = the fit's price x the speed factor (the speed anchor at the run over the fit rows'); the "
            f"fit's price alone: median |error| {100 * s['median_abs_err_unanchored']:.1f} %, worst "
            f"{100 * s['worst_abs_err_unanchored']:.1f} %.")


def _speed_sentence(s: dict) -> str:
    n, counted = s["n_speed_off"], s["n_counted"]
    if not n:
        return ""
    rest = counted - n
    steady = (f"; median |error| of the other {rest}: {100 * s['median_abs_err_speed_steady']:.1f} %" if rest
              else "")
    return (f" {n} of the {counted} counted runs read the host speed probe more than "
            f"{PROBE_LIMIT:.0%} off the fit rows' (their host_speed_note){steady}. A fit prices the "
            "host speed it was taken at; the probe is a reading, not a rule: those runs stay counted (on the CPU "
            "loop's draws 13 and 14 they were the misses, on draw 4 the probe told nothing: docs/CPU_LOOP.md).")


def report(df: pd.DataFrame, platform_path, runs_dir) -> str:
    """RUNS_VALIDATION.md: the table (measured vs modeled TTFT with its interval) and the acceptance numbers."""
    lines = [f"# Held-out runs re-priced with {platform_path}", "",
             f"Runs: {runs_dir}. measured = the run's TTFT (median over repeats, MEASURED on this host); "
             "modeled = the fitted host model's price of the same op stream (MODELED) x the speed factor (the "
             "speed anchor's MEASURED reading at the run over the fit rows' median: hostspeed.py), with its 90 % "
             "interval (the fit's Laplace posterior x its cross-validated whole-prefill noise).", "",
             *table_lines(df), "", verdict(summary(df))]
    return "\n".join(lines) + "\n"


def write_validation(df: pd.DataFrame, out_dir, platform_path, runs_dir,
                     by_kind: pd.DataFrame | None = None) -> Path:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    with atomic_open(out / "runs_validation.csv", "w") as fh:
        df.to_csv(fh, index=False)
    if by_kind is not None:
        with atomic_open(out / "runs_by_op_kind.csv", "w") as fh:
            by_kind.to_csv(fh, index=False)
    with atomic_open(out / "RUNS_VALIDATION.md", "w") as fh:
        fh.write(report(df, platform_path, runs_dir))
    return out / "RUNS_VALIDATION.md"


__all__ = ["validate_runs", "op_kind_errors", "validate_runs_by_kind", "reprice_timeline", "timeline_ops", "ttft_interval", "summary", "acceptance", "verdict",
           "table_lines", "report", "write_validation"]
