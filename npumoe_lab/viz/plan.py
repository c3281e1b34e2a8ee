"""Figures of one plan (the explorer's panels): capacity against calibrated load, the group/residency map, and a
plan's modeled prefill metrics next to the baselines. Each returns a matplotlib Figure built without pyplot."""
from __future__ import annotations

import numpy as np
import pandas as pd

from npumoe_lab.viz.plot_helpers import SOURCE_GID, style

NPU, CPU, KEPT, PAD, DROP = "#029e73", "#de8f05", "#0173b2", "#c8c8c8", "#b2182b"
METRICS = (("ttft_s", "TTFT (ms)", 1e3, True), ("energy_per_token_mj", "energy (mJ/token)", 1.0, True),
           ("cpu_cycles", "CPU cycles (10⁶)", 1e-6, True), ("drop_rate", "dropped (% assignments)", 100.0, False),
           ("pad_rate", "padding (% NPU slots)", 100.0, False))


def load_stats(plan, profile, layer: int) -> pd.DataFrame:
    """Per expert of `layer` (most loaded first): mean calibrated load per chunk, capacity, the mean kept, padded
    and dropped rows per chunk under that capacity, and whether the expert's group is resident (NPU)."""
    lp = plan.layer_plan(layer)
    counts = profile.count_matrix(layer).astype(float)
    E = lp["n_experts"]
    counts = np.pad(counts, ((0, E - counts.shape[0]), (0, 0)))
    cap = np.asarray(lp["capacity"], dtype=float)[:, None]
    df = pd.DataFrame({"expert": np.arange(E), "load": counts.mean(1), "capacity": cap[:, 0],
                       "kept": np.minimum(counts, cap).mean(1), "padded": np.maximum(cap - counts, 0).mean(1),
                       "dropped": np.maximum(counts - cap, 0).mean(1), "resident": plan.resident_mask(layer),
                       "tier": lp["tier"]})
    return df.sort_values(["load", "expert"], ascending=[False, True]).reset_index(drop=True)


def capacity_vs_load(plan, profile, layer: int, width: float = 6.0):
    """Bars per expert of one layer: NPU experts = capacity split into kept (blue) and padding (grey), dropped load
    above the capacity (red); CPU experts (cold, run at their actual load) = their load (orange)."""
    with style():
        from matplotlib.figure import Figure
        from matplotlib.patches import Patch
        st = load_stats(plan, profile, layer)
        fig = Figure(figsize=(width, 2.5), layout="constrained")
        ax = fig.subplots()
        x, npu = np.arange(len(st)), st["resident"].to_numpy()
        ax.bar(x[npu], st["kept"][npu], 0.85, color=KEPT)
        ax.bar(x[npu], st["padded"][npu], 0.85, bottom=st["kept"][npu], color=PAD, hatch="///", edgecolor="white",
               linewidth=0)
        ax.bar(x[npu], st["dropped"][npu], 0.85, bottom=st["capacity"][npu], color=DROP)
        ax.bar(x[~npu], st["load"][~npu], 0.85, color=CPU)
        ax.set_xlim(-0.7, len(st) - 0.3)
        ax.set_xlabel("expert (most loaded first)", fontsize=7)
        ax.set_ylabel(f"tokens per chunk of {plan.chunk}", fontsize=7)
        ax.tick_params(labelsize=6)
        # cold experts run at their actual load: only resident ones drop or pad (unlike the plan's expectations,
        # which price every expert's capacity)
        drop = st["dropped"][npu].sum() / max(st["load"].sum(), 1e-12)
        pad = st["padded"][npu].sum() / max(st["capacity"][npu].sum(), 1e-12)
        ax.set_title(f"layer {layer}: capacity vs calibrated load · expected drop {100 * drop:.1f} % of assignments"
                     f" · padding {100 * pad:.0f} % of NPU slots", fontsize=7.5)
        handles = [Patch(color=KEPT, label="kept (NPU)"), Patch(facecolor=PAD, hatch="///", label="padding"),
                   Patch(color=DROP, label="dropped (over capacity)"), Patch(color=CPU, label="cold: CPU, actual load")]
        fig.legend(handles=handles, loc="outside right upper", fontsize=6, frameon=False)
        return fig


def group_map(plan, width: float = 6.0):
    """One row per MoE layer, its groups in buffer order: NPU-resident groups as their static rows (G x C, darker =
    higher capacity tier), CPU groups as the tokens they expect per chunk (hatched)."""
    with style():
        from matplotlib.figure import Figure
        from matplotlib.patches import Patch
        layers = plan.layers
        fig = Figure(figsize=(width, 0.9 + min(0.16 * len(layers), 3.6)), layout="constrained")   # 48 layers fit
        ax = fig.subplots()
        from matplotlib.colors import to_rgba
        tiers = max(len(lp["tier_capacities"]) for lp in layers)
        bars = {True: [], False: []}            # resident -> (row, left, width, colour); one barh call per device
        for r, lp in enumerate(layers):
            x = 0.0
            for g in lp["groups"]:
                if g["resident"]:               # larger tiers (lower index) darker
                    w, color = len(g["experts"]) * g["capacity"], to_rgba(NPU, 1.0 - 0.55 * g["tier"] / max(tiers, 2))
                else:
                    w, color = g["expected_tokens"], to_rgba(CPU, 0.9)
                bars[bool(g["resident"])].append((r, x, w, color))
                x += w
        for resident, b in bars.items():
            if b:
                r, left, w, colors = zip(*b)
                ax.barh(r, w, left=left, height=0.8, color=colors, hatch=None if resident else "////",
                        edgecolor="white", linewidth=0.5)
        ax.set_yticks(range(len(layers)), [str(lp["layer"]) for lp in layers],
                      fontsize=5.5 if len(layers) > 12 else 6.5)
        if len(layers) > 24:
            for lbl in ax.get_yticklabels()[1::2]:
                lbl.set_visible(False)
        ax.invert_yaxis()
        ax.set_ylabel("MoE layer", fontsize=7)
        ax.set_xlabel("rows per chunk (NPU: static G×C slots; CPU: expected tokens)", fontsize=7)
        ax.tick_params(axis="x", labelsize=6)
        ax.grid(axis="y", visible=False)
        n_npu = sum(g["resident"] for lp in layers for g in lp["groups"])
        n_all = sum(len(lp["groups"]) for lp in layers)
        ax.set_title(f"groups and residency: {n_npu} of {n_all} groups resident on the NPU", fontsize=7.5)
        handles = [Patch(color=NPU, label="NPU group (darker: larger tier)"),
                   Patch(facecolor=CPU, hatch="////", label="CPU (cold) group")]
        fig.legend(handles=handles, loc="outside right upper", fontsize=6, frameon=False)
        return fig


def metrics_vs_baselines(rows: pd.DataFrame, source: str, current: str = "this plan", width: float = 9.0):
    """Horizontal bars per configuration (rows: `configuration` + the METRICS columns), the current plan
    highlighted. `source`: the 'modeled (platform X)' label of the time/energy panels."""
    with style():
        from matplotlib.figure import Figure
        fig = Figure(figsize=(width, 0.6 + 0.22 * len(rows)), layout="constrained")
        axes = fig.subplots(1, len(METRICS), sharey=True)
        names = list(rows["configuration"])
        colors = [NPU if n == current else "0.7" for n in names]
        for ax, (col, label, scale, timed) in zip(axes, METRICS):
            vals = rows[col].to_numpy(dtype=float) * scale
            ax.barh(range(len(names)), vals, color=colors)
            ax.set_xlabel(label, fontsize=6.5)
            ax.tick_params(labelsize=6)
            ax.grid(axis="y", visible=False)
            ax.set_xlim(0, max(vals.max(), 1e-12) * 1.35)
            i = names.index(current)
            ax.text(vals[i], i, f" {vals[i]:.3g}", va="center", ha="left", fontsize=6, color="black")
            if timed:
                ax.text(0.0, 1.02, source, transform=ax.transAxes, fontsize=5, color="0.3", gid=SOURCE_GID,
                        ha="left", va="bottom")
        axes[0].set_yticks(range(len(names)), names, fontsize=6.5)
        axes[0].invert_yaxis()
        return fig


__all__ = ["capacity_vs_load", "group_map", "metrics_vs_baselines", "load_stats"]
