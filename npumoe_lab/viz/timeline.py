"""The prefill timeline as a picture: a Gantt chart of one prefill (events, `timeline.to_frame` or `load_timelines`).

One lane per role (NPU, CPU) under a "critical path" lane; bars coloured by op kind (`ops.OP_KINDS`, read from the
event name); the NPU's per-call dispatch + sync hatched where the platform's cost model is given; chunk boundaries
dashed; the critical path (walked back from the last-ending event) underlined in red in the role lanes. Above
`max_events` events the ops of one (chunk, layer, kind, role) merge into one span, so a paper-scale prefill stays
legible. A side panel sums the critical path per kind. Every figure says whether its times are measured or modeled.
"""
from __future__ import annotations

import re

import numpy as np
import pandas as pd

from npumoe_lab.devices import as_platform
from npumoe_lab.errors import NpuMoeError
from npumoe_lab.results.atomic import is_temp
from npumoe_lab.results.store import KIND_KEY
from npumoe_lab.viz.plot_helpers import SOURCE_GID, style
from npumoe_lab.execution.timeline import to_frame

# ops.OP_KINDS -> (legend label, colour: colour-blind safe, fixed so every figure reads the same)
KIND_STYLE = {
    "attention": ("attention", "#0173b2"),
    "router": ("router", "#ece133"),
    "shared_experts": ("shared experts", "#ca9161"),
    "experts_hf": ("experts (HF, dropless)", "#d55e00"),
    "dispatch": ("dispatch (route to slots)", "#cc78bc"),
    "pack": ("pack", "#fbafe4"),
    "expert_group": ("group call (static graph)", "#029e73"),
    "experts_dynamic": ("cold / spilled experts (CPU)", "#de8f05"),
    "scatter": ("scatter", "#56b4e9"),
    "other": ("rest of the chunk", "#c8c8c8"),
}
_NAMED = {"attention": "attention", "router": "router", "shared_experts": "shared_experts", "experts": "experts_hf",
          "dispatch": "dispatch", "pack": "pack", "cold": "experts_dynamic", "spill": "experts_dynamic",
          "scatter": "scatter", "other": "other"}
CRITICAL_GID, OVERHEAD_GID = "critical-path", "dispatch-sync"
MAX_EVENTS = 3000


def op_kind(name: str) -> str:
    """The ops.Op kind of an event name (the engine names group calls group<id>)."""
    return "expert_group" if re.fullmatch(r"group\d+", name) else _NAMED.get(name, "other")


def events_frame(frame_or_events) -> pd.DataFrame:
    """One scheduled prefill as a frame with positional rows, `deps` as tuples of positions and a `kind` column."""
    if isinstance(frame_or_events, pd.DataFrame):
        df = frame_or_events.copy()
    else:
        df = to_frame(list(frame_or_events))
    if df.empty:
        raise NpuMoeError("the timeline has no events")
    keys = [c for c in ("model", "variant", "platform", "prompt_len", "sample") if c in df.columns]
    many = [c for c in keys if df[c].nunique(dropna=False) > 1]
    if many:
        raise NpuMoeError(f"the timeline frame holds several prefills (columns {', '.join(many)} vary); select one, "
                          "e.g. frame[(frame.variant == 'npumoe') & (frame.sample == 0)]")
    if df["start_s"].isna().any():
        raise NpuMoeError("the events have no start times; schedule them first (timeline.schedule(events))")
    if "event" in df.columns:
        df = df.sort_values("event")
        pos = {int(e): i for i, e in enumerate(df["event"])}
    else:
        pos = {i: i for i in range(len(df))}
    df = df.reset_index(drop=True)

    def parse(d):
        items = d.split() if isinstance(d, str) else ([] if d is None or isinstance(d, float) else list(d))
        return tuple(pos[int(x)] for x in items)
    df["deps"] = df["deps"].map(parse)
    df["end_s"] = df["start_s"] + df["duration_s"]
    df["kind"] = df["name"].map(op_kind)
    return df


def critical_path(frame_or_events, shared_queue: bool | None = None) -> list[int]:
    """Positions (ascending) of the events on the critical path: from the last-ending event, step to whichever
    of its deps and its queue predecessor ends last (a dep on a tie), while that one ends when it starts.
    `shared_queue`: one queue for both roles (npu_shares_cpu); None infers it (no NPU/CPU overlap in time)."""
    df = events_frame(frame_or_events)
    start, end, dev = df["start_s"].to_numpy(), df["end_s"].to_numpy(), df["device"].to_numpy()
    if shared_queue is None:
        shared_queue = not _roles_overlap(start, end, dev)
    prev, last = [], {}
    for i, d in enumerate(dev):               # queue predecessor: the previous event submitted to the same queue
        q = "all" if shared_queue else d
        prev.append(last.get(q))
        last[q] = i
    tol = 1e-9 * max(float(end.max()), 1e-12)
    i = int(np.flatnonzero(end >= end.max() - tol)[-1])
    path = [i]
    while True:
        deps = df.at[i, "deps"]
        cands = list(deps) + ([prev[i]] if prev[i] is not None else [])
        if not cands:
            break
        best = max(cands, key=lambda j: (end[j], j in deps))
        if end[best] < start[i] - tol:       # nothing held it back: it started at its own time
            break
        i = best
        path.append(i)
    return sorted(path)


def _roles_overlap(start, end, dev) -> bool:
    npu, cpu = dev == "npu", dev == "cpu"
    if not npu.any() or not cpu.any():
        return False
    s, e = start[cpu], end[cpu]
    order = np.argsort(s)
    s, e = s[order], np.maximum.accumulate(e[order])
    for a, b in zip(start[npu], end[npu]):         # any CPU interval strictly inside (a, b)?
        k = np.searchsorted(s, b, side="left")      # CPU events starting before b
        if k and e[k - 1] > a and b > a:
            return True
    return False


def _spans(df: pd.DataFrame, max_events: int) -> tuple[pd.DataFrame, bool]:
    """Bars to draw: the events, or above max_events one span per (chunk, layer, kind, role)."""
    if len(df) <= max_events:
        return df, False
    g = df.groupby(["chunk", "layer", "kind", "device"], sort=False)
    spans = g.agg(start_s=("start_s", "min"), end_s=("end_s", "max"), duration_s=("duration_s", "sum"),
                  overhead_s=("overhead_s", "sum"), critical=("critical", "any")).reset_index()
    return spans, True


def timeline(frame_or_events, title: str | None = None, platform=None, host: str | None = None,
             max_events: int = MAX_EVENTS, shared_queue: bool | None = None, width: float = 10.0):
    """Gantt chart of one scheduled prefill -> matplotlib Figure (no pyplot state).

    `platform` (a devices.Platform or its name): hatches the modeled NPU dispatch + sync of each call
    (calls x (dispatch_s + sync_s)); `host`: named in the 'measured' label. A frame of several prefills raises."""
    with style():
        return _draw(frame_or_events, title, platform, host, max_events, shared_queue, width)


def _draw(frame_or_events, title, platform, host, max_events, shared_queue, width):
    from matplotlib.figure import Figure
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    df = events_frame(frame_or_events)
    crit = critical_path(df, shared_queue)
    df["critical"] = False
    df.loc[crit, "critical"] = True
    platform = as_platform(platform)
    per_call = (platform.npu.dispatch_s + platform.npu.sync_s) if platform is not None else 0.0
    modeled_npu = (df["device"] == "npu") & (df["timing_source"] == "modeled")
    df["overhead_s"] = np.where(modeled_npu, np.minimum(df["calls"] * per_call, df["duration_s"]), 0.0)
    ttft = float(df["end_s"].max())
    scale, unit = (1e3, "ms") if ttft < 1.0 else (1.0, "s")
    spans, merged = _spans(df, max_events)
    lanes = ["critical path"] + [d for d in ("npu", "cpu") if (df["device"] == d).any()]
    y = {name: len(lanes) - 1 - k for k, name in enumerate(lanes)}        # critical path on top
    sources = sorted(set(df["timing_source"]))

    fig = Figure(figsize=(width, 1.1 + 0.55 * len(lanes)), layout="constrained")
    ax, side = fig.subplots(1, 2, gridspec_kw={"width_ratios": [4.2, 1.0]})
    kinds = [k for k in KIND_STYLE if (df["kind"] == k).any()]
    for kind in kinds:
        color = KIND_STYLE[kind][1]
        for lane in lanes:
            if lane == "critical path":   # the critical events themselves, never merged spans (no gaps filled)
                rows = df[df["critical"] & (df["kind"] == kind)]
            else:
                rows = spans[(spans["kind"] == kind) & (spans["device"] == lane)]
            if rows.empty:
                continue
            xr = list(zip(rows["start_s"] * scale, (rows["end_s"] - rows["start_s"]) * scale))
            # thin white edges separate back-to-back calls (e.g. a layer's groups) while bars are wide enough
            ax.broken_barh(xr, (y[lane] - 0.35, 0.7), facecolors=color, edgecolor="white",
                           linewidth=0.4 if len(spans) < 600 else 0, gid=f"lane-{lane.split()[0]}")
    if per_call and (spans["overhead_s"] > 0).any():
        o = spans[spans["overhead_s"] > 0]
        frac = o["overhead_s"] / o["duration_s"].where(o["duration_s"] > 0, 1.0)   # merged: the members' share
        xr = list(zip(o["start_s"] * scale, (o["end_s"] - o["start_s"]) * frac * scale))
        ax.broken_barh(xr, (y["npu"] - 0.35, 0.7), facecolors="none", edgecolor="0.1", linewidth=0, hatch="////",
                       gid=OVERHEAD_GID)
    for lane in lanes[1:]:                 # red underline: the lane's events on the critical path
        c = spans[(spans["device"] == lane) & spans["critical"]]
        if not c.empty:
            ax.broken_barh(list(zip(c["start_s"] * scale, (c["end_s"] - c["start_s"]) * scale)),
                           (y[lane] - 0.47, 0.1), facecolors="#c00000", edgecolor="none", gid=CRITICAL_GID)
    _chunk_marks(ax, df, scale, top=len(lanes) - 0.5)
    labels = {"critical path": "critical path", "cpu": "CPU",
              "npu": "NPU role (host CPU)" if sources == ["measured"] else "NPU"}
    ax.set_yticks([y[lane] for lane in lanes], [labels[lane] for lane in lanes], fontsize=7)
    ax.tick_params(axis="x", labelsize=6.5)
    ax.set_ylim(-0.6, len(lanes) - 0.5 + 0.45)
    ax.set_xlim(0, ttft * scale * 1.005)
    ax.set_xlabel(f"time since the prefill started ({unit})", fontsize=7)
    ax.grid(axis="y", visible=False)
    src = _source_label(df, sources, host)
    ax.text(0.0, 1.01, src + (" · ops merged per (chunk, layer, kind)" if merged else ""), transform=ax.transAxes,
            ha="left", va="bottom", fontsize=6, color="0.3", gid=SOURCE_GID)
    ax.set_title(f"{title + ' · ' if title else ''}TTFT {ttft * scale:.4g} {unit}", fontsize=8, pad=12)
    _critical_by_kind(side, df, scale, unit)
    handles = [Patch(facecolor=KIND_STYLE[k][1], label=KIND_STYLE[k][0]) for k in kinds]
    if per_call and (spans["overhead_s"] > 0).any():
        handles.append(Patch(facecolor="white", edgecolor="0.1", hatch="////", label="NPU dispatch + sync"))
    handles.append(Line2D([], [], color="#c00000", lw=3, label="on the critical path"))
    fig.legend(handles=handles, loc="outside lower center", ncols=min(len(handles), 5), fontsize=6, frameon=False)
    return fig


def _chunk_marks(ax, df, scale, top):
    starts = df.groupby("chunk")["start_s"].min().sort_index()
    ttft = df["end_s"].max()
    last_label = -np.inf
    for chunk, t in starts.items():
        if chunk != starts.index[0]:
            ax.axvline(t * scale, color="0.35", lw=0.7, ls="--", zorder=0)
        if t - last_label >= ttft / 14:      # thin the labels so they never overlap
            ax.text(t * scale, top + 0.05, f" chunk {chunk}", fontsize=5.5, color="0.3", ha="left", va="bottom")
            last_label = t


def _critical_by_kind(ax, df, scale, unit):
    c = df[df["critical"]].groupby("kind")["duration_s"].sum()
    kinds = [k for k in KIND_STYLE if k in c.index][::-1]
    ax.barh(range(len(kinds)), [c[k] * scale for k in kinds], color=[KIND_STYLE[k][1] for k in kinds])
    ax.set_yticks(range(len(kinds)), [KIND_STYLE[k][0] for k in kinds], fontsize=5.5)
    ax.set_xlabel(f"critical path ({unit})", fontsize=6)
    ax.tick_params(axis="x", labelsize=5.5)
    ax.grid(axis="y", visible=False)


def _source_label(df, sources, host) -> str:
    plat = df["platform"].dropna().iloc[0] if "platform" in df.columns and df["platform"].notna().any() else None
    words = {"modeled": f"modeled (platform {plat or '?'})", "measured": f"measured (host {host or plat or '?'})"}
    return " + ".join(words[s] for s in sources)


# -- `npumoe-lab figures`: one timeline figure per prefill found under a results folder ---------------------------
MAX_FIGURES = 4          # a sweep holds hundreds of prefills: draw the first few, say how many were left out
PREFILL_KEYS = ("model", "variant", "platform", "prompt_len", "chunk_size")   # chunk_size: simulated grids


def timeline_files(results_dir) -> list:
    """Timeline parquet files (tagged by store.write_timeline) below results_dir, as load_timelines finds them."""
    from pathlib import Path

    import pyarrow.parquet as pq

    root = Path(results_dir)
    return [p for p in sorted(root.rglob("*.parquet"))
            if not any(part.startswith((".", "_")) for part in p.relative_to(root).parts[:-1]) and not is_temp(p)
            and (pq.read_schema(p).metadata or {}).get(KIND_KEY) == b"timeline"]


def timeline_figures(results_dir, out_dir, rows: pd.DataFrame | None = None, dpi: int = 200, log=print,
                     limit: int = MAX_FIGURES) -> list:
    """timeline-<model>-<variant>-<platform>-p<prompt>.pdf/.png for the first sample of each prefill in each
    timeline file, at most `limit` figures. `rows` (the results) name the model and host where a timeline lacks
    them. Returns the written paths."""
    from npumoe_lab.viz.plots import save_figure  # lazy: plots imports this module (its timeline figure)
    paths, names, left = [], set(), 0
    for path in timeline_files(results_dir):
        frame = pd.read_parquet(path)
        keys = [k for k in PREFILL_KEYS if k in frame.columns]
        for key, one in (frame.groupby(keys, dropna=False, sort=True) if keys else [((), frame)]):
            if len(names) >= limit:
                left += 1
                continue
            if "sample" in one.columns:
                one = one[one["sample"] == one["sample"].min()]
            info = dict(zip(keys, key if isinstance(key, tuple) else (key,)))
            match = _matching_rows(rows, info)
            for col in ("model", "host"):
                if pd.isna(info.get(col)) and match is not None and match[col].nunique() == 1:
                    info[col] = match[col].iloc[0]
            words = [str(info[k]) for k in ("model", "variant", "platform") if pd.notna(info.get(k))]
            prompt = info.get("prompt_len")
            size = info.get("chunk_size")
            name = "-".join(["timeline", *words] + ([f"p{int(prompt)}"] if pd.notna(prompt) else [])
                            + ([f"c{int(size)}"] if pd.notna(size) else []))
            name = re.sub(r"[^A-Za-z0-9_.-]+", "_", name)
            while name in names:
                name += "-b"
            names.add(name)
            plat = info.get("platform")
            title = " · ".join(words + ([f"prompt {int(prompt)}"] if pd.notna(prompt) else []))
            fig = timeline(one, title=title, host=info.get("host"), platform=_known_platform(plat))
            paths += save_figure(fig, out_dir, name, dpi)
    if left:
        log(f"skipped {left} more timeline(s): at most {limit} timeline figures per results folder")
    return paths


def _matching_rows(rows, info):
    if rows is None or not {"variant", "platform"} <= set(rows.columns):
        return None
    m = rows[(rows["variant"] == info.get("variant")) & (rows["platform"] == info.get("platform"))]
    return m if len(m) and {"model", "host"} <= set(m.columns) else None


def _known_platform(name):
    """The modeled platform of that name (its dispatch/sync parameters), or None (measured or unknown)."""
    try:
        p = as_platform(name) if isinstance(name, str) else None
    except NpuMoeError:
        return None
    return p if p is not None and p.kind != "measured" else None


__all__ = ["timeline", "critical_path", "op_kind", "events_frame", "timeline_figures", "KIND_STYLE"]
