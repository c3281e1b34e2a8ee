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
            rows = next((a for a in args if isinstance(a, pd.DataFrame)), None)
            if rows is not None and getattr(fig, "_suptitle", None) is None:
                title = figure_title(fn.__name__, rows)
                notes = getattr(fig, "npumoe_notes", None)      # what every panel shares, said once
                if notes:
                    title += "\n" + "\n".join(textwrap.fill(n, 110) for n in notes)
                w, h = fig.get_size_inches()
                fig.set_size_inches(w, h + 0.5 * (title.count("\n") + 1))   # the title gets its own room
                fig.suptitle(title, fontsize=8)
            one_scale_per_column(fig)
            figcheck.record(fn.__name__, fig)
            return fig
    return wrapper


_GENERALITY = {"linear": 0, "log": 1, "symlog": 2}


def one_scale_per_column(fig) -> None:
    """Panels of one grid column that show the same quantity get one scale (the most general of theirs: symlog >
    log > linear), so they read against each other (figcheck flags a mix). Bar panels decide their column's scale
    up front (hbars' `log=`), so this only ever turns point and line panels."""
    groups = {}
    for ax in fig.axes:
        spec = ax.get_subplotspec() if hasattr(ax, "get_subplotspec") else None
        if spec is None or not ax.get_visible() or ax.get_label() == "<colorbar>":
            continue
        for axis in ("x", "y"):
            label = ax.get_xlabel() if axis == "x" else ax.get_ylabel()
            groups.setdefault((axis, id(spec.get_gridspec()), spec.colspan.start, label), []).append(ax)
    for (axis, *_), axes in groups.items():
        scales = [getattr(a, f"get_{axis}scale")() for a in axes]
        if len(set(scales)) < 2:
            continue
        target = max(scales, key=_GENERALITY.get)
        lows = [getattr(a, f"get_{axis}lim")()[0] for a in axes]
        if target == "log" and min(lows) <= 0:
            target = "symlog"
        kw = {}
        if target == "symlog":
            done = [getattr(a, f"{axis}axis")._scale for a in axes if getattr(a, f"get_{axis}scale")() == "symlog"]
            top = max(abs(getattr(a, f"get_{axis}lim")()[1]) for a in axes)
            kw["linthresh"] = min([s.linthresh for s in done] or [float(10 ** np.floor(np.log10(top * 1e-3)))])
        for a in axes:
            getattr(a, f"set_{axis}scale")(target, **kw)
            if target == "log":
                log_ticks(a, axis)


WHAT = {"plot_baselines": "TTFT, energy and CPU cycles per variant", "plot_ablation": "ablation: TTFT speedup over "
        "npumoe-base", "plot_accuracy": "accuracy vs drop rate", "plot_tiers": "padding vs drop rate",
        "plot_grouping": "group size vs TTFT / energy / NPU calls", "plot_residency": "hot threshold vs TTFT / energy"}


def _values(rows, col, fmt=str) -> str | None:
    if col not in rows.columns:
        return None
    vals = [v for v in pd.unique(rows[col]) if v is not None and not (not isinstance(v, str) and pd.isna(v))]
    return "/".join(fmt(v) for v in sorted(vals, key=str)[:4]) + ("/..." if len(vals) > 4 else "") if vals else None


def figure_title(name: str, rows: pd.DataFrame) -> str:
    """What the figure shows and where: model, platform(s), prompt, chunk, workload or routing source."""
    what = WHAT.get(name, name.replace("plot_", "").replace("_", " "))
    parts = [("model", _values(rows, "model")), ("on", _values(rows, "platform")),
             ("prompt", _values(rows, "prompt_len")), ("chunk", _values(rows, "chunk")),
             ("workload", _values(rows, "workload"))]
    routing = _values(rows, "routing_source")
    if routing:
        parts.append(("routing", routing.split(" (")[0]))
    text = " · ".join(f"{k} {v}" for k, v in parts if v)
    return "\n".join(textwrap.wrap(f"{what} — {text}" if text else what, 110))


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
    busy = "host_busy" in d.columns and metric in TIMED
    st["busy"] = (d.assign(_b=d["host_busy"].fillna(False).astype(bool)).groupby(keys, dropna=False, sort=False)
                  ["_b"].any().to_numpy()) if busy else False
    st = st.reset_index()
    st.attrs["source"] = metric_source(d, metric) if metric in TIMED else None
    reasons = d.loc[d["host_busy"].fillna(False).astype(bool), "host_busy_reason"].dropna() \
        if busy and "host_busy_reason" in d.columns else pd.Series(dtype=object)
    st.attrs["busy_reason"] = str(reasons.iloc[0]) if len(reasons) else ("host busy" if st["busy"].any() else None)
    return st


def with_interval(st, df, metric) -> pd.DataFrame:
    """`st` (stats) with lo / hi = the rows' 90 % interval over parameter draws (`{metric}_lo/_hi`, modeled rows)
    when every configuration is one value (no repeats to take an IQR over) and every row has its interval;
    attrs['whiskers'] says what the whiskers are. Otherwise `st` unchanged (IQR over repeats)."""
    lo, hi = f"{metric}_lo", f"{metric}_hi"
    if lo not in df.columns or hi not in df.columns or (st["n"] > 1).any():
        return st
    d = df.dropna(subset=[metric])
    if d[[lo, hi]].isna().any().any():
        return st
    g = d.groupby(config(df), dropna=False, sort=False)      # the same keys and order as stats()
    out = st.copy()
    out["lo"], out["hi"] = g[lo].median().to_numpy(), g[hi].median().to_numpy()
    out.attrs = {**st.attrs, "whiskers": "whiskers: 90 % interval (parameter draws)"}
    return out


def unit(metric, values) -> tuple[str, float]:
    """(axis label, scale) of a metric for these values: TTFT in ms when every value is below 1 s."""
    label, scale = LABELS.get(metric, (metric, 1.0))
    v = pd.to_numeric(pd.Series(values), errors="coerce").dropna()
    if metric == "ttft_s" and len(v) and float(v.abs().max()) < 1.0:
        return "TTFT (ms)", 1e3
    return label, scale


def wants_log(values) -> bool:
    """Whether values span more than LOG_SPAN (auto_scale's rule), decided once for a whole column of panels."""
    v = np.asarray(pd.to_numeric(pd.Series(values), errors="coerce").dropna(), dtype=float)
    pos = v[v > 0]
    return bool(pos.size >= 2 and not (v < 0).any() and pos.max() / pos.min() >= LOG_SPAN)


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


# index into seaborn's colorblind palette: npumoe (the method) gets the most salient colour, vermillion; the
# reference is grey, the baselines and ablation steps the quieter hues
_PALETTE_INDEX = {"reference": 7, "cpu-only": 0, "naive-npu": 5, "anemll": 4, "npumoe-base": 9, "npumoe-t": 2,
                  "npumoe-tg": 8, "npumoe": 3, "npumoe-spill": 6}


def variant_colors() -> dict:
    import seaborn as sns

    pal = sns.color_palette("colorblind", 10)
    return {v: pal[i] for v, i in _PALETTE_INDEX.items()}


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
        log_ticks(ax, axis)


def log_ticks(ax, axis: str) -> None:
    """Labelled ticks at 1, 2 and 5 per decade and unlabelled minor ticks: a panel spanning less than a decade
    still has labels, and matplotlib's crowded minor labels (3x10^0 over 4x10^0) never appear."""
    from matplotlib.ticker import FuncFormatter, NullFormatter
    a = ax.xaxis if axis == "x" else ax.yaxis
    a.set_major_locator(_LogTicks())
    a.set_major_formatter(FuncFormatter(lambda v, _: f"{v:.4g}" if abs(v) < 1e4 else f"{v:.0f}"))
    a.set_minor_formatter(NullFormatter())


def _log_ticks_class():
    from matplotlib.ticker import Locator, LogLocator, MaxNLocator

    class LogTicks(Locator):
        """1-2-5 per decade over a wide view; three plain ticks over a view narrower than 5x (where the 1-2-5
        ticks would leave one label, and matplotlib's fallback crowds a narrow panel)."""
        def __call__(self):
            vmin, vmax = sorted(self.axis.get_view_interval())
            return self.tick_values(vmin, vmax)

        def tick_values(self, vmin, vmax):
            if vmin > 0 and vmax / vmin >= 5:
                return LogLocator(base=10, subs=(1.0, 2.0, 5.0)).tick_values(vmin, vmax)
            return MaxNLocator(3).tick_values(vmin, vmax)
    return LogTicks


def _LogTicks():
    return _log_ticks_class()()


def finish(ax, title, source, width_chars: int = 70) -> None:
    """Title, and on every time/energy panel the metric's source between the title and the axes."""
    pad = 4
    if source:
        text = "\n".join(textwrap.wrap(source, width_chars)) or source
        ax.text(0.0, 1.01, text, transform=ax.transAxes, ha="left", va="bottom", fontsize=5, color="0.3",
                gid=SOURCE_GID, linespacing=1.0)
        pad += 6.5 * (text.count("\n") + 1)
    if title:   # long facet names wrap instead of running into the next panel's title
        ax.set_title("\n".join(textwrap.wrap(title, 48, break_on_hyphens=False)) or title, fontsize=7, pad=pad)


BUSY_HATCH = "////"


def hbars(ax, st, metric, title, source=None, xlabel=None, names=True, log=None, unit_of=None, note=None):
    """One value per variant (top to bottom in paper order), coloured by variant, IQR whiskers: bars on a linear
    axis, points on a log one (a bar's length means nothing on a log axis). `log`: the column's decision (one
    scale per column), else these values'. `unit_of`: the values that pick the unit (the column's). Rows timed on
    a busy host are drawn hatched and pale (hollow points), with the reason in the axis note (a legend inside the
    panel would cover data). `names`: True, False (blank), or one tick label per variant in paper order."""
    label, scale = unit(metric, st["median"] if unit_of is None else unit_of) if metric else (xlabel, 1.0)
    order = variant_order(st["variant"])
    s = st.set_index("variant").reindex(order)
    y = np.arange(len(order))
    x = s["median"].to_numpy(dtype=float) * scale
    busy = s["busy"].fillna(False).astype(bool).to_numpy() if "busy" in s else np.zeros(len(order), bool)
    log = wants_log(x) if log is None else log
    colors = [color_of(v) for v in order]
    if log:
        for yi, xi, c, b in zip(y, x, colors, busy):
            ax.plot([xi], [yi], "o", ms=4, color=c, alpha=0.4 if b else 1.0, mfc="white" if b else c)
    else:
        bars = ax.barh(y, x, color=colors, height=0.7)
        for bar, b in zip(bars, busy):
            if b:
                bar.set_alpha(0.35)
                bar.set_hatch(BUSY_HATCH)
                bar.set_edgecolor("0.3")
    notes = [note] if note else []     # `note`: a line of its own in the axis note
    if (s["n"] > 1).any() or st.attrs.get("whiskers"):
        # the interval exactly as stored, centred on itself: a point may lie at or past an end of it
        lo, hi = s["lo"].to_numpy(dtype=float) * scale, s["hi"].to_numpy(dtype=float) * scale
        ax.errorbar((lo + hi) / 2, y, xerr=np.clip((hi - lo) / 2, 0, None), fmt="none", ecolor="black",
                    elinewidth=0.8, capsize=2)
        notes.append(st.attrs.get("whiskers") or f"whiskers: IQR over {int(s['n'].max())} repeats")
        edge = 1e-6 * np.maximum(np.abs(hi), 1e-300)
        if st.attrs.get("whiskers") and ((x <= lo + edge) | (x >= hi - edge)).any():
            notes.append("a point at or past an end of its interval: its parameter values sit at one end of the "
                         "ranges drawn")
    if busy.any():
        reason = st.attrs.get("busy_reason") or "host busy"
        notes.append(("hollow" if log else "hatched") + f": timed on a busy host ({reason})")
    ax.set_yticks(y, order if names is True else list(names) if names else [""] * len(order))
    ax.invert_yaxis()
    ax.set_xlabel("\n".join([label, *("\n".join(textwrap.wrap(n, 52)) for n in notes)]))
    if log:       # the column's decision, even where this panel's own values span less
        pos = x[np.isfinite(x) & (x > 0)]
        if len(pos) and (x[np.isfinite(x)] > 0).all():
            ax.set_xscale("log")
            log_ticks(ax, "x")
        elif len(pos):
            ax.set_xscale("symlog", linthresh=float(10 ** np.floor(np.log10(pos.min()))))
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
