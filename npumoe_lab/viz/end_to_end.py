"""End-to-end latency per variant as stacked prefill (TTFT) + decode (e2e_s - ttft_s), the decode policy and token
count in each panel's title; one panel per (model, platform, prompt length, chunk); whiskers: the 90 % interval of
e2e_s over parameter draws where the rows have one. Rows without decode columns (decode_tokens 0) are an error.

The bar's end is the point (every parameter at its sourced value), the whisker the 5-95 % range over draws from the
prior, each parameter log-uniform about that value. A time is a sum (and roofline max) of such terms: a term small at
the point can dominate at the top of its range but only vanish at the bottom, so the interval reaches further above
the point than below. The caption says so, and counts any point outside its own interval (a defect: none expected)."""
from __future__ import annotations

import textwrap

from matplotlib.figure import Figure
import pandas as pd

from npumoe_lab.errors import NpuMoeError
from npumoe_lab.viz import figcheck
from npumoe_lab.viz.plot_helpers import VARIANT_ORDER, finish

PANEL = ["model", "platform", "prompt_len", "chunk"]


def plot_e2e(df: pd.DataFrame):
    """The figure (matplotlib Figure) of the rows' e2e_s stacked as prefill + decode per variant (medians)."""
    if "e2e_s" not in df.columns or df["e2e_s"].isna().all():
        raise NpuMoeError("the rows have no e2e_s: run or simulate with --decode-tokens N >= 1 (default 8)")
    keys = [k for k in PANEL if k in df.columns]
    panels = list(df.groupby(keys, sort=True)) if keys else [((), df)]
    lines = textwrap.wrap(interval_note(df), 120)
    caption = 0.1 * len(lines) + (0.05 if lines else 0)           # inches of caption text under the panels...
    caption += 0.3                                                # and the legend's row
    height = 0.35 * len(VARIANT_ORDER) * len(panels) + 1.2 + caption
    fig = Figure(figsize=(6.4, height))        # not pyplot's: a notebook shows it once, where it is displayed
    axes = fig.subplots(len(panels), 1, squeeze=False)
    for ax, (key, sub) in zip(axes[:, 0], panels):
        cols = ["ttft_s", "e2e_s"] + [c for c in ("e2e_s_lo", "e2e_s_hi") if c in sub.columns]
        m = sub.groupby("variant")[cols].median()
        m = m.reindex([v for v in VARIANT_ORDER if v in m.index] + [v for v in m.index if v not in VARIANT_ORDER])
        y = range(len(m))
        ax.barh(y, m.ttft_s, color="#4c72b0", label="prefill (TTFT)")
        ax.barh(y, m.e2e_s - m.ttft_s, left=m.ttft_s, color="#dd8452", label="decode")
        if "e2e_s_lo" in m:
            ax.errorbar(m.e2e_s, y, xerr=[(m.e2e_s - m.e2e_s_lo).clip(lower=0), (m.e2e_s_hi - m.e2e_s).clip(lower=0)],
                        fmt="none", ecolor="black", lw=0.8, capsize=2, label="e2e 90 % interval (draws)")
        ax.set_yticks(list(y), m.index)
        ax.invert_yaxis()
        src = "/".join(sorted(sub["e2e_source"].dropna().unique())) if "e2e_source" in sub else "?"
        key = key if isinstance(key, tuple) else (key,)
        where = ", ".join(f"{k} {v}" for k, v in zip(keys, key))
        finish(ax, f"{where}; {int(sub.decode_tokens.iloc[0])} decode tokens, policy {sub.decode_policy.iloc[0]}",
               f"e2e {src.upper()}")
        ax.set_xlabel("end-to-end latency (s)", fontsize=8)
        ax.tick_params(labelsize=7)
    handles, labels = axes[0, 0].get_legend_handles_labels()     # under the panels, above the caption: off the bars
    fig.legend(handles, labels, fontsize=7, ncol=3, loc="lower center", bbox_to_anchor=(0.5, (caption - 0.25) / height))
    fig.suptitle("End-to-end latency per variant: prefill (TTFT) + decode steps", fontsize=9)
    if lines:
        fig.text(0.01, 0.01, "\n".join(lines), fontsize=6, va="bottom", ha="left")
    fig.tight_layout(rect=(0, caption / height, 1, 1))
    figcheck.record("plot_e2e", fig)
    return fig


def points_outside(df: pd.DataFrame, col: str = "e2e_s"):
    """Rows whose point lies outside its own 90 % interval (a relative 1e-9 of rounding allowed)."""
    lo, hi = f"{col}_lo", f"{col}_hi"
    if lo not in df or hi not in df:
        return df.iloc[:0]
    ok = df[lo].isna() | ((df[col] >= df[lo] * (1 - 1e-9)) & (df[col] <= df[hi] * (1 + 1e-9)))
    return df[~ok]


def interval_note(df: pd.DataFrame) -> str:
    """The caption of the whiskers: what they are, why they sit asymmetric, and any point outside its interval."""
    if "e2e_s_lo" not in df or df["e2e_s_lo"].isna().all():
        return ""
    out = points_outside(df)
    bad = (f" {len(out)} row(s) have their point OUTSIDE the interval ({', '.join(sorted(set(out.variant)))}): "
           "a defect, report it." if len(out) else " Every point lies inside its own interval.")
    return ("Bar end: the point (every device parameter at its sourced value). Whisker: the 90 % interval over "
            "parameter draws, each log-uniform about its sourced value (MODELED). Times are sums and roofline maxima "
            "of such terms: a term small at the point can dominate at the top of its range but only vanish at the "
            "bottom, so the whisker reaches further above the bar than below." + bad)


__all__ = ["interval_note", "plot_e2e", "points_outside"]
