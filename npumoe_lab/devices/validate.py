"""`validate-device`: predict every measurement row of a platform's chip and compare with what was measured.

Each row becomes one OpCost (workload.row_op) priced by the platform's DeviceModel for the row's device and path
(`DeviceModel.for_path`), exactly as a simulation prices ops; power rows compare the role's modeled power.
Where the platform carries a posterior (a fit-device YAML), the 5/95 % predictive interval comes from its draws
priced in one vectorised pass (price.py) with the fitted log-noise added: `covered` says whether the measured
value lies inside. Works for any platform, sourced or fitted; rows of other chips are counted, not priced.

Writes validation.csv, VALIDATION.md (median and worst fold error per role and kind; coverage on validate rows)
and validation.png (log-log predicted vs measured, fit and validate rows marked). Every predicted value is
modeled; every measured value is a published measurement (source in the row).
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from npumoe_lab.errors import NpuMoeError
from npumoe_lab.devices.fit import RowSet, row_group
from npumoe_lab.devices.graph_cost import call_power
from npumoe_lab.devices.measurements import load_measurements
from npumoe_lab.devices.platform import resolve_platform
from npumoe_lab.devices.price import platform_params, predictive_sigma, with_draws, with_noise
from npumoe_lab.devices.workload import row_op

CSV_COLUMNS = ("id", "role", "kind", "chip", "device", "path", "confidence", "measured_s", "predicted_s",
               "measured_w", "predicted_w", "ratio", "fold", "predicted_lo", "predicted_hi", "covered", "source_ref")


def modeled_power(dev, op) -> float:
    """Modeled watts of a power row's work (graph_cost.call_power at the modeled time)."""
    return call_power(dev, op, dev.estimate(op))


def predict(platform, rows: pd.DataFrame, seed: int = 0) -> pd.DataFrame:
    """One line per row: measured, modeled, ratio = modeled / measured, fold = max(ratio, 1/ratio), and the
    5/95 % predictive interval where the platform has a posterior."""
    out = []
    for r in rows.itertuples():
        power = pd.isna(r.measured_s)
        dev, op = platform.device(r.device).for_path(r.path), row_op(r)
        pred = modeled_power(dev, op) if power else dev.estimate(op)
        meas = r.power_w if power else r.measured_s
        out.append({"id": r.id, "role": r.role, "kind": r.kind, "chip": r.chip, "device": r.device, "path": r.path,
                    "confidence": r.confidence, "measured_s": np.nan if power else meas,
                    "predicted_s": np.nan if power else pred, "measured_w": meas if power else np.nan,
                    "predicted_w": pred if power else np.nan, "ratio": pred / meas,
                    "source_ref": r.source_ref})
    res = pd.DataFrame(out, columns=[c for c in CSV_COLUMNS if c not in ("fold", "predicted_lo", "predicted_hi",
                                                                         "covered")])
    res["fold"] = np.maximum(res.ratio, 1 / res.ratio)
    res["predicted_lo"], res["predicted_hi"], res["covered"] = np.nan, np.nan, pd.NA
    post = platform.posterior
    if post and len(rows):
        lo, hi = _interval(platform, rows.reset_index(drop=True), post, seed)
        res["predicted_lo"], res["predicted_hi"] = lo, hi
        meas = np.where(res.measured_s.notna(), res.measured_s, res.measured_w)
        res["covered"] = (meas >= lo) & (meas <= hi)
    return res[list(CSV_COLUMNS)]


def _interval(platform, rows, post, seed):
    """5/95 % of the posterior predictive: each draw's prediction times exp(sigma * z / weight), sigma = the fitted
    noise for a row whose device/kind group was fitted, else at least the cross-validated transfer sigma
    (price.predictive_sigma); L rows count with twice the noise (fit.CONF_SIGMA)."""
    draws = np.asarray(post["draws"], dtype=float)
    base = platform_params(platform)
    params = with_draws(base, post["params"], draws)
    rs = RowSet.of(rows)
    pred = rs.predicted(params)                                         # (S, rows)
    # a whole-model power row predicts watts with the power model the fit rows of kind power test: its noise is
    # theirs (the fit noise), not the transfer sigma of times (decided 2026-12-03 after a first look at these
    # rows' intervals, 48x wide on the M4 Max; docs/sources/DEVICE_MODEL.md §8)
    sigma = predictive_sigma(post, [row_group(d, "power" if k == "model_power" else k)
                                    for d, k in zip(rows.device, rows.kind)])
    pred = with_noise(pred, sigma / rs.weight, seed)
    return np.percentile(pred, 5, axis=0), np.percentile(pred, 95, axis=0)


# the goals of a fitted Apple platform on its whole-model validate rows (docs/DEVICE_MODEL_GUIDE.md)
GOALS = {"median fold": 1.25, "worst fold": 2.0, "interval width (hi/lo, median)": 4.0, "coverage": 0.80}


def role_scores(g: pd.DataFrame) -> dict:
    """Median fold, worst fold, median interval width (hi/lo) and coverage of a set of rows (NaN where the rows
    have no interval)."""
    width = (g.predicted_hi / g.predicted_lo).median() if g.predicted_lo.notna().any() else np.nan
    cov = g.covered.astype(bool).mean() if g.covered.notna().any() else np.nan
    return {"median fold": float(g.fold.median()), "worst fold": float(g.fold.max()),
            "interval width (hi/lo, median)": float(width), "coverage": float(cov)}


def goal_lines(res: pd.DataFrame) -> list[str]:
    """Per role: the four scores beside their goals, met or not; then, for a missed goal on validate rows, the
    rows that miss it (what holds is reported; nothing is tuned to it)."""
    lines = ["| role | rows | median fold (goal <= 1.25x) | worst fold (<= 2x) | interval width hi/lo, median "
             "(<= 4x) | coverage (>= 80 %) |", "|---|---|---|---|---|---|"]

    def cell(name, v):
        if np.isnan(v):
            return "-"
        ok = v >= GOALS[name] if name == "coverage" else v <= GOALS[name]
        return (f"{v:.0%}" if name == "coverage" else f"{v:.2f}x") + (" met" if ok else " NOT met")
    what = res.role + np.where(res.measured_w.notna(), " (watts)", " (time)")
    for role, g in res.groupby(what, sort=True):
        s = role_scores(g)
        lines.append(f"| {role} | {len(g)} | " + " | ".join(cell(k, s[k]) for k in GOALS) + " |")
    val = res[(res.role == "validate") & res.measured_s.notna()]        # the goals are on whole-model times
    if len(val):
        s = role_scores(val)
        missed = []
        if s["worst fold"] > GOALS["worst fold"]:
            missed += [f"{r.id} fold {r.fold:.2f}x (ratio {r.ratio:.2f})" for r in val.itertuples()
                       if r.fold > GOALS["worst fold"]]
        if not np.isnan(s["interval width (hi/lo, median)"]) and s["interval width (hi/lo, median)"] > 4.0:
            missed += [f"{r.id} interval {r.predicted_hi / r.predicted_lo:.1f}x wide" for r in val.itertuples()
                       if r.predicted_hi / r.predicted_lo > 4.0]
        if not np.isnan(s["coverage"]) and s["coverage"] < GOALS["coverage"]:
            missed += [f"{r.id} measured outside [{r.predicted_lo:.3g}, {r.predicted_hi:.3g}]"
                       for r in val.itertuples() if r.covered is False or r.covered == False]  # noqa: E712
        if s["median fold"] > GOALS["median fold"]:
            missed.append(f"median fold {s['median fold']:.2f}x over {len(val)} validate rows")
        lines += ["", "Validate time rows that miss a goal: " + ("; ".join(missed) if missed else "none") + "."]
    return lines


def summary(res: pd.DataFrame, platform, skipped: int, source: str) -> str:
    lines = [f"# Device-model validation: {platform.name} (chip {platform.chip})", "",
             f"Measurements: {source}; {len(res)} rows of this chip priced, {skipped} rows of other chips not "
             "priced. Predicted values are **modeled** by the platform; measured values are **published "
             "measurements** (source per row in validation.csv). fold = max(predicted/measured, "
             "measured/predicted); |error| = |predicted/measured - 1|.", "",
             "| role | kind | rows | median fold | worst fold | median abs error | worst row |", "|---|---|---|---|---|---|---|"]
    for (role, kind), g in res.groupby(["role", "kind"], sort=True):
        w = g.loc[g.fold.idxmax()]
        lines.append(f"| {role} | {kind} | {len(g)} | {g.fold.median():.2f}x | {g.fold.max():.2f}x | "
                     f"{(g.ratio - 1).abs().median():.1%} | {w.id} ({w.ratio:.2f}) |")
    lines += ["", "| role | rows | median fold | worst fold | median abs error | median ratio |", "|---|---|---|---|---|---|"]
    for role, g in res.groupby("role", sort=True):
        lines.append(f"| {role} | {len(g)} | {g.fold.median():.2f}x | {g.fold.max():.2f}x | "
                     f"{(g.ratio - 1).abs().median():.1%} | {g.ratio.median():.2f} |")
    lines += ["", "Goals (fit rows are not held out: their scores only show the fit):", ""] + goal_lines(res)
    val = res[res.role == "validate"]
    if res.covered.notna().any() and len(val):
        cov = val.covered.astype(bool).mean()
        lines += ["", f"Coverage of the 90 % posterior predictive interval on validate rows: "
                      f"{int(val.covered.astype(bool).sum())} of {len(val)} ({cov:.0%}; goal >= 80 %)."]
        post = platform.posterior
        t = post.get("transfer_sigma_log")
        lines += ["", "Interval: parameter draws of the posterior x exp(sigma z); sigma = the fitted log noise "
                      f"(median {np.median(post['sigma_log']):.3f}) for rows of a fitted device/kind group "
                      f"({', '.join(post.get('fitted_groups') or []) or 'none recorded'}), and at least the "
                      + (f"transfer sigma {t:.3f} (leave-one-group-out cross-validation on fit rows only: "
                         f"{post.get('transfer_sigma_method', '')}) for every other row"
                         if t is not None else "fitted noise for every other row too (no transfer sigma: "
                                               "these intervals are too narrow for unfitted kinds of work)")
                      + "; L rows with twice the noise."]
    elif len(val):
        lines += ["", "No posterior on this platform (sourced values): no intervals, no coverage."]
    return "\n".join(lines) + "\n"


def figure(res: pd.DataFrame, platform):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    t = res[res.measured_s.notna()]
    fig, ax = plt.subplots(figsize=(6.4, 5.6))
    for role, marker, color in (("fit", "o", "tab:blue"), ("validate", "^", "tab:red")):
        g = t[t.role == role]
        if not len(g):
            continue
        if g.predicted_lo.notna().any():
            ax.errorbar(g.measured_s, g.predicted_s, yerr=[np.maximum(g.predicted_s - g.predicted_lo, 0),
                                                           np.maximum(g.predicted_hi - g.predicted_s, 0)],
                        fmt="none", ecolor=color, alpha=0.35, lw=1)
        ax.scatter(g.measured_s, g.predicted_s, marker=marker, color=color, label=f"{role} rows ({len(g)})",
                   zorder=3)
    if len(t):
        lo, hi = t[["measured_s", "predicted_s"]].min().min() / 2, t[["measured_s", "predicted_s"]].max().max() * 2
        xs = np.array([lo, hi])
        ax.plot(xs, xs, "k-", lw=1, label="predicted = measured")
        ax.plot(xs, 2 * xs, "k:", lw=1, label="2x off")
        ax.plot(xs, xs / 2, "k:", lw=1)
        ax.set_xlim(lo, hi)
        ax.set_ylim(lo, hi)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("measured time per row [s] (published)")
    ax.set_ylabel("predicted time [s] (modeled)")
    ax.set_title(f"{platform.name}: modeled vs measured time of {platform.chip} rows\n"
                 "(bars: 90 % posterior predictive)" if res.predicted_lo.notna().any() else
                 f"{platform.name}: modeled vs measured time of {platform.chip} rows")
    ax.legend(loc="upper left", fontsize=8)
    fig.tight_layout()
    return fig


def validate_device(spec, measurements, out: Path | None = None, seed: int = 0) -> tuple[pd.DataFrame, str]:
    platform = resolve_platform(spec)
    df = load_measurements(measurements)
    mine = df[df.chip == platform.chip]
    if mine.empty:
        chips = ", ".join(sorted(df.chip.unique()))
        raise NpuMoeError(f"no measurement rows for chip {platform.chip!r} (platform {platform.name}) in "
                          f"{measurements}; rows exist for {chips}")
    res = predict(platform, mine, seed)
    text = summary(res, platform, len(df) - len(mine), str(measurements))
    if out is None:          # the CLI prints the table first, then writes (validation_figure draws the figure)
        return res, text
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    res.to_csv(out / "validation.csv", index=False)
    (out / "VALIDATION.md").write_text(text)
    fig = figure(res, platform)
    fig.savefig(out / "validation.png", dpi=150)
    return res, text
