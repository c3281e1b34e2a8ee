"""The accuracy-vs-drop figure of `npumoe-lab accuracy`: one panel per task, accuracy change (points) against the
MEASURED drop rate, a band from the exact 95 % bounds, saliency rule by colour (random = the control, grey), the
1.1-point loss line dashed. A second row: prompt-NLL change, the measure that moves when few samples flip."""
from __future__ import annotations

import textwrap
from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.lines import Line2D

from npumoe_lab.viz import plot_helpers as pk

RULE_COLORS = {"weight_x_norm": "#1f77b4", "router_weight": "#2ca02c", "activation_norm": "#9467bd",
               "position": "#ff7f0e", "random": "#7f7f7f"}


@pk.styled
def plot_accuracy_curve(rows: pd.DataFrame, loss_target: float = 0.011):
    tasks = list(dict.fromkeys(rows.workload))
    fig, axes = pk.figure(2, len(tasks), max(2.4, 4.8 / len(tasks)), 2.1)   # one task: a wide panel
    r0 = rows.iloc[0]
    for j, wl in enumerate(tasks):
        g = rows[rows.workload == wl]
        top, bottom = axes[0][j], axes[1][j]
        for rule in dict.fromkeys(g.saliency):
            s = g[g.saliency == rule].sort_values("drop_rate")
            x, c = 100 * s.drop_rate.to_numpy(), RULE_COLORS.get(rule, "k")
            top.fill_between(x, 100 * s.accuracy_exact_low, 100 * s.accuracy_exact_high, color=c, alpha=0.18, lw=0)
            top.plot(x, 100 * s.accuracy_delta, color=c, lw=1.2, label=rule)
            # the verdict at a glance: a filled marker = loss bounded < the target at 95 % (one-sided exact),
            # hollow = not bounded there
            ok = s.loss_under_target.to_numpy(dtype=bool) if "loss_under_target" in s else np.zeros(len(s), bool)
            top.plot(x[ok], 100 * s.accuracy_delta.to_numpy()[ok], "o", ms=4, color=c, ls="none")
            top.plot(x[~ok], 100 * s.accuracy_delta.to_numpy()[~ok], "o", ms=4, mfc="white", mec=c, mew=1.0, ls="none")
            bottom.fill_between(x, s.nll_delta_ci_low, s.nll_delta_ci_high, color=c, alpha=0.18, lw=0)
            bottom.plot(x, s.nll_delta, marker="o", ms=3, color=c, lw=1.2, label=rule)
        for ax in (top, bottom):      # the paper's 10-22 % dropped tokens
            ax.axvspan(10, 22, color="#f2e6c9", alpha=0.5, lw=0, zorder=0,
                       label="paper's drop range" if ax is top else None)
        top.axhline(0, color="0.3", lw=0.6)
        top.axhline(-100 * loss_target, color="#d62728", lw=0.8, ls="--", label=f"-{100 * loss_target:.1f} pts")
        bottom.axhline(0, color="0.3", lw=0.6)
        title = f"{g.difficulty.iloc[0]}; reference {g.ref_score.iloc[0]:.2f}"
        top.set_title(wl + "\n" + "\n".join(textwrap.wrap(title, 34)), fontsize=6.5)
        bottom.set_xlabel("drop rate, measured (%)")
        top.sharex(bottom)
        top.tick_params(labelbottom=False)
        if j == 0:
            top.set_ylabel("accuracy change (pts)\n(exact 95 % bounds)")
            bottom.set_ylabel("prompt NLL change\n(bootstrap 95 % CI)")
    handles, labels = axes[0][0].get_legend_handles_labels()
    handles += [Line2D([], [], marker="o", ms=4, color="0.3", ls="none"),
                Line2D([], [], marker="o", ms=4, mfc="white", mec="0.3", ls="none")]
    labels += [f"loss < {100 * loss_target:.1f} pts (95 %, one-sided exact)", "not bounded there"]
    fig.legend(handles, labels, loc="outside lower center", ncol=len(labels), frameon=False)
    fig.suptitle("\n".join(textwrap.wrap(f"{r0.model}: accuracy vs drop rate of {r0.variant} plans (percentiles "
                 f"{', '.join(f'{p:g}' for p in sorted(rows.percentile.unique()))}), n = {int(r0.n_samples)} "
                 f"per task; prompt {', '.join(str(p) for p in sorted(rows.prompt_len.unique()))} tokens; "
                 f"plans for {r0.platform}", int(42 * max(2.4, 4.8 / len(tasks)) * len(tasks) / 2.4))), fontsize=7)
    return fig


def save_accuracy_curve(rows: pd.DataFrame, folder) -> list:
    fig = plot_accuracy_curve(rows)
    out = []
    for ext in ("png", "pdf"):
        path = Path(folder) / f"accuracy_curve.{ext}"
        fig.savefig(path, dpi=200)
        out.append(path)
    return out
