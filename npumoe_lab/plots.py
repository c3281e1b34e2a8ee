"""Paper figures from result rows (the DataFrame of `experiments.load_results`).

Every figure function takes the results frame and returns a matplotlib Figure built without pyplot (no global
state, renders headless like Agg, still displays inline in Jupyter). Points/bars are medians over `repeat`, error
bars span min..max over repeats. Every panel that shows time or energy carries a "modeled (platform X)" /
"measured (host Y)" label derived from the `timing_source`, `platform` and `host` columns of exactly the rows
it draws: a modeled number is never shown as if measured.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from . import plot_helpers as pk
from .errors import NpuMoeError
from .plot_helpers import FACETS, LABELS, SOURCE_GID, VARIANT_ORDER  # noqa: F401 - public names
from .plots_timeline import timeline  # noqa: F401 - the prefill Gantt chart (plots_timeline.py)

PAPER_ABLATION = {"npumoe-base": 1.00, "npumoe-t": 1.48, "npumoe-tg": 2.11, "npumoe": 2.89}  # §5.8 TTFT speedup


@pk.styled
def plot_baselines(df: pd.DataFrame):
    """Paper main figure: TTFT, energy per token and CPU cycles per variant (fixed variant order)."""
    metrics = pk.available(df, ("ttft_s", "energy_per_token_mj", "cpu_cycles"), "baselines", need=("variant",))
    facets = pk.facets(pk.default_knobs(df.dropna(subset=metrics, how="all")))
    if "platform" in df.columns and df["platform"].nunique() > 1:
        # one row per platform: measured host seconds and modeled milliseconds never share an axis
        facets = [(f"{title} · {plat}", g) for title, sub in facets
                  for plat, g in sub.groupby("platform", sort=True, dropna=False)]
    fig, axes = pk.figure(len(facets), len(metrics), 3.2, 2.6)
    for r, (title, sub) in enumerate(facets):
        for c, metric in enumerate(metrics):
            pk.bars(axes[r][c], pk.stats(sub, metric), metric, title)
    return fig


@pk.styled
def plot_ablation(df: pd.DataFrame):
    """TTFT speedup of npumoe-base/-t/-tg/npumoe over npumoe-base, with the paper's 1.00/1.48/2.11/2.89."""
    pk.available(df, ("ttft_s",), "ablation", need=("variant",))
    sub_all = pk.default_knobs(df[df["variant"].isin(list(PAPER_ABLATION)) & df["ttft_s"].notna()])
    if "npumoe-base" not in set(sub_all["variant"]) or sub_all["variant"].nunique() < 2:
        raise NpuMoeError("figure ablation needs ttft_s rows of npumoe-base and at least one of npumoe-t, "
                          "npumoe-tg, npumoe; run those variants first")
    facets = pk.facets(sub_all)
    fig, axes = pk.figure(1, len(facets), 3.6, 2.8)
    for c, (title, sub) in enumerate(facets):
        st = pk.stats(sub, "ttft_s")
        hue = pk.varying(st, exclude=("variant", *FACETS))  # e.g. prompt_len: each compared to its own base
        base = st.loc[st["variant"] == "npumoe-base", [*hue, "median"]].rename(columns={"median": "base"})
        st = st.merge(base, on=hue, how="left") if hue else st.assign(base=base["base"].iloc[0])
        # speedup = base / t: the fastest repeat gives the highest speedup
        st = st.assign(median=st["base"] / st["median"], lo=st["base"] / st["hi"], hi=st["base"] / st["lo"])
        ax = axes[0][c]
        pk.bars(ax, st.dropna(subset=["median"]), None, title, ylabel="TTFT speedup vs npumoe-base (×)",
                source_rows=sub)
        order = [v for v in PAPER_ABLATION if v in set(st["variant"])]
        ax.scatter(range(len(order)), [PAPER_ABLATION[v] for v in order], marker="_", s=500, linewidths=2,
                   color="black", zorder=4, label="paper (NPUMoE §5.8)")
        ax.axhline(1.0, color="0.5", lw=0.8, ls=":")
        ax.legend(fontsize=5.5, loc="upper left")
    return fig


@pk.styled
def plot_accuracy(df: pd.DataFrame):
    """Accuracy delta vs reference against drop rate; y error = the stored CI when present."""
    pk.available(df, ("accuracy_delta",), "accuracy", need=("drop_rate",))
    return _scatter(df, "drop_rate", "accuracy_delta", ci=("accuracy_ci_low", "accuracy_ci_high"),
                    zero_line=True)


@pk.styled
def plot_tiers(df: pd.DataFrame):
    """Padding vs drop rate (one point per configuration, e.g. per number of tiers)."""
    pk.available(df, ("pad_rate",), "tiers", need=("drop_rate",))
    return _scatter(df, "drop_rate", "pad_rate")


@pk.styled
def plot_grouping(df: pd.DataFrame):
    """Group size vs TTFT, energy per token and NPU calls."""
    return _sweep_lines(df, "group_size", ("ttft_s", "energy_per_token_mj", "n_npu_calls"), "grouping")


@pk.styled
def plot_residency(df: pd.DataFrame):
    """Hot threshold vs TTFT and energy per token."""
    return _sweep_lines(df, "hot_threshold", ("ttft_s", "energy_per_token_mj"), "residency")


@pk.styled
def plot_popularity_heatmap(profile):
    """Experts x layers load share from a calibration profile (object with `.counts`, a counts DataFrame with
    columns layer, expert, count, or a profile folder holding counts.parquet)."""
    counts = getattr(profile, "counts", profile)
    if isinstance(counts, (str, Path)):
        counts = pd.read_parquet(Path(counts) / "counts.parquet" if Path(counts).is_dir() else counts)
    if not isinstance(counts, pd.DataFrame) or not {"layer", "expert", "count"} <= set(counts.columns):
        raise NpuMoeError("plot_popularity_heatmap needs a CalibrationProfile, its folder, or a DataFrame with "
                          "columns layer, expert, count")
    load = counts.groupby(["expert", "layer"])["count"].sum().unstack("layer").fillna(0.0)
    share = 100.0 * load / load.sum(axis=0).replace(0, np.nan)
    fig, axes = pk.figure(1, 1, max(3.0, 0.25 * share.shape[1] + 2), max(2.5, 0.12 * share.shape[0] + 1))
    ax = axes[0][0]
    im = ax.imshow(share.to_numpy(), aspect="auto", cmap="viridis", interpolation="nearest")
    ax.set_xlabel("layer (index)")
    ax.set_ylabel("expert (index)")
    ax.set_xticks(range(share.shape[1]), [str(c) for c in share.columns])
    if share.shape[0] > 32:  # keep expert ticks readable
        ticks = range(0, share.shape[0], max(1, share.shape[0] // 16))
        ax.set_yticks(list(ticks), [str(share.index[i]) for i in ticks])
    ax.grid(False)
    fig.colorbar(im, ax=ax, label="load share (% of layer's assignments)")
    ax.set_title("expert popularity (calibration)")
    return fig


def save_figure(fig, out_dir, name: str, dpi: int = 200) -> list[Path]:
    """Save `fig` as out_dir/name.pdf and .png (atomically); return both paths."""
    from .experiments.atomic import atomic_open

    paths = []
    for ext in ("pdf", "png"):
        path = Path(out_dir) / f"{name}.{ext}"
        with atomic_open(path, "wb") as fh:
            fig.savefig(fh, format=ext, dpi=dpi, bbox_inches="tight")
        paths.append(path)
    return paths


FIGURES = {"baselines": plot_baselines, "ablation": plot_ablation, "accuracy": plot_accuracy,
           "tiers": plot_tiers, "grouping": plot_grouping, "residency": plot_residency}


def make_all_figures(results_dir, out_dir, log=print, dpi: int = 200) -> list[Path]:
    """Every figure the results have columns for (+ a heatmap per calibration profile found); others are
    skipped with the reason logged. Returns the written PDF and PNG paths."""
    from .experiments.store import load_results

    profiles = sorted(p.parent for p in Path(results_dir).rglob("counts.parquet")
                      if not any(part.startswith((".", "_")) for part in p.relative_to(results_dir).parts))
    try:
        df = load_results(results_dir)
    except NpuMoeError:
        if not profiles:
            raise
        df = None
    paths, skipped = [], []
    for name, fn in FIGURES.items():
        try:
            fig = fn(df) if df is not None else None
        except NpuMoeError as exc:
            skipped.append(f"{name}: {exc}")
            continue
        if fig is not None:
            paths += save_figure(fig, out_dir, name, dpi)
    for prof in profiles:
        suffix = "" if len(profiles) == 1 else f"-{prof.name}"
        paths += save_figure(plot_popularity_heatmap(prof), out_dir, f"popularity{suffix}", dpi)
    from .plots_timeline import timeline_figures   # timeline-*.png per prefill with a --timeline file
    paths += timeline_figures(results_dir, out_dir, df, dpi=dpi, log=log)
    for line in skipped:
        log(f"skipped {line}")
    if not paths:
        raise NpuMoeError(f"no figure can be made from {results_dir}: " + "; ".join(skipped))
    return paths


def _scatter(df, x, y, ci=None, zero_line=False):
    facets = pk.facets(df.dropna(subset=[x, y]))
    fig, axes = pk.figure(1, len(facets), 3.6, 2.8)
    for c, (title, sub) in enumerate(facets):
        sx, sy = pk.stats(sub, x), pk.stats(sub, y)
        keys = pk.config(sub)
        st = sy.merge(sx, on=keys, suffixes=("", "_x"))
        if ci and all(col in sub.columns for col in ci):  # the stored CI beats the spread of repeats
            cis = sub.groupby(keys, dropna=False)[list(ci)].median().reset_index()
            st = st.merge(cis, on=keys, how="left")
            st["lo"] = st[ci[0]].fillna(st["lo"])
            st["hi"] = st[ci[1]].fillna(st["hi"])
        (xl, xs), (yl, ys) = LABELS[x], LABELS[y]
        hues = pk.hue_names(st, pk.varying(st, exclude=FACETS))
        ax = axes[0][c]
        for color, h in zip(pk.palette(hues.nunique()), dict.fromkeys(hues)):
            s = st[hues == h].sort_values("median_x")
            yerr = np.clip([(s["median"] - s["lo"]) * ys, (s["hi"] - s["median"]) * ys], 0, None)
            xerr = np.clip([(s["median_x"] - s["lo_x"]) * xs, (s["hi_x"] - s["median_x"]) * xs], 0, None)
            ax.errorbar(s["median_x"] * xs, s["median"] * ys, yerr=yerr, xerr=xerr, fmt="o-", ms=3, lw=0.8,
                        capsize=2, color=color, label=h or None)
        if zero_line:
            ax.axhline(0.0, color="0.5", lw=0.8, ls=":")
        ax.set_xlabel(xl)
        ax.set_ylabel(yl)
        pk.finish(ax, title, None, list(dict.fromkeys(hues)))
    return fig


def _sweep_lines(df, x, metrics, figure):
    have = pk.available(df, metrics, figure, need=(x,))
    facets = pk.facets(df.dropna(subset=[x]).dropna(subset=have, how="all"))
    fig, axes = pk.figure(len(facets), len(have), 3.2, 2.6)
    for r, (title, sub) in enumerate(facets):
        for c, metric in enumerate(have):
            st = pk.stats(sub, metric)
            label, scale = LABELS[metric]
            hues = pk.hue_names(st, pk.varying(st, exclude=(x, *FACETS)))
            ax = axes[r][c]
            for color, h in zip(pk.palette(hues.nunique()), dict.fromkeys(hues)):
                s = st[hues == h].sort_values(x)
                y = s["median"] * scale
                ax.errorbar(s[x], y, yerr=[y - s["lo"] * scale, s["hi"] * scale - y], fmt="o-", ms=3, lw=0.8,
                            capsize=2, color=color, label=h or None)
            ax.set_xlabel(LABELS[x][0])
            ax.set_ylabel(label)
            pk.finish(ax, title, st.attrs.get("source"), list(dict.fromkeys(hues)))
    return fig


def register_cli(subparsers) -> None:
    p = subparsers.add_parser("figures", help="make every paper figure the results allow (PDF + PNG)")
    p.add_argument("results", help="results folder (rows from `npumoe-lab run` / `sweep`)")
    p.add_argument("--out", required=True, help="folder for the figures")
    p.set_defaults(func=_cli)


def _cli(args) -> int:
    for path in make_all_figures(args.results, args.out):
        print(path)
    return 0
