"""paper-check's end-to-end comparison: the paper's end-to-end claims against end-to-end (e2e_s) ratios, its TTFT
claims against TTFT ratios, each modeled sourced and (when given) fitted, with 90 % intervals.

The paper reports end-to-end speedups "up to" 3.86x vs naive NPU, 1.26x vs Core ML CPU and 1.19x vs ANEMLL with about
8 decode tokens run through the prefill pipeline (PAPER.md 5.1), and TTFT speedups 1.32-5.55x against the baselines.
`e2e_table(rows, ...)` takes the simulated rows (and their per-draw metrics) it compares, so the same table is made
at any operating point or knob setting a caller simulates: it computes nothing itself.
"""
from __future__ import annotations

import math

import numpy as np
import pandas as pd

from npumoe_lab.sim.pricing import INTERVAL
from npumoe_lab.sim.report import BASELINES, PAPER_END_TO_END, PAPER_RANGES

KEYS = ["model", "platform", "prompt_len", "chunk"]


def e2e_quantities(df: pd.DataFrame) -> dict:
    """Quantity -> (paper value, modeled value): the highest baseline / npumoe e2e_s over the rows per baseline (the
    paper's end-to-end "up to"), and the lowest and highest baseline / npumoe TTFT (its TTFT range)."""
    out = {}
    if "e2e_s" in df.columns and df.e2e_s.notna().any():
        e = df.pivot_table(index=KEYS, columns="variant", values="e2e_s")
        for b, paper in PAPER_END_TO_END.items():
            if b in e and "npumoe" in e:
                out[f"end-to-end speedup vs {b}, highest (x)"] = (paper, float((e[b] / e["npumoe"]).max()))
    t = df.pivot_table(index=KEYS, columns="variant", values="ttft_s")
    if "npumoe" in t:
        r = pd.concat([t[b] / t["npumoe"] for b in BASELINES if b in t])
        lo, hi = PAPER_RANGES["latency vs baselines"]
        out["TTFT speedup vs baselines, lowest (x)"] = (lo, float(r.min()))
        out["TTFT speedup vs baselines, highest (x)"] = (hi, float(r.max()))
    return out


def _interval(df: pd.DataFrame, metrics: list | None) -> dict:
    """Quantity -> (lo, hi): every quantity recomputed under each parameter draw (metrics: per row, {metric: (D,)}
    with ttft_s and e2e_s), its 5th-95th percentile."""
    if not metrics or any(m is None or "e2e_s" not in m for m in metrics):
        return {}
    D = len(metrics[0]["ttft_s"])
    per = {}
    for i in range(D):
        dfi = df.assign(ttft_s=[m["ttft_s"][i] for m in metrics], e2e_s=[m["e2e_s"][i] for m in metrics])
        for q, (_, v) in e2e_quantities(dfi).items():
            per.setdefault(q, []).append(v)
    return {q: tuple(np.percentile(v, INTERVAL)) for q, v in per.items()}


def e2e_table(rows: pd.DataFrame, metrics: list | None = None, fitted_rows: pd.DataFrame | None = None,
              fitted_metrics: list | None = None) -> pd.DataFrame:
    """One row per quantity: quantity, paper, modeled_sourced [sourced_lo, sourced_hi], and with `fitted_rows`
    modeled_fitted [fitted_lo, fitted_hi]; decode_tokens and decode_policy of the rows compared. `metrics`: the rows'
    metrics under the parameter draws (iter_simulation's StreamResult.draws, in row order), for the intervals."""
    q, iv = e2e_quantities(rows), _interval(rows, metrics)
    fq = e2e_quantities(fitted_rows) if fitted_rows is not None else {}
    fiv = _interval(fitted_rows, fitted_metrics) if fitted_rows is not None else {}
    nan2 = (math.nan, math.nan)
    first = lambda c: rows[c].iloc[0] if c in rows.columns and len(rows) else None   # noqa: E731
    table = pd.DataFrame([dict(quantity=k, paper=p, modeled_sourced=m, sourced_lo=iv.get(k, nan2)[0],
                               sourced_hi=iv.get(k, nan2)[1], modeled_fitted=fq.get(k, (None, math.nan))[1],
                               fitted_lo=fiv.get(k, nan2)[0], fitted_hi=fiv.get(k, nan2)[1])
                          for k, (p, m) in q.items()])
    return table.assign(decode_tokens=first("decode_tokens"), decode_policy=first("decode_policy"),
                        timing_source="modeled")


def e2e_markdown(table: pd.DataFrame, title: str = "End to end") -> str:
    """The table as markdown (values with their 90 % intervals)."""
    def cell(v, lo, hi):
        if v is None or (isinstance(v, float) and math.isnan(v)):
            return "-"
        return f"{v:.3g}" + ("" if math.isnan(lo) else f" [{lo:.3g}-{hi:.3g}]")
    n, pol = (table.decode_tokens.iloc[0], table.decode_policy.iloc[0]) if len(table) else (None, None)
    lines = [f"### {title} (MODELED; {n} decode tokens, decode policy {pol}; end-to-end claims against e2e_s "
             "ratios, TTFT claims against TTFT ratios)", "",
             "| quantity | paper | modeled, sourced [90 %] | modeled, fitted [90 %] |", "|---|---:|---:|---:|"]
    for r in table.itertuples():
        lines.append(f"| {r.quantity} | {r.paper:g} | {cell(r.modeled_sourced, r.sourced_lo, r.sourced_hi)} | "
                     f"{cell(r.modeled_fitted, r.fitted_lo, r.fitted_hi)} |")
    return "\n".join(lines) + "\n"


__all__ = ["e2e_quantities", "e2e_table", "e2e_markdown"]
