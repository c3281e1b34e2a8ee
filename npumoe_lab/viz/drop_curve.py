"""TTFT (and end-to-end latency, where the rows have it) against npumoe's drop rate over a tier-percentile sweep,
one column of panels per model, the paper's 10-22 % drop band shaded, each baseline a horizontal line (its own
drop rate in the legend) and npumoe one line per platform, labelled by percentile. Rows: sim.operating_point.
percentile_sweep (modeled). A point or line whose plan a real ANE could not hold (rows' `feasible`) is hollow /
dotted and the legend says `infeasible`."""
from __future__ import annotations

import textwrap

import pandas as pd

from npumoe_lab.viz import plot_helpers as pk

METRICS = {"ttft_s": "TTFT (s)", "e2e_s": "end-to-end latency (s)"}
STYLES = ("-", "--", "-.", ":")


@pk.styled
def plot_ttft_vs_drop(rows: pd.DataFrame, band=(0.10, 0.22)):
    metrics = [m for m in METRICS if m in rows.columns and rows[m].notna().any()]
    models = list(dict.fromkeys(rows.model))
    fig, axes = pk.figure(len(metrics), len(models), 4.4 if len(models) > 1 else 6.4, 4.2)
    plats = list(dict.fromkeys(rows.platform))
    sweep = rows[rows.sweep_percentile.notna()]
    base = rows[rows.sweep_percentile.isna()]
    for i, m in enumerate(metrics):
        for j, model in enumerate(models):
            ax = axes[i][j]
            ax.axvspan(100 * band[0], 100 * band[1], color="#f2e6c9", alpha=0.6, lw=0, zorder=0,
                       label="paper's drop band" if i == j == 0 else None)
            for k, plat in enumerate(plats):
                ls = STYLES[k % len(STYLES)]
                s = sweep[(sweep.model == model) & (sweep.platform == plat)].sort_values("drop_rate")
                if len(s):
                    c = pk.color_of("npumoe")
                    ax.plot(100 * s.drop_rate, s[m], ls=ls, color=c, lw=1.3, label=f"npumoe, {plat}")
                    ok = s.feasible.astype(bool) if "feasible" in s else pd.Series(True, index=s.index)
                    ax.plot(100 * s.drop_rate[ok], s[m][ok], "o", ms=3.5, color=c, ls="none")
                    ax.plot(100 * s.drop_rate[~ok], s[m][~ok], "o", ms=3.5, mfc="white", mec=c, ls="none")
                    span = max(1e-9, 100 * (sweep.drop_rate.max() - sweep.drop_rate.min()))
                    last = None
                    for r in s.itertuples() if k == 0 else ():   # percentiles labelled on the first platform's
                        x = 100 * r.drop_rate                      # line, none on top of the previous one
                        if last is None or x - last > 0.1 * span:
                            ax.annotate(f"{r.sweep_percentile:g}", (x, getattr(r, m)), fontsize=5, xytext=(2, 3),
                                        textcoords="offset points", color="0.35")
                            last = x
                for b in base[(base.model == model) & (base.platform == plat)].itertuples():
                    feas = getattr(b, "feasible", True)
                    ax.axhline(getattr(b, m), color=pk.color_of(b.variant), lw=1.0, ls=ls if feas else ":",
                               label=f"{b.variant}, {plat} (drop {b.drop_rate:.1%}"
                                     f"{'' if feas else ', infeasible'})" if i == 0 and j == 0 else None)
            shown = pd.concat([sweep[sweep.model == model][m], base[base.model == model][m]]).dropna()
            if len(shown) and shown.min() > 0 and shown.max() / shown.min() > 5:    # naive-npu far above: log
                ax.set_yscale("log")
            pk.finish(ax, model if i == 0 else "", f"{METRICS[m].split(' (')[0]}: "
                      f"{pk.metric_source(rows[rows.model == model], m)}; drop: replayed routing (no numerics)")
            ax.set_xlabel("npumoe drop rate (%)")
            if j == 0:
                ax.set_ylabel(f"{METRICS[m]}, modeled")
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="outside lower center", ncol=min(4, len(labels)), frameon=False)
    r0 = rows.iloc[0]
    title = (f"{' and '.join(METRICS[m].split(' (')[0] for m in metrics)} against npumoe's drop rate over a "
             f"tier-percentile sweep (point labels: percentile; hollow: a plan over the ANE's program limit). "
             f"Prompt {r0.prompt_len}, chunk {r0.chunk}; every value modeled (platforms {', '.join(plats)})"
             f"; routing {r0.routing_source.split(' (')[0].split(',')[0]}")
    fig.suptitle("\n".join(textwrap.wrap(title, 90 * len(models))), fontsize=7)
    return fig


__all__ = ["plot_ttft_vs_drop"]
