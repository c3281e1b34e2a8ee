"""Figures of notebook 09_adaptive: the drift signal per chunk with the drop rates it explains, and tuner fronts."""
from __future__ import annotations

from npumoe_lab.viz import plot_helpers as pk
from npumoe_lab.viz.plot_helpers import figure


@pk.styled
def drift_figure(report):
    """Left: Jensen-Shannon distance per MoE layer and chunk (measured on the run's routing) with the limit;
    right: the drop rate per chunk (measured) of the static plan, the recalibrated one and the target plan."""
    fig, axes = figure(1, 2, 4.4, 3.0)
    left, right = axes[0]
    d, s = report.drift, report.summary
    for layer, g in d.groupby("layer"):
        left.plot(g["chunk"], g["js"], marker="o", ms=3, label=f"layer {layer}")
    left.axhline(s["drift_limit_js"], color="k", ls="--", lw=0.8, label="limit")
    for r in report.rebuilds:
        for ax in (left, right):
            ax.axvline(r.chunk + 0.5, color="red", lw=0.8, alpha=0.6)
    left.set(xlabel="prefill chunk", ylabel="JS distance to the current plan's calibration",
             title="drift per chunk (measured routing)")
    p = report.per_chunk
    for col, label in (("drop_static", f"{s['calib_domain']} plan, static"),
                       ("drop_adaptive", f"{s['calib_domain']} plan, recalibrate={s['drift_policy']}"),
                       ("drop_direct", f"{s['run_domain']} plan")):
        right.plot(p["chunk"], 100 * p[col], marker="o", ms=3, label=label)
    right.set(xlabel="prefill chunk (red: rebuild adopted after)", ylabel="dropped assignments (%, measured)",
              title=f"lm-heldout/{s['run_domain']}: drop rate per chunk")
    for ax in (left, right):
        ax.legend(fontsize=6)
        ax.title.set_fontsize(8)
    fig.suptitle(f"routing drift — plan calibrated on {s.get('calib_domain')}, prefill of lm-heldout/"
                 f"{s.get('run_domain')} ({s.get('prompt_len')} tokens, chunk {s.get('chunk')}), policy "
                 f"{s.get('drift_policy')}, TTFT modeled on {s.get('platform')}", fontsize=8)
    return fig


@pk.styled
def fronts_figure(fronts: dict):
    """Pareto fronts of the tuner, one per budget label -> front DataFrame (TTFT modeled, drop replayed)."""
    fig, axes = figure(1, 1, 6.4, 3.6)
    ax = axes[0, 0]
    for label, f in fronts.items():
        f = f.sort_values("ttft_ms")
        ax.plot(f["ttft_ms"], 100 * f["drop_rate"], marker="o", ms=4, label=label)
    ax.set(xlabel="TTFT (ms, modeled)", ylabel="dropped assignments (%, replayed routing)",
           title="tuner Pareto fronts (TTFT x drop; energy in the tables)")
    ax.title.set_fontsize(8)
    ax.text(0.0, -0.16, "TTFT: modeled; drop rate: replayed routing (no numerics)", transform=ax.transAxes,
            ha="left", va="top", fontsize=6, color="0.3", gid=pk.SOURCE_GID)     # under the panel: off the data
    # the legend beside the panel: inside, some front always runs under it
    ax.legend(fontsize=6, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0)
    if getattr(fig, "_suptitle", None) is None:
        fig.suptitle("Pareto fronts of the tuner (TTFT x drop, modeled): " + ", ".join(map(str, fronts)), fontsize=8)
    return fig


__all__ = ["drift_figure", "fronts_figure"]
