"""Building blocks of the figures in `plots.py`: configurations, aggregation over repeats, per-metric source
labels, facets, scales and legends, so that every figure is legible by construction.

Rules every figure follows (checked by `npumoe_lab.viz.figcheck` in the tests):
- colour = variant (one fixed colour per variant in every figure, one figure-level legend of at most ~10 entries);
  everything else that varies (platform, workload, prompt length, chunk) becomes a facet, never a legend entry;
- one platform and one timing source per axis: measured host seconds and modeled milliseconds never share an axis;
- log axes where the drawn values span more than a factor LOG_SPAN (symlog when zero is among them);
- each time/energy panel is labelled with the source of that very metric (`metric_source`): a measured `cpu`
  row's TTFT is measured, but its energy is measured time x modeled power and its cycles measured CPU time x the
  platform's nominal clock;
- points/bars are medians over `repeat`; error bars span the interquartile range (IQR) of the repeats.
"""
from __future__ import annotations

import functools
import textwrap

import numpy as np
import pandas as pd

from npumoe_lab.viz import figcheck
from npumoe_lab.errors import NpuMoeError

VARIANT_ORDER = ("reference", "cpu-only", "naive-npu", "anemll", "npumoe-base", "npumoe-t", "npumoe-tg",
                 "npumoe", "npumoe-spill")
# Columns that define one configuration: a point/bar aggregates only over `repeat`.
CONFIG = ("model", "workload", "platform", "variant", "prompt_len", "chunk", "n_tiers", "group_size",
          "hot_threshold", "percentile")
ROW_FACETS = ("platform", "timing_source")           # never two platforms / timing sources on one axis
COL_FACETS = ("model", "workload", "prompt_len", "chunk")
FACETS = ("model", "workload")                        # kept for callers of the old name
SWEEP_KNOBS = ("group_size", "hot_threshold", "n_tiers", "percentile")
NOT_CONFIG = {"repeat", "plan_hash", "platform_hash", "model_fingerprint", "platform_profile", "git_commit",
              "versions", "host", "created", "score_name", "median", "lo", "hi", "n", "base", "host_busy_reason",
              "npu_backend", "platform_kind", "energy_note"}
LABELS = {  # (axis label, scale applied to the stored value)
    "ttft_s": ("TTFT (s)", 1.0), "energy_per_token_mj": ("energy per token (mJ/token)", 1.0),
    "cpu_cycles": ("CPU cycles (10⁹ cycles)", 1e-9), "n_npu_calls": ("NPU calls per prefill (count)", 1.0),
    "drop_rate": ("dropped assignments (%)", 100.0), "pad_rate": ("padding (% of NPU slots)", 100.0),
    "accuracy_delta": ("accuracy delta vs reference (points)", 100.0),
    "top1_agree": ("next-token top-1 agreement (%)", 100.0), "kl": ("KL(reference ‖ variant) (nats/token)", 1.0),
    "group_size": ("group size (experts per NPU graph)", 1.0), "n_tiers": ("capacity tiers (count)", 1.0),
    "hot_threshold": ("hot threshold (residency knob, plan units)", 1.0),
}
TIMED = ("ttft_s", "energy_per_token_mj", "energy_j", "cpu_cycles", "cpu_busy_s")
ENERGY = ("energy_per_token_mj", "energy_j")
SOURCE_GID = "timing-source"  # gid of the label text, for tests and post-processing
LOG_SPAN = 30.0
MAX_LEGEND = 10


def style():
    import matplotlib
    import seaborn as sns

    return matplotlib.rc_context({**sns.axes_style("whitegrid"), **sns.plotting_context("paper"),
                                  "font.size": 7, "axes.titlesize": 7, "axes.labelsize": 7, "xtick.labelsize": 6,
                                  "ytick.labelsize": 6, "legend.fontsize": 6})


def styled(fn):
    """Build the whole figure inside the paper style (fonts and ticks are fixed when artists are created); with
    NPUMOE_FIGURE_AUDIT set, record the figure's legibility audit (figcheck)."""
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        with style():
            fig = fn(*args, **kwargs)
            figcheck.record(fn.__name__, fig)
            return fig
    return wrapper


# -- sources ------------------------------------------------------------------------------------------------
def _host(r) -> str:
    h = r.get("host")
    return str(h) if h is not None and pd.notna(h) else "?"


def _platform(r) -> str:
    p = r.get("platform")
    return str(p) if p is not None and pd.notna(p) else "?"


def _one_source(r, metric: str) -> str:
    timing = r.get("timing_source")
    measured = f"measured (host {_host(r)})"
    modeled = f"modeled (platform {_platform(r)})"
    if timing not in ("measured", "modeled", "mixed"):
        return "timing source not recorded"
    if metric in ENERGY:
        energy = r.get("energy_source")
        if energy == "measured":
            return f"{measured} energy"
        if timing == "modeled":
            return modeled
        return f"{measured} time × modeled power (platform {_platform(r)})"
    if metric == "cpu_cycles" and timing != "modeled":
        return f"{measured} CPU time × modeled clock (platform {_platform(r)})"
    return {"measured": measured, "modeled": modeled, "mixed": f"{measured} + {modeled}"}[timing]


def metric_source(rows: pd.DataFrame, metric: str = "ttft_s") -> str:
    """Where the drawn values of `metric` come from, for exactly these rows; several joined by '; '."""
    if "timing_source" not in rows.columns:
        return "timing source not recorded"
    keys = [c for c in ("timing_source", "energy_source", "platform", "host") if c in rows]
    parts = [_one_source(r, metric) for _, r in rows.drop_duplicates(keys).iterrows()]
    busy = "host_busy" in rows.columns and rows["host_busy"].fillna(False).astype(bool).any()
    return "; ".join(sorted(dict.fromkeys(parts))) + (" [HOST BUSY: see host_busy_reason]" if busy else "")


def source_label(rows: pd.DataFrame) -> str:
    return metric_source(rows, "ttft_s")


# -- data ---------------------------------------------------------------------------------------------------
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
    separates plans differing in a knob without its own column). Hue columns leave out the hashes."""
    extra = [c for c in df.columns if c not in CONFIG and c not in NOT_CONFIG and not c.startswith("timing_source")
             and not c.endswith("_x") and not c.endswith("_source") and not pd.api.types.is_float_dtype(df[c])
             and not pd.api.types.is_bool_dtype(df[c])]
    cols = [c for c in CONFIG if c in df.columns] + extra + ([] if hue else ["plan_hash"] * ("plan_hash" in df))
    return [c for c in cols if df[c].notna().any()]


def stats(df, metric) -> pd.DataFrame:
    """Median, IQR bounds (lo = 25th, hi = 75th percentile) and n of `metric` over repeats, one row per
    configuration; attrs['source'] = the metric's source label of the drawn rows (time/energy metrics)."""
    keys = config(df)
    d = df.dropna(subset=[metric])
    g = d.groupby(keys, dropna=False, sort=False)[metric]
    st = pd.DataFrame({"median": g.median(), "lo": g.quantile(0.25), "hi": g.quantile(0.75), "n": g.count()})
    st = st.reset_index()
    st.attrs["source"] = metric_source(d, metric) if metric in TIMED else None
    return st


def facets(df, rows=ROW_FACETS, cols=COL_FACETS) -> list[tuple[str, pd.DataFrame]]:
    """(title, rows) per combination of the facet columns that vary; the title names the facet's platform (or
    'host' for rows without one) and every varying facet value."""
    keys = [c for c in (*rows, *cols) if c in df.columns and df[c].nunique(dropna=False) > 1]
    groups = df.groupby(keys, dropna=False, sort=True) if keys else [((), df)]
    out = []
    for k, g in groups:
        vals = k if isinstance(k, tuple) else (k,)
        plat = g["platform"].dropna().unique() if "platform" in g.columns else []
        head = " + ".join(map(str, plat)) or ("host" if "platform" in g.columns else "")
        parts = [_facet_text(c, v) for c, v in zip(keys, vals) if c not in ("platform", "timing_source")]
        out.append((" · ".join(p for p in (head, *parts) if p), g))
    return out


def _facet_text(col, v) -> str:
    if v is None or (not isinstance(v, str) and pd.isna(v)):
        return "host" if col == "platform" else ""
    return {"prompt_len": f"prompt {v}", "chunk": f"chunk {v}"}.get(col, str(v))


MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*")


def inner_knob(st) -> str | None:
    """The configuration column that varies inside one facet besides the variant (e.g. n_tiers, percentile):
    drawn as marker shapes with their own legend entries, not as more colours."""
    cols = [c for c in config(st, hue=True) if c not in ("variant", *ROW_FACETS, *COL_FACETS)
            and st[c].nunique(dropna=False) > 1]        # a knob left at its default (NaN) is a value too
    return cols[0] if cols else None


DEFAULT = "default"


def knob_markers(values) -> dict:
    """value -> marker; a knob left unset (NaN) is the value DEFAULT."""
    vals = sorted(set(v if pd.notna(v) else DEFAULT for v in values), key=lambda v: (isinstance(v, str), str(v)))
    return dict(zip(vals, MARKERS)) if len(vals) <= len(MARKERS) else {}


def knob_rows(s, knob, val):
    return s[s[knob].isna()] if val == DEFAULT else s[s[knob] == val]


def variant_order(values) -> list[str]:
    present = set(values)
    return [v for v in VARIANT_ORDER if v in present] + sorted(present - set(VARIANT_ORDER))


def variant_colors() -> dict:
    import seaborn as sns

    pal = sns.color_palette("colorblind", len(VARIANT_ORDER))
    return dict(zip(VARIANT_ORDER, pal))


def color_of(variant) -> tuple:
    return variant_colors().get(variant, (0.4, 0.4, 0.4))


# -- drawing ------------------------------------------------------------------------------------------------
def figure(nrows, ncols, w, h):
    from matplotlib.figure import Figure

    fig = Figure(figsize=(w * ncols, h * nrows), layout="constrained")
    return fig, fig.subplots(nrows, ncols, squeeze=False)


def auto_scale(ax, values, axis: str = "y") -> None:
    """Log scale when the values span more than LOG_SPAN (symlog when zero is among them)."""
    v = np.asarray(pd.to_numeric(pd.Series(values), errors="coerce").dropna(), dtype=float)
    pos = v[v > 0]
    if pos.size < 2 or (v < 0).any() or pos.max() / pos.min() < LOG_SPAN:
        return
    setter = ax.set_xscale if axis == "x" else ax.set_yscale
    if (v == 0).any():
        # linear below 1/1000 of the largest value: rounding noise (a dropless KL of 1e-10) is shown as ~0
        # instead of stretching the axis over ten empty decades
        setter("symlog", linthresh=float(10 ** np.floor(np.log10(max(pos.min(), pos.max() * 1e-3)))))
    else:
        setter("log")


def finish(ax, title, source, width_chars: int = 70) -> None:
    """Title, and on every time/energy panel the metric's source between the title and the axes."""
    pad = 4
    if source:
        text = "\n".join(textwrap.wrap(source, width_chars)) or source
        ax.text(0.0, 1.01, text, transform=ax.transAxes, ha="left", va="bottom", fontsize=5, color="0.3",
                gid=SOURCE_GID, linespacing=1.0)
        pad += 6.5 * (text.count("\n") + 1)
    if title:   # long facet names wrap instead of running into the next panel's title
        ax.set_title("\n".join(textwrap.wrap(title, 48)) or title, fontsize=7, pad=pad)


def hbars(ax, st, metric, title, source=None, xlabel=None, names=True):
    """Horizontal bars: one per variant (top to bottom in paper order), coloured by variant, IQR whiskers."""
    label, scale = LABELS.get(metric, (xlabel, 1.0)) if metric else (xlabel, 1.0)
    order = variant_order(st["variant"])
    s = st.set_index("variant").reindex(order)
    y = np.arange(len(order))
    x = s["median"].to_numpy(dtype=float) * scale
    ax.barh(y, x, color=[color_of(v) for v in order], height=0.7)
    if (s["n"] > 1).any():
        err = np.clip([x - s["lo"].to_numpy(dtype=float) * scale, s["hi"].to_numpy(dtype=float) * scale - x], 0, None)
        ax.errorbar(x, y, xerr=err, fmt="none", ecolor="black", elinewidth=0.8, capsize=2)
    ax.set_yticks(y, order if names else [""] * len(order))   # a row of panels names the variants once
    ax.invert_yaxis()
    ax.set_xlabel(label)
    auto_scale(ax, x, "x")
    finish(ax, title, st.attrs.get("source") if source is None else source)


def variant_legend(fig, variants, extra=()) -> None:
    """One legend for the whole figure: a colour per variant (+ extra (handle, label) pairs); a single variant
    is named in the figure title instead (a one-entry legend only costs panel space)."""
    from matplotlib.patches import Patch

    order = variant_order(variants)
    if len(order) == 1 and not extra:
        fig.suptitle(f"variant {order[0]}", fontsize=7, color=color_of(order[0]))
        return
    handles = [Patch(color=color_of(v)) for v in order] + [h for h, _ in extra]
    labels = order + [lab for _, lab in extra]
    if len(labels) > MAX_LEGEND + 2:
        raise NpuMoeError(f"{len(labels)} legend entries: facet the figure instead (colour is for variants only)")
    fig.legend(handles, labels, loc="outside lower center", ncol=min(len(labels), 5), frameon=False, fontsize=6,
               columnspacing=1.2, handlelength=1.2)
