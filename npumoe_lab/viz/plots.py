"""Paper figures from result rows (the DataFrame of `experiments.load_results`).

Every figure function takes the results frame and returns a matplotlib Figure built without pyplot (no global
state, renders headless like Agg, still displays inline in Jupyter). Points/bars are medians over `repeat`, error
bars span the interquartile range of the repeats. Every panel that shows time or energy carries the source of
that metric for exactly the rows it draws ("measured (host Y)", "modeled (platform X)", "measured (host Y) time x
modeled power (platform cpu)", ...): a modeled number is never shown as if measured. Layout rules (colour =
variant, facets for the rest, log axes over decades): see `plot_helpers`.
"""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pandas as pd

from npumoe_lab.viz import plot_helpers as pk
from npumoe_lab.errors import NpuMoeError
from npumoe_lab.utils import progress
from npumoe_lab.viz.plot_helpers import FACETS, LABELS, SOURCE_GID, VARIANT_ORDER  # noqa: F401 - public names
from npumoe_lab.viz.timeline import timeline  # noqa: F401 - the prefill Gantt chart (plots_timeline.py)

PAPER_ABLATION = {"npumoe-base": 1.00, "npumoe-t": 1.48, "npumoe-tg": 2.11, "npumoe": 2.89}  # §5.8 TTFT speedup


@pk.styled
def plot_baselines(df: pd.DataFrame):
    """Paper main figure: TTFT, energy per token and CPU cycles per variant, one row of panels per platform (and
    per workload / prompt length / chunk that varies); bars = medians, whiskers = IQR over repeats, or for modeled
    rows without repeats their 90 % interval over parameter draws (the axis label says which)."""
    metrics = pk.available(df, ("ttft_s", "energy_per_token_mj", "cpu_cycles"), "baselines", need=("variant",))
    facets = pk.facets(pk.default_knobs(df.dropna(subset=metrics, how="all")))
    fig, axes = pk.figure(len(facets), len(metrics), 3.0, 2.9)
    for c, metric in enumerate(metrics):       # one scale per column (a metric), over every facet
        column = pd.concat([pk.stats(sub, metric)["median"] for _, sub in facets if sub[metric].notna().any()])
        for r, (title, sub) in enumerate(facets):    # the unit per panel: a modeled 10 ms reads in ms
            st = pk.with_interval(pk.stats(sub, metric), sub, metric)
            pk.hbars(axes[r][c], st, metric, title, names=c == 0, log=pk.wants_log(column))
    return fig


def _drop_rates(sub) -> dict:
    """variant -> median drop rate: speedups of steps that drop different shares compare different accuracy
    points, so each bar says its drop rate."""
    if "drop_rate" not in sub.columns or not sub["drop_rate"].notna().any():
        return {}
    return {v: x for v, x in sub.groupby("variant")["drop_rate"].median().items() if pd.notna(x)}


# the setting the paper's ablation numbers were read for (PAPER.md 5.5; paper-check compares them there): drawn
# only on that model and platform's panels, never on another model's
PAPER_ABLATION_SETTING = {"model": "phi-3.5-moe", "platform": "m2-ultra"}


def _is_paper_setting(sub) -> bool:
    model = sub["geometry"] if "geometry" in sub.columns else sub.get("model", pd.Series(dtype=object))
    plats = set(sub["platform"].dropna()) if "platform" in sub.columns else set()
    return set(model.dropna().astype(str)) == {PAPER_ABLATION_SETTING["model"]} and \
        plats == {PAPER_ABLATION_SETTING["platform"]}


@pk.styled
def plot_ablation(df: pd.DataFrame):
    """TTFT speedup of npumoe-base/-t/-tg/npumoe over npumoe-base (each facet against its own base). Each step's
    drop rate is in its tick label (beside the data, never over it); the paper's 1.00/1.48/2.11/2.89 are drawn
    as hollow diamonds only on the panels of the paper's own setting (Phi-3.5-MoE on M2 Ultra) and quoted in the
    axis note elsewhere."""
    pk.available(df, ("ttft_s",), "ablation", need=("variant",))
    sub_all = pk.default_knobs(df[df["variant"].isin(list(PAPER_ABLATION)) & df["ttft_s"].notna()])
    if "npumoe-base" not in set(sub_all["variant"]) or sub_all["variant"].nunique() < 2:
        raise NpuMoeError("figure ablation needs ttft_s rows of npumoe-base and at least one of npumoe-t, "
                          "npumoe-tg, npumoe; run those variants first")
    facets = [(t, g) for t, g in pk.facets(sub_all) if "npumoe-base" in set(g["variant"])]
    ncols = min(len(facets), 2)
    nrows = -(-len(facets) // ncols)
    fig, axes = pk.figure(nrows, ncols, 3.6, 3.2 if nrows > 1 else 3.9)   # the notes below are one block
    paper = " / ".join(f"{PAPER_ABLATION[v]:.2f}" for v in PAPER_ABLATION)
    notes = set()
    for i, (title, sub) in enumerate(facets):
        ax = axes[i // ncols][i % ncols]
        st = pk.stats(sub, "ttft_s")
        base = float(st.loc[st["variant"] == "npumoe-base", "median"].iloc[0])
        # speedup = base / t: the fastest repeats give the highest speedups
        st = st.assign(median=base / st["median"], lo=base / st["hi"], hi=base / st["lo"])
        order = pk.variant_order(st["variant"])
        same, drops = _equal_steps(sub), _drop_rates(sub)
        names = [v + (f"\ndrop {100 * drops[v]:.1f}%" if v in drops else "") + (f", = {same[v]}" if v in same else "")
                 for v in order]
        here = _is_paper_setting(sub)
        notes.add("hollow diamonds: the paper's speedups (NPUMoE §5.8, Phi-3.5-MoE on M2 Ultra)" if here else
                  f"the paper's speedups (Phi-3.5-MoE, M2 Ultra) are {paper}x; panels of other settings do not "
                  "draw them")
        if (st["n"] <= 1).all():
            notes.add("no whiskers: one modeled value per step (a ratio's interval needs paired draws: "
                      "`paper-check` gives P(holds))")
        pk.hbars(ax, st, None, title, source=pk.metric_source(sub, "ttft_s"), names=names,
                 xlabel="TTFT speedup vs npumoe-base (×)")
        for tick, v in zip(ax.get_yticklabels(), order):
            if v in same:            # a step equal to an earlier one has no speedup of its own
                tick.set_color("tab:red")
        if here:
            ax.scatter([PAPER_ABLATION[v] for v in order], range(len(order)), marker="D", s=22, facecolors="none",
                       edgecolors="black", linewidths=1.0, zorder=4)
        ax.axvline(1.0, color="0.5", lw=0.8, ls=":")
    for j in range(len(facets), nrows * ncols):
        axes[j // ncols][j % ncols].set_visible(False)
    fig.supxlabel("\n".join(sorted(notes)), fontsize=6, color="0.25")     # what every panel shares, said once
    return fig


def _equal_steps(sub: pd.DataFrame) -> dict:
    """{variant: the step it equals} where it does in every setting of the facet (sim/degenerate.py)."""
    from npumoe_lab.sim.degenerate import equal_to      # lazy: figures of runs need no simulation imports
    keys = [k for k in ("model", "platform", "prompt_len", "chunk") if k in sub.columns]
    full = sub.assign(**{k: "-" for k in ("model", "platform", "prompt_len", "chunk") if k not in sub.columns})
    same = equal_to(full)
    n = full[keys or ["variant"]].drop_duplicates().shape[0] if keys else 1
    out = {}
    for key, prev in same.items():
        out.setdefault(key[-1], []).append(prev)
    return {v: "/".join(sorted(set(p))) for v, p in out.items() if len(p) >= n}


@pk.styled
def plot_accuracy(df: pd.DataFrame):
    """Accuracy delta vs reference (exact 95 % bounds from the discordant pairs where stored, else the bootstrap
    CI), next-token top-1 agreement and KL against drop rate. Where task scores saturate (nothing changes at
    this n) agreement and KL are the measures that move."""
    pk.available(df, ("accuracy_delta",), "accuracy", need=("drop_rate",))
    ys = [m for m in ("accuracy_delta", "top1_agree", "kl") if m in df.columns and df[m].notna().any()]
    return _scatter(df, "drop_rate", ys)


@pk.styled
def plot_tiers(df: pd.DataFrame):
    """Padding vs drop rate (one point per configuration, e.g. per number of tiers)."""
    pk.available(df, ("pad_rate",), "tiers", need=("drop_rate",))
    return _scatter(df, "drop_rate", ["pad_rate"])


@pk.styled
def plot_grouping(df: pd.DataFrame):
    """Group size vs TTFT, energy per token and NPU calls."""
    return _sweep_lines(df, "group_size", ("ttft_s", "energy_per_token_mj", "n_npu_calls"), "grouping")


@pk.styled
def plot_residency(df: pd.DataFrame):
    """Hot threshold vs TTFT and energy per token."""
    return _sweep_lines(df, "hot_threshold", ("ttft_s", "energy_per_token_mj"), "residency")


def shared_vmax(profiles) -> float | None:
    """The largest load share over several profiles: the top of one colour scale for all their heatmaps."""
    return max((float(np.nanmax(_load_share(p).to_numpy())) for p in profiles), default=None)


def _load_share(profile) -> pd.DataFrame:
    counts = getattr(profile, "counts", profile)
    if isinstance(counts, (str, Path)):
        counts = pd.read_parquet(Path(counts) / "counts.parquet" if Path(counts).is_dir() else counts)
    if not isinstance(counts, pd.DataFrame) or not {"layer", "expert", "count"} <= set(counts.columns):
        raise NpuMoeError("plot_popularity_heatmap needs a CalibrationProfile, its folder, or a DataFrame with "
                          "columns layer, expert, count")
    load = counts.groupby(["expert", "layer"])["count"].sum().unstack("layer").fillna(0.0)
    return 100.0 * load / load.sum(axis=0).replace(0, np.nan)


@pk.styled
def plot_popularity_heatmap(profile, vmax: float | None = None):
    """Experts x layers load share from a calibration profile (object with `.counts`, a counts DataFrame with
    columns layer, expert, count, or a profile folder holding counts.parquet). `vmax`: the top of the colour
    scale, to compare several heatmaps on one scale (plot_popularity_heatmaps does that)."""
    return plot_popularity_heatmaps.__wrapped__({"": profile}, vmax=vmax)


@pk.styled
def plot_popularity_heatmaps(profiles: dict, vmax: float | None = None):
    """One panel per calibration source ({name: profile}), all on ONE colour scale (0..vmax, default the largest
    share of any panel), so that their colours compare."""
    shares = {name: _load_share(p) for name, p in profiles.items()}
    top = vmax if vmax is not None else max(float(np.nanmax(sh.to_numpy())) for sh in shares.values())
    first = next(iter(shares.values()))
    w, h = max(2.4, 0.3 * first.shape[1] + 1.2), max(3.0, 0.09 * first.shape[0] + 1.6)
    fig, axes = pk.figure(1, len(shares), w, h)
    for ax, (name, share) in zip(axes[0], shares.items()):
        im = ax.imshow(share.to_numpy(), aspect="auto", cmap="viridis", interpolation="nearest", vmin=0.0, vmax=top)
        ax.set_xlabel("layer (index)")
        ax.set_ylabel("expert (index)")
        ax.set_xticks(range(share.shape[1]), [str(c) for c in share.columns])
        step = max(1, share.shape[0] // 8)           # a readable number of expert ticks
        ax.set_yticks(list(range(0, share.shape[0], step)), [str(share.index[i]) for i in range(0, share.shape[0], step)])
        ax.grid(False)
        ax.set_title(name or "expert popularity (calibration)", fontsize=7)
    fig.colorbar(im, ax=list(axes[0]), label="load share (% of layer's assignments)", location="bottom",
                 shrink=0.8, aspect=30)
    if len(shares) > 1:      # one panel carries its own title; several need the figure's
        fig.suptitle("expert popularity per layer (calibration load share, one colour scale) — "
                     + ", ".join(map(str, shares)), fontsize=8)
    return fig


def save_figure(fig, out_dir, name: str, dpi: int = 200) -> list[Path]:
    """Save `fig` as out_dir/name.pdf and .png (atomically); return both paths."""
    # lazy: experiments imports plots' users; loaded only when figures are written
    from npumoe_lab.results.atomic import atomic_open

    paths = []
    for ext in ("pdf", "png"):
        path = Path(out_dir) / f"{name}.{ext}"
        with atomic_open(path, "wb") as fh:
            fig.savefig(fh, format=ext, dpi=dpi, bbox_inches="tight")
        paths.append(path)
    return paths


FIGURES = {"baselines": plot_baselines, "ablation": plot_ablation, "accuracy": plot_accuracy,
           "tiers": plot_tiers, "grouping": plot_grouping, "residency": plot_residency}


def make_all_figures(results_dir, out_dir, log=None, dpi: int = 200) -> list[Path]:
    """Every figure the results have columns for (+ a heatmap per calibration profile found); others are
    skipped with the reason logged (`log`, default: a line on stderr). Returns the written PDF and PNG paths."""
    log = log or (lambda line: print(line, file=sys.stderr))
    # lazy: experiments imports plots' users; loaded only when figures are written
    from npumoe_lab.results.store import load_results

    profiles = sorted(p.parent for p in Path(results_dir).rglob("counts.parquet")
                      if not any(part.startswith((".", "_")) for part in p.relative_to(results_dir).parts))
    try:
        df = load_results(results_dir)
    except NpuMoeError:
        if not profiles:
            raise
        df = None
    paths, skipped = [], []
    bar = progress(total=len(FIGURES) + len(profiles), desc="figures", unit="fig")   # ~20 s for a demo folder
    for name, fn in FIGURES.items():
        bar.set_postfix_str(name)
        try:
            fig = fn(df) if df is not None else None
        except NpuMoeError as exc:
            skipped.append(f"{name}: {exc}")
            bar.update(1)
            continue
        if fig is not None:
            paths += save_figure(fig, out_dir, name, dpi)
        bar.update(1)
    top = shared_vmax(profiles)
    for prof in profiles:   # one file each, all on one colour scale
        suffix = "" if len(profiles) == 1 else f"-{prof.name}"
        paths += save_figure(plot_popularity_heatmap(prof, vmax=top), out_dir, f"popularity{suffix}", dpi)
        bar.update(1)
    bar.close()
    from npumoe_lab.viz.timeline import timeline_figures   # timeline-*.png per prefill with a --timeline file
    paths += timeline_figures(results_dir, out_dir, df, dpi=dpi, log=log)
    for line in skipped:
        log(f"skipped {line}")
    if not paths:
        raise NpuMoeError(f"no figure can be made from {results_dir}: " + "; ".join(skipped))
    return paths


def _ci_columns(sub, metric):
    if metric != "accuracy_delta":      # modeled metrics: the 90 % interval over parameter draws, when the rows have it
        lo, hi = f"{metric}_lo", f"{metric}_hi"
        return (lo, hi) if lo in sub.columns and hi in sub.columns and sub[lo].notna().any() else None
    for lo, hi in (("accuracy_exact_low", "accuracy_exact_high"), ("accuracy_ci_low", "accuracy_ci_high")):
        if lo in sub.columns and hi in sub.columns and sub[lo].notna().any():
            return lo, hi
    return None


def _y_label(sub, metric, ci) -> str:
    label, _ = LABELS[metric]
    if metric == "accuracy_delta" and "score_name" in sub.columns and (sub["score_name"] == "nll").all():
        label = "NLL delta vs reference (nats/token)"
    if ci:
        label += "\n" + ("exact 95% bounds (Clopper-Pearson)" if ci[0] == "accuracy_exact_low" else
                         "bootstrap 95% CI" if ci[0] == "accuracy_ci_low" else "90% interval (parameter draws)")
    return label


def _dodge(st, xs: float, n: int) -> float:
    """A horizontal offset between variants (1.5 % of the x span) when two variants share a point, else 0: five
    dropless variants at (0, 0) were drawn as one marker. Applied to the right only (variant i moves i offsets),
    so a drop rate of 0 is never drawn below 0."""
    pts = st.assign(_x=(st["median_x"] * xs).round(9), _y=st["median"].round(9))
    if n < 2 or not pts.duplicated(["_x", "_y"]).any() or pts["variant"].nunique() < 2:
        return 0.0
    span = float(pts["_x"].max() - pts["_x"].min())
    return 0.015 * (span if span > 0 else 1.0)


WIDE_BOUNDS_POINTS = 25.0     # accuracy bounds wider than +-25 points (a few samples) are stated, not drawn


def _wide_bounds(sub, st, metric, ci, scale) -> str:
    """The axis note for accuracy bounds too wide to draw (n stated), else ''."""
    if metric != "accuracy_delta" or not ci or "n_samples" not in sub.columns:
        return ""
    half = float(((st["hi"] - st["lo"]) * scale / 2).median())
    n = pd.to_numeric(sub["n_samples"], errors="coerce").dropna()
    if not len(n) or not np.isfinite(half) or half <= WIDE_BOUNDS_POINTS:
        return f"n = {int(n.median())} samples per point" if len(n) else ""
    return f"n = {int(n.median())} samples per point: exact bounds ±{half:.0f} points, not drawn"


def _scatter(df, x, ys):
    """y metrics against x, one row of panels per facet, colour = variant, one figure legend."""
    facets = pk.facets(df.dropna(subset=[x]).dropna(subset=ys, how="all"))
    # one metric: facets wrap into two columns; several: one row of metrics per facet
    wrap = 2 if len(ys) == 1 and len(facets) > 1 else None
    shape = (-(-len(facets) // wrap), wrap) if wrap else (len(facets), len(ys))
    fig, axes = pk.figure(*shape, 3.0, 2.7)
    for j in range(len(facets), shape[0] * shape[1] if wrap else 0):
        axes[j // wrap][j % wrap].set_visible(False)
    variants, knob_entries, fig_notes = set(), {}, set()
    for r, (title, sub) in enumerate(facets):
        keys = pk.config(sub)
        sx = pk.stats(sub, x)
        for c, y in enumerate(ys):
            ax = axes[r // wrap][r % wrap] if wrap else axes[r][c]
            st = pk.stats(sub, y).merge(sx, on=keys, suffixes=("", "_x"))
            ci = _ci_columns(sub, y)
            if ci:  # the stored bounds beat the spread of repeats
                cis = sub.groupby(keys, dropna=False)[list(ci)].median().reset_index()
                st = st.merge(cis, on=keys, how="left")
                st["lo"] = st[ci[0]].fillna(st["lo"])
                st["hi"] = st[ci[1]].fillna(st["hi"])
            xs, ysc = LABELS[x][1], (1.0 if y == "accuracy_delta" and _y_label(sub, y, None).startswith("NLL")
                                     else LABELS[y][1])
            knob = pk.inner_knob(st)
            marks = pk.knob_markers(st[knob]) if knob else {}
            order = pk.variant_order(st["variant"])
            dodge = _dodge(st, xs, len(order))
            n_note = _wide_bounds(sub, st, y, ci, ysc)
            if n_note:                          # bounds wider than the panel says anything about: said, not drawn
                st = st.assign(lo=st["median"], hi=st["median"])
            for i, v in enumerate(order):
                s = st[st["variant"] == v].sort_values("median_x")
                yerr = np.clip([(s["median"] - s["lo"]) * ysc, (s["hi"] - s["median"]) * ysc], 0, None)
                xerr = np.clip([(s["median_x"] - s["lo_x"]) * xs, (s["hi_x"] - s["median_x"]) * xs], 0, None)
                xv = s["median_x"] * xs + dodge * _ranks(st, s, v, xs)
                ax.errorbar(xv, s["median"] * ysc, yerr=yerr, xerr=xerr, fmt="-" if marks else "o-",
                            ms=3, lw=0.8, capsize=2, color=pk.color_of(v))
                for val, m in marks.items():   # the knob's value as the marker shape
                    k = pk.knob_rows(s, knob, val)
                    kx = k["median_x"] * xs + dodge * _ranks(st, k, v, xs)
                    ax.scatter(kx, k["median"] * ysc, marker=m, s=14, color=pk.color_of(v), zorder=3)
                variants.add(v)
            if dodge:
                fig_notes.add("variants sharing a point are dodged apart, to the right of it")
            if marks:
                knob_entries.update({f"{knob} = {val:g}" if isinstance(val, (int, float)) else f"{knob} = {val}": m
                                     for val, m in marks.items()})
            if y == "accuracy_delta":
                ax.axhline(0.0, color="0.5", lw=0.8, ls=":")
            ax.set_xlabel(LABELS[x][0])
            if n_note:
                fig_notes.add(f"{LABELS[y][0].split(' (')[0]}: {n_note}")
            ax.set_ylabel(_y_label(sub, y, ci))
            pk.auto_scale(ax, st["median"] * ysc, "y")
            pk.finish(ax, title, None)
    from matplotlib.lines import Line2D
    pk.variant_legend(fig, variants, [(Line2D([], [], marker=m, ls="none", color="0.3", ms=4), label)
                                      for label, m in knob_entries.items()])
    fig.npumoe_notes = sorted(fig_notes)     # said once, under the figure title (plot_helpers.styled)
    return fig


def _ranks(st, s, variant, xs) -> np.ndarray:
    """For each of `s`'s points (rows of `variant`): how many variants before it in paper order sit at the same
    (x, y) point; 0 for a point of its own, which is then drawn where it is."""
    order = pk.variant_order(st["variant"])
    key = lambda d: list(zip((d["median_x"] * xs).round(9), d["median"].round(9)))    # noqa: E731
    before = {v: set(key(st[st["variant"] == v])) for v in order[:order.index(variant)]}
    return np.array([sum(pt in pts for pts in before.values()) for pt in key(s)], dtype=float)


def _sweep_lines(df, x, metrics, figure):
    have = pk.available(df, metrics, figure, need=(x,))
    facets = pk.facets(df.dropna(subset=[x]).dropna(subset=have, how="all"))
    fig, axes = pk.figure(len(facets), len(have), 3.0, 2.4)
    variants = set()
    units = {m: pk.unit(m, df[m]) for m in have}       # one unit per column (ms when every TTFT is below 1 s)
    for r, (title, sub) in enumerate(facets):
        for c, metric in enumerate(have):
            st = pk.stats(sub, metric)
            label, scale = units[metric]
            ax = axes[r][c]
            for v in pk.variant_order(st["variant"]):
                s = st[st["variant"] == v].sort_values(x)
                y = s["median"] * scale
                ax.errorbar(s[x], y, yerr=np.clip([y - s["lo"] * scale, s["hi"] * scale - y], 0, None), fmt="o-",
                            ms=3, lw=0.8, capsize=2, color=pk.color_of(v))
                variants.add(v)
            ax.set_xlabel(LABELS[x][0])
            ax.set_ylabel(label)
            pk.auto_scale(ax, st[x], "x")
            pk.auto_scale(ax, st["median"] * scale, "y")
            pk.finish(ax, title, st.attrs.get("source"))
    pk.variant_legend(fig, variants)
    return fig
