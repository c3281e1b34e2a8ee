"""Figures of the simulation layer: the sensitivity tornado and the paper-check comparison. Every value they draw
is modeled (the platform cost model), and each figure says so."""
from __future__ import annotations

import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.ticker import ScalarFormatter


def tornado(res: pd.DataFrame, conclusion: str) -> Figure:
    """One bar per parameter: the ratio range over its alternatives (log axis), the platform's value as a dot, the
    flip line at 1 (left of it the conclusion no longer holds)."""
    base = float(res.loc[res.case == "baseline", "ratio"].iloc[0])
    g = res[res.case != "baseline"].groupby("knob").ratio.agg(["min", "max"])
    g = g.assign(span=np.log(g["max"] / g["min"]).abs() + np.abs(np.log(g[["min", "max"]].div(base))).max(1))
    g = g.sort_values("span")
    fig = Figure(figsize=(7.5, 0.42 * len(g) + 1.6), layout="constrained")
    ax = fig.add_subplot()
    y = np.arange(len(g))
    lo, hi = np.minimum(g["min"], base), np.maximum(g["max"], base)
    flips = [(a > 1) != (base > 1) or (b > 1) != (base > 1) for a, b in zip(g["min"], g["max"])]
    ax.barh(y, hi - lo, left=lo, color=["tab:red" if f else "tab:blue" for f in flips], alpha=0.7)
    ax.scatter(np.full(len(g), base), y, s=12, color="0.2", zorder=3)     # a knob with no effect still shows
    ax.set_xlim(min(float(lo.min()), 1.0) / 1.15, max(float(hi.max()), 1.0) * 1.15)
    ax.axvline(1.0, color="black", lw=1.2, ls="--", label="flip (ratio 1)")
    ax.axvline(base, color="0.4", lw=1, label=f"platform's values ({base:.2f})")
    ax.set_yticks(y, [k.replace("*", "all (low/high corner)") for k in g.index], fontsize=8)
    ax.set_xscale("log")
    ax.xaxis.set_major_formatter(ScalarFormatter())
    ax.xaxis.set_minor_formatter(ScalarFormatter())
    ax.tick_params(axis="x", which="both", labelsize=7)
    ax.set_xlabel("ratio (> 1: the conclusion holds) — modeled")
    ax.set_title(f"{conclusion}\n(red: an alternative flips it; modeled, {res.geometry.iloc[0]} on "
                 f"{res.platform.iloc[0]})", fontsize=9)
    ax.legend(fontsize=7, loc="best")
    return fig


def paper_check_figure(table: pd.DataFrame) -> Figure:
    """Modeled / paper per quantity (log axis; 1 = agreement), unfitted platform values; a line across each bar
    for its 90 % interval when the table has one (paper_check with draws)."""
    t = table.dropna(subset=["ratio"]).iloc[::-1]
    fig = Figure(figsize=(8, 0.32 * len(t) + 1.4), layout="constrained")     # room for labels, none wasted
    ax = fig.add_subplot()
    y = np.arange(len(t))
    colors = ["tab:green" if 0.8 <= r <= 1.25 else "tab:orange" for r in t["ratio"]]
    # points with a stem from 1 (agreement): on a log axis a bar from zero has no meaning, a distance from 1 has
    ax.hlines(y, 1.0, t["ratio"], colors=colors, lw=1.5)
    ax.scatter(t["ratio"], y, s=16, c=colors, zorder=3)
    if {"modeled_lo", "modeled_hi"} <= set(t.columns):      # the 90 % interval over the parameter draws
        lo, hi = t["modeled_lo"] / t["paper"], t["modeled_hi"] / t["paper"]
        ok = np.isfinite(lo) & np.isfinite(hi) & (lo > 0)
        ax.hlines(y[ok], lo[ok], hi[ok], color="0.15", lw=1.2, label="90 % interval (parameter draws)")
        ax.legend(fontsize=7, loc="lower right")
    ax.axvline(1.0, color="black", lw=1)
    ax.set_xscale("log")
    used = t["npumoe_used_npu"] if "npumoe_used_npu" in t else pd.Series("-", index=t.index)
    labels = [q + (" [npumoe = anemll here]" if str(u).startswith("no") else "") for q, u in zip(t["quantity"], used)]
    ax.set_yticks(y, labels, fontsize=7)
    ax.set_xlabel("modeled / paper (1 = agreement; green within 0.8-1.25x) — model values are modeled")
    ax.set_title("NPUMoE paper numbers vs the workbench's device model (unfitted)", fontsize=9)
    return fig
