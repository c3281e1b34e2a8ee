"""Building blocks of the figures in `plots.py`: configuration columns, aggregation over repeats, the
measured/modeled label, the paper style and the drawing of bars and panels.

A configuration is identified by the known columns (CONFIG), any extra text/int column and `plan_hash` (which
separates plans differing in a knob without a column of its own); only `repeat` is aggregated away.
"""
from __future__ import annotations

import functools

import numpy as np
import pandas as pd

from .errors import NpuMoeError

VARIANT_ORDER = ("reference", "cpu-only", "naive-npu", "anemll", "npumoe-base", "npumoe-t", "npumoe-tg",
                 "npumoe", "npumoe-spill")
# Columns that define one configuration: a point/bar aggregates only over `repeat`.
CONFIG = ("model", "workload", "platform", "variant", "prompt_len", "chunk", "n_tiers", "group_size",
          "hot_threshold")
FACETS = ("model", "workload")
SWEEP_KNOBS = ("group_size", "hot_threshold", "n_tiers")
NOT_CONFIG = {"repeat", "plan_hash", "platform_hash", "model_fingerprint", "platform_profile", "git_commit",
              "versions", "host", "created", "score_name", "median", "lo", "hi", "n", "base"}
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


def style():
    import matplotlib
    import seaborn as sns

    return matplotlib.rc_context({**sns.axes_style("whitegrid"), **sns.plotting_context("paper")})


def styled(fn):
    """Build the whole figure inside the paper style (fonts and ticks are fixed when artists are created)."""
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        with style():
            return fn(*args, **kwargs)
    return wrapper


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


def available(df, metrics, figure, need=()) -> list[str]:
    have = [m for m in metrics if m in df.columns and df[m].notna().any()]
    missing = [c for c in need if c not in df.columns or not df[c].notna().any()]
    if missing or not have:
        raise NpuMoeError(f"figure {figure} needs column(s) {', '.join(need + tuple(metrics[:1]))} with values; "
                          f"the results lack {', '.join(missing or metrics)}")
    return have


def default_knobs(df) -> pd.DataFrame:
    """Rows of the default configuration: those without sweep knobs set (sweep rows go to the sweep figures);
    all rows when every row has a knob."""
    knobs = [k for k in SWEEP_KNOBS if k in df.columns]
    plain = df[df[knobs].isna().all(axis=1)] if knobs else df
    return plain if len(plain) else df


def config(df, hue: bool = False) -> list[str]:
    """Columns that identify a configuration: the known ones, any extra text/int column, and plan_hash (which
    separates plans differing in a knob without its own column). Hue (legend) columns leave out the hashes."""
    extra = [c for c in df.columns if c not in CONFIG and c not in NOT_CONFIG and not c.startswith("timing_source")
             and not c.endswith("_x") and not pd.api.types.is_float_dtype(df[c])]
    cols = [c for c in CONFIG if c in df.columns] + extra + ([] if hue else ["plan_hash"] * ("plan_hash" in df))
    return [c for c in cols if df[c].notna().any()]


def stats(df, metric) -> pd.DataFrame:
    """Median, min, max, n of `metric` over repeats, one row per configuration; keeps the drawn rows' sources."""
    keys = config(df)
    d = df.dropna(subset=[metric])
    st = d.groupby(keys, dropna=False, sort=False)[metric].agg(median="median", lo="min", hi="max", n="count")
    st = st.reset_index()
    st.attrs["source"] = source_label(d) if metric in TIMED else None
    return st


def varying(st, exclude=()) -> list[str]:
    """Configuration columns that vary independently of `exclude` (the axis/facet columns) and of each other:
    a column determined by those (e.g. an energy note per platform) would only repeat them in the legend."""
    given = [c for c in exclude if c in st.columns and st[c].notna().any()]
    chosen = []
    for c in config(st, hue=True):
        if c in exclude or st[c].nunique(dropna=True) < 2:
            continue
        by = given + chosen
        if by and (st.groupby(by, dropna=False)[c].nunique(dropna=False) <= 1).all():
            continue
        chosen.append(c)
    return chosen


def hue_names(st, cols) -> pd.Series:
    if not cols:
        return pd.Series([""] * len(st), index=st.index)
    return st[cols].astype(str).apply(lambda r: ", ".join(f"{c}={v}" for c, v in r.items()), axis=1)


def facets(df) -> list[tuple[str, pd.DataFrame]]:
    cols = [c for c in FACETS if c in df.columns and df[c].nunique(dropna=True) > 1]
    if not cols:
        return [(" · ".join(str(df[c].dropna().iloc[0]) for c in FACETS if c in df and df[c].notna().any()), df)]
    return [(" · ".join(map(str, k if isinstance(k, tuple) else (k,))), g)
            for k, g in df.groupby(cols, dropna=False, sort=True)]


def bars(ax, st, metric, title, ylabel=None, source_rows=None):
    """Grouped bars: x = variant (paper order), hue = the other varying configuration columns."""
    label, scale = LABELS.get(metric, (ylabel, 1.0)) if metric else (ylabel, 1.0)
    order = [v for v in VARIANT_ORDER if v in set(st["variant"])] + \
        sorted(set(st["variant"]) - set(VARIANT_ORDER))
    hues = hue_names(st, varying(st, exclude=("variant", *FACETS)))
    names = list(dict.fromkeys(hues))
    width = 0.8 / len(names)
    colors = palette(len(names))
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
    finish(ax, title, st.attrs.get("source") if source_rows is None else source_label(source_rows), names)


def finish(ax, title, source, hues):
    if source:  # on every time/energy panel: a line between the title and the axes, never over the data
        ax.text(0.0, 1.015, source, transform=ax.transAxes, ha="left", va="bottom", fontsize=5.5, color="0.3",
                gid=SOURCE_GID)
    if title:
        ax.set_title(title, fontsize=8, pad=10 if source else 4)
    if len([h for h in hues if h]) > 1:
        ax.legend(fontsize=5.5, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)


def figure(nrows, ncols, w, h):
    from matplotlib.figure import Figure

    fig = Figure(figsize=(w * ncols, h * nrows), layout="constrained")
    return fig, fig.subplots(nrows, ncols, squeeze=False)


def palette(n):
    import seaborn as sns

    return sns.color_palette("colorblind", max(n, 1))
