"""Paper figures from result rows (the DataFrame of `experiments.load_results`).

Every figure function takes the results frame and returns a matplotlib Figure built without pyplot (no global
state, renders headless like Agg, still displays inline in Jupyter). Points/bars are medians over `repeat`, error
bars span min..max over repeats. Every panel that shows time or energy carries a "modeled (platform X)" /
"measured (host Y)" label derived from the `timing_source`, `platform` and `host` columns of exactly the rows
it draws: a modeled number is never shown as if measured.
"""
from __future__ import annotations

import functools
from pathlib import Path

import numpy as np
import pandas as pd

from .errors import NpuMoeError

VARIANT_ORDER = ("reference", "cpu-only", "naive-npu", "anemll", "npumoe-base", "npumoe-t", "npumoe-tg",
                 "npumoe", "npumoe-spill")
PAPER_ABLATION = {"npumoe-base": 1.00, "npumoe-t": 1.48, "npumoe-tg": 2.11, "npumoe": 2.89}  # §5.8 TTFT speedup
# Columns that define one configuration: a point/bar aggregates only over `repeat`.
CONFIG = ("model", "workload", "platform", "variant", "prompt_len", "chunk", "n_tiers", "group_size",
          "hot_threshold")
FACETS = ("model", "workload")
LABELS = {  # (axis label, scale applied to the stored value)
    "ttft_s": ("TTFT (s)", 1.0), "energy_per_token_mj": ("energy per token (mJ/token)", 1.0),
    "cpu_cycles": ("CPU cycles (10⁹ cycles)", 1e-9), "n_npu_calls": ("NPU calls per prefill (count)", 1.0),
    "drop_rate": ("dropped assignments (%)", 100.0), "pad_rate": ("padding (% of NPU slots)", 100.0),
    "accuracy_delta": ("accuracy delta vs reference (score, absolute)", 1.0),
    "group_size": ("group size (experts per NPU graph)", 1.0), "n_tiers": ("capacity tiers (count)", 1.0),
    "hot_threshold": ("hot threshold (residency knob, plan units)", 1.0),
}
TIMED = ("ttft_s", "energy_per_token_mj", "energy_j", "cpu_cycles", "cpu_busy_s")
SOURCE_GID = "timing-source"  # gid of the label text, for tests and post-processing


@_styled
def plot_baselines(df: pd.DataFrame):
    """Paper main figure: TTFT, energy per token and CPU cycles per variant (fixed variant order)."""
    metrics = _available(df, ("ttft_s", "energy_per_token_mj", "cpu_cycles"), "baselines", need=("variant",))
    facets = _facets(df.dropna(subset=metrics, how="all"))
    fig, axes = _figure(len(facets), len(metrics), 3.2, 2.6)
    for r, (title, sub) in enumerate(facets):
        for c, metric in enumerate(metrics):
            _bars(axes[r][c], _stats(sub, metric), metric, title)
    return fig


@_styled
def plot_ablation(df: pd.DataFrame):
    """TTFT speedup of npumoe-base/-t/-tg/npumoe over npumoe-base, with the paper's 1.00/1.48/2.11/2.89."""
    _available(df, ("ttft_s",), "ablation", need=("variant",))
    sub_all = df[df["variant"].isin(list(PAPER_ABLATION)) & df["ttft_s"].notna()]
    if "npumoe-base" not in set(sub_all["variant"]) or sub_all["variant"].nunique() < 2:
        raise NpuMoeError("figure ablation needs ttft_s rows of npumoe-base and at least one of npumoe-t, "
                          "npumoe-tg, npumoe; run those variants first")
    facets = _facets(sub_all)
    fig, axes = _figure(1, len(facets), 3.6, 2.8)
    for c, (title, sub) in enumerate(facets):
        st = _stats(sub, "ttft_s")
        hue = _varying(st, exclude=("variant", *FACETS))  # e.g. prompt_len: each compared to its own base
        base = st.loc[st["variant"] == "npumoe-base", [*hue, "median"]].rename(columns={"median": "base"})
        st = st.merge(base, on=hue, how="left") if hue else st.assign(base=base["base"].iloc[0])
        # speedup = base / t: the fastest repeat gives the highest speedup
        st = st.assign(median=st["base"] / st["median"], lo=st["base"] / st["hi"], hi=st["base"] / st["lo"])
        ax = axes[0][c]
        _bars(ax, st.dropna(subset=["median"]), None, title, ylabel="TTFT speedup vs npumoe-base (×)",
              source_rows=sub)
        order = [v for v in PAPER_ABLATION if v in set(st["variant"])]
        ax.scatter(range(len(order)), [PAPER_ABLATION[v] for v in order], marker="_", s=500, linewidths=2,
                   color="black", zorder=4, label="paper (NPUMoE §5.8)")
        ax.axhline(1.0, color="0.5", lw=0.8, ls=":")
        ax.legend(fontsize=6, loc="lower right")
    return fig


@_styled
def plot_accuracy(df: pd.DataFrame):
    """Accuracy delta vs reference against drop rate; y error = the stored CI when present."""
    _available(df, ("accuracy_delta",), "accuracy", need=("drop_rate",))
    return _scatter(df, "drop_rate", "accuracy_delta", "accuracy", ci=("accuracy_ci_low", "accuracy_ci_high"),
                    zero_line=True)


@_styled
def plot_tiers(df: pd.DataFrame):
    """Padding vs drop rate (one point per configuration, e.g. per number of tiers)."""
    _available(df, ("pad_rate",), "tiers", need=("drop_rate",))
    return _scatter(df, "drop_rate", "pad_rate", "tiers")


@_styled
def plot_grouping(df: pd.DataFrame):
    """Group size vs TTFT, energy per token and NPU calls."""
    return _sweep_lines(df, "group_size", ("ttft_s", "energy_per_token_mj", "n_npu_calls"), "grouping")


@_styled
def plot_residency(df: pd.DataFrame):
    """Hot threshold vs TTFT and energy per token."""
    return _sweep_lines(df, "hot_threshold", ("ttft_s", "energy_per_token_mj"), "residency")


@_styled
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
    fig, axes = _figure(1, 1, max(3.0, 0.25 * share.shape[1] + 2), max(2.5, 0.12 * share.shape[0] + 1))
    ax = axes[0][0]
    im = ax.imshow(share.to_numpy(), aspect="auto", cmap="viridis", interpolation="nearest")
    ax.set_xlabel("layer (index)")
    ax.set_ylabel("expert (index)")
    ax.set_xticks(range(share.shape[1]), [str(c) for c in share.columns])
    if share.shape[0] > 32:  # keep expert ticks readable
        ticks = range(0, share.shape[0], max(1, share.shape[0] // 16))
        ax.set_yticks(list(ticks), [str(share.index[i]) for i in ticks])
    fig.colorbar(im, ax=ax, label="load share (% of the layer's routed assignments)")
    ax.set_title("expert popularity (calibration)")
    return fig


def save_figure(fig, out_dir, name: str) -> list[Path]:
    """Save `fig` as out_dir/name.pdf and .png (atomically); return both paths."""
    from .experiments.atomic import atomic_open

    paths = []
    for ext in ("pdf", "png"):
        path = Path(out_dir) / f"{name}.{ext}"
        with atomic_open(path, "wb") as fh:
            fig.savefig(fh, format=ext, dpi=200, bbox_inches="tight")
        paths.append(path)
    return paths


FIGURES = {"baselines": plot_baselines, "ablation": plot_ablation, "accuracy": plot_accuracy,
           "tiers": plot_tiers, "grouping": plot_grouping, "residency": plot_residency}


def make_all_figures(results_dir, out_dir, log=print) -> list[Path]:
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
            paths += save_figure(fig, out_dir, name)
    for prof in profiles:
        suffix = "" if len(profiles) == 1 else f"-{prof.name}"
        paths += save_figure(plot_popularity_heatmap(prof), out_dir, f"popularity{suffix}")
    for line in skipped:
        log(f"skipped {line}")
    if not paths:
        raise NpuMoeError(f"no figure can be made from {results_dir}: " + "; ".join(skipped))
    return paths


def source_label(rows: pd.DataFrame) -> str:
    """'modeled (platform X)' / 'measured (host Y)' for the rows a panel draws; several joined by '; '."""
    if "timing_source" not in rows.columns:
        return "timing source not recorded"
    parts = []
    for _, r in rows.drop_duplicates([c for c in ("timing_source", "platform", "host") if c in rows]).iterrows():
        platform, host = r.get("platform"), r.get("host")
        modeled = f"modeled (platform {platform if pd.notna(platform) else '?'})"
        measured = f"measured (host {host if pd.notna(host) else '?'})"
        parts.append({"modeled": modeled, "measured": measured,
                      "mixed": f"{measured} + {modeled}"}.get(r["timing_source"], "timing source not recorded"))
    return "; ".join(sorted(dict.fromkeys(parts)))


# ---- helpers -----------------------------------------------------------------------------------------------


def _available(df, metrics, figure, need=()) -> list[str]:
    have = [m for m in metrics if m in df.columns and df[m].notna().any()]
    missing = [c for c in need if c not in df.columns or not df[c].notna().any()]
    if missing or not have:
        raise NpuMoeError(f"figure {figure} needs column(s) {', '.join(need + tuple(metrics[:1]))} with values; "
                          f"the results lack {', '.join(missing or metrics)}")
    return have


def _stats(df, metric) -> pd.DataFrame:
    """Median, min, max, n of `metric` over repeats, one row per configuration; keeps the drawn rows' sources."""
    keys = [c for c in CONFIG if c in df.columns and df[c].notna().any()]
    d = df.dropna(subset=[metric])
    st = d.groupby(keys, dropna=False, sort=False)[metric].agg(median="median", lo="min", hi="max", n="count")
    st = st.reset_index()
    st.attrs["source"] = source_label(d) if metric in TIMED else None
    return st


def _varying(st, exclude=()) -> list[str]:
    return [c for c in CONFIG if c in st.columns and c not in exclude and st[c].nunique(dropna=True) > 1]


def _hue_names(st, cols) -> pd.Series:
    if not cols:
        return pd.Series([""] * len(st), index=st.index)
    return st[cols].astype(str).apply(lambda r: ", ".join(f"{c}={v}" for c, v in r.items()), axis=1)


def _facets(df) -> list[tuple[str, pd.DataFrame]]:
    cols = [c for c in FACETS if c in df.columns and df[c].nunique(dropna=True) > 1]
    if not cols:
        return [(" · ".join(str(df[c].dropna().iloc[0]) for c in FACETS if c in df and df[c].notna().any()), df)]
    return [(" · ".join(map(str, k if isinstance(k, tuple) else (k,))), g)
            for k, g in df.groupby(cols, dropna=False, sort=True)]


def _bars(ax, st, metric, title, ylabel=None, source_rows=None):
    """Grouped bars: x = variant (paper order), hue = the other varying configuration columns."""
    label, scale = LABELS.get(metric, (ylabel, 1.0)) if metric else (ylabel, 1.0)
    order = [v for v in VARIANT_ORDER if v in set(st["variant"])] + \
        sorted(set(st["variant"]) - set(VARIANT_ORDER))
    hues = _hue_names(st, _varying(st, exclude=("variant", *FACETS)))
    names = list(dict.fromkeys(hues))
    width = 0.8 / len(names)
    colors = _palette(len(names))
    for i, h in enumerate(names):
        s = st[hues == h]
        x = np.array([order.index(v) for v in s["variant"]]) - 0.4 + width * (i + 0.5)
        y = s["median"].to_numpy() * scale
        ax.bar(x, y, width, color=colors[i], label=h or None)
        if (s["n"] > 1).any():
            ax.errorbar(x, y, yerr=[y - s["lo"] * scale, s["hi"] * scale - y], fmt="none", ecolor="black",
                        elinewidth=0.8, capsize=2)
    ax.set_xticks(range(len(order)), order, rotation=40, ha="right")
    ax.set_xlabel("variant")
    ax.set_ylabel(label)
    _finish(ax, title, st.attrs.get("source") if source_rows is None else source_label(source_rows), names)


def _scatter(df, x, y, figure, ci=None, zero_line=False):
    facets = _facets(df.dropna(subset=[x, y]))
    fig, axes = _figure(1, len(facets), 3.6, 2.8)
    for c, (title, sub) in enumerate(facets):
        sx, sy = _stats(sub, x), _stats(sub, y)
        keys = [k for k in CONFIG if k in sx.columns and k in sy.columns]
        st = sy.merge(sx, on=keys, suffixes=("", "_x"))
        if ci and all(col in sub.columns for col in ci):  # the stored CI beats the spread of repeats
            cis = sub.groupby(keys, dropna=False)[list(ci)].median().reset_index()
            st = st.merge(cis, on=keys, how="left")
            st["lo"] = st[ci[0]].fillna(st["lo"])
            st["hi"] = st[ci[1]].fillna(st["hi"])
        (xl, xs), (yl, ys) = LABELS[x], LABELS[y]
        hues = _hue_names(st, _varying(st, exclude=FACETS))
        ax = axes[0][c]
        for color, h in zip(_palette(hues.nunique()), dict.fromkeys(hues)):
            s = st[hues == h].sort_values("median_x")
            yerr = np.clip([(s["median"] - s["lo"]) * ys, (s["hi"] - s["median"]) * ys], 0, None)
            xerr = np.clip([(s["median_x"] - s["lo_x"]) * xs, (s["hi_x"] - s["median_x"]) * xs], 0, None)
            ax.errorbar(s["median_x"] * xs, s["median"] * ys, yerr=yerr, xerr=xerr, fmt="o-", ms=3, lw=0.8,
                        capsize=2, color=color, label=h or None)
        if zero_line:
            ax.axhline(0.0, color="0.5", lw=0.8, ls=":")
        ax.set_xlabel(xl)
        ax.set_ylabel(yl)
        _finish(ax, title, None, list(dict.fromkeys(hues)))
    return fig


def _sweep_lines(df, x, metrics, figure):
    have = _available(df, metrics, figure, need=(x,))
    facets = _facets(df.dropna(subset=[x]).dropna(subset=have, how="all"))
    fig, axes = _figure(len(facets), len(have), 3.2, 2.6)
    for r, (title, sub) in enumerate(facets):
        for c, metric in enumerate(have):
            st = _stats(sub, metric)
            label, scale = LABELS[metric]
            hues = _hue_names(st, _varying(st, exclude=(x, *FACETS)))
            ax = axes[r][c]
            for color, h in zip(_palette(hues.nunique()), dict.fromkeys(hues)):
                s = st[hues == h].sort_values(x)
                y = s["median"] * scale
                ax.errorbar(s[x], y, yerr=[y - s["lo"] * scale, s["hi"] * scale - y], fmt="o-", ms=3, lw=0.8,
                            capsize=2, color=color, label=h or None)
            ax.set_xlabel(LABELS[x][0])
            ax.set_ylabel(label)
            _finish(ax, title, st.attrs.get("source"), list(dict.fromkeys(hues)))
    return fig


def _finish(ax, title, source, hues):
    if title:
        ax.set_title(title, fontsize=8)
    if source:  # on every time/energy panel, inside the axes so it survives cropping and subfigure reuse
        ax.text(0.02, 0.98, source, transform=ax.transAxes, ha="left", va="top", fontsize=5.5, gid=SOURCE_GID,
                bbox={"boxstyle": "round,pad=0.2", "fc": "white", "ec": "0.7", "alpha": 0.9})
    if len([h for h in hues if h]) > 1:
        ax.legend(fontsize=5.5, loc="upper right")


def _figure(nrows, ncols, w, h):
    from matplotlib.figure import Figure

    fig = Figure(figsize=(w * ncols, h * nrows), layout="constrained")
    return fig, fig.subplots(nrows, ncols, squeeze=False)


def _style():
    import matplotlib
    import seaborn as sns

    return matplotlib.rc_context({**sns.axes_style("whitegrid"), **sns.plotting_context("paper")})


def _styled(fn):
    """Build the whole figure inside the paper style (fonts and ticks are fixed when artists are created)."""
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        with _style():
            return fn(*args, **kwargs)
    return wrapper


def _palette(n):
    import seaborn as sns

    return sns.color_palette("colorblind", max(n, 1))


def register_cli(subparsers) -> None:
    p = subparsers.add_parser("figures", help="make every paper figure the results allow (PDF + PNG)")
    p.add_argument("results", help="results folder (rows from `npumoe-lab run` / `sweep`)")
    p.add_argument("--out", required=True, help="folder for the figures")
    p.set_defaults(func=_cli)


def _cli(args) -> int:
    for path in make_all_figures(args.results, args.out):
        print(path)
    return 0
