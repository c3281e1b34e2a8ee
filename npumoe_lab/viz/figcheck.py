"""Legibility checks of a rendered matplotlib figure, used by the tests and by `NPUMOE_FIGURE_AUDIT`.

A figure fails when: its data axes cover less than half of the figure, a legend has more than 12 entries, two
visible text boxes overlap, a text or a legend inside a panel covers data (a bar, a whisker, a point or a data
line: overlap_with_data), a panel showing time or energy carries no source label (gid `timing-source`), it has
no title (a figure title, or the axes title of a one-panel figure: what and where), a bar starts from zero on a
log axis (its length means nothing there: draw points), or the panels of one grid column use different scales
for the same quantity (one scale per column: panels are read against each other).
Setting NPUMOE_FIGURE_AUDIT=<file> makes every figure built by `npumoe_lab.viz.plots` append one JSON line
{"figure": name, "problems": [...]} to that file (the notebook tests read it from their kernels).
"""
from __future__ import annotations

import json
import os

import numpy as np

MIN_AXES_SHARE = 0.5
MAX_LEGEND_ENTRIES = 12
TIMED_WORDS = ("TTFT", "time", "energy", "cycles", "(s)", "(ms)")
SOURCE_GID = "timing-source"


def _data_axes(fig):
    # colorbars are axes too, but they are not where the data is drawn
    return [ax for ax in fig.axes if ax.get_visible() and not hasattr(ax, "_colorbar")
            and ax.get_label() != "<colorbar>"]


def _drawn_texts(fig):
    """Every text the figure draws: titles, axis labels, tick labels in view, annotations, legends."""
    out = list(fig.texts)
    for leg in list(fig.legends) + [ax.get_legend() for ax in fig.axes if ax.get_legend()]:
        out += list(leg.get_texts()) + [leg.get_title()]
    for ax in fig.axes:
        if not ax.get_visible():
            continue
        out += [ax.title, ax._left_title, ax._right_title, *ax.texts]
        for axis in (ax.xaxis, ax.yaxis):
            out += [axis.label, axis.offsetText]
            for tick in axis._update_ticks():      # only the ticks inside the view are drawn
                out += [tick.label1, tick.label2]
    return out


def _texts(fig, renderer):
    out = []
    for t in _drawn_texts(fig):
        if not t.get_visible() or not t.get_text().strip() or t.get_alpha() == 0:
            continue
        try:
            bb = t.get_window_extent(renderer)
        except (RuntimeError, ValueError):
            continue
        if bb.width > 0 and bb.height > 0:
            out.append((t, bb))
    return out


def _overlaps(texts, tol: float = 1.0) -> list[str]:
    found = []
    for i, (a, ba) in enumerate(texts):
        for b, bb in texts[i + 1:]:
            w = min(ba.x1, bb.x1) - max(ba.x0, bb.x0)
            h = min(ba.y1, bb.y1) - max(ba.y0, bb.y0)
            if w > tol and h > tol:
                found.append(f"text {a.get_text()[:30]!r} overlaps {b.get_text()[:30]!r}")
    return found


def audit_figure(fig) -> list[str]:
    """Problems of a figure as sentences (empty list = legible)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    canvas = fig.canvas if hasattr(fig.canvas, "get_renderer") else FigureCanvasAgg(fig)  # pyplot-free figures
    canvas.draw()
    renderer = canvas.get_renderer()
    problems = []
    axes = _data_axes(fig)
    fw, fh = fig.bbox.width, fig.bbox.height
    share = sum(ax.get_window_extent(renderer).width * ax.get_window_extent(renderer).height for ax in axes) / (fw * fh)
    if share < MIN_AXES_SHARE:
        problems.append(f"axes cover {share:.0%} of the figure (< {MIN_AXES_SHARE:.0%})")
    legends = [ax.get_legend() for ax in fig.axes if ax.get_legend()] + list(fig.legends)
    for leg in legends:
        n = len([t for t in leg.get_texts() if t.get_text()])
        if n > MAX_LEGEND_ENTRIES:
            problems.append(f"a legend has {n} entries (> {MAX_LEGEND_ENTRIES})")
    problems += _overlaps(_texts(fig, renderer))
    problems += overlap_with_data(fig, renderer)
    for ax in axes:
        label = f"{ax.get_ylabel()} {ax.get_xlabel()}"
        if any(w in label for w in TIMED_WORDS) and not [t for t in ax.texts if t.get_gid() == SOURCE_GID]:
            problems.append(f"panel {ax.get_ylabel()!r} shows time/energy without a source label")
    problems += missing_title(fig, axes) + bars_on_log_axes(axes) + scale_mismatches(axes)
    return problems


def _clipped(bb, box):
    """`bb` cut to the panel's box (bars and lines are clipped there), or None when nothing of it is inside."""
    from matplotlib.transforms import Bbox
    x0, y0, x1, y1 = max(bb.x0, box.x0), max(bb.y0, box.y0), min(bb.x1, box.x1), min(bb.y1, box.y1)
    return Bbox([[x0, y0], [x1, y1]]) if x1 >= x0 and y1 >= y0 else None


def _segment_boxes(points, half_width: float):
    """Boxes around each straight piece of a polyline in display space, widened by half its line width."""
    from matplotlib.transforms import Bbox
    out = []
    for (xa, ya), (xb, yb) in zip(points[:-1], points[1:]):
        if all(map(np.isfinite, (xa, ya, xb, yb))):
            out.append(Bbox([[min(xa, xb) - half_width, min(ya, yb) - half_width],
                             [max(xa, xb) + half_width, max(ya, yb) + half_width]]))
    return out


def _data_boxes(ax, renderer) -> list:
    """(what, display box) of everything a panel draws as data: bars, whisker lines and caps, markers, lines in
    data coordinates. Reference lines spanning the panel (axvline, axhline: not in data coordinates) are left out."""
    from matplotlib.collections import LineCollection, PathCollection
    from matplotlib.patches import Rectangle
    from matplotlib.transforms import Bbox
    box, px = ax.get_window_extent(renderer), ax.figure.dpi / 72
    out = []
    for patch in ax.patches:
        # a span across the panel (axvspan, axhspan: a shaded band, not in data coordinates) is a background
        if isinstance(patch, Rectangle) and patch.get_visible() and patch.get_width() and patch.get_height() \
                and patch.get_data_transform() is ax.transData:
            out.append(("a bar", patch.get_window_extent(renderer)))
    for coll in ax.collections:
        if not coll.get_visible():
            continue
        if isinstance(coll, LineCollection):
            lw = float(np.max(coll.get_linewidths())) if len(coll.get_linewidths()) else 1.0
            for seg in coll.get_segments():
                out += [("a whisker", b) for b in _segment_boxes(coll.get_transform().transform(seg), lw * px / 2)]
        elif isinstance(coll, PathCollection) and len(coll.get_offsets()):
            pts = coll.get_offset_transform().transform(coll.get_offsets())
            sizes = coll.get_sizes() if len(coll.get_sizes()) else [36.0]
            for i, (x, y) in enumerate(pts):
                r = np.sqrt(sizes[i % len(sizes)]) * px / 2
                out.append(("a point", Bbox([[x - r, y - r], [x + r, y + r]])))
    for line in ax.lines:
        if not line.get_visible() or line.get_transform() is not ax.transData:
            continue
        pts = ax.transData.transform(np.column_stack([line.get_xdata(orig=False), line.get_ydata(orig=False)]))
        if line.get_marker() not in (None, "None", "none", "", " "):
            r = line.get_markersize() * px / 2
            out += [("a point", Bbox([[x - r, y - r], [x + r, y + r]])) for x, y in pts if np.isfinite([x, y]).all()]
        if line.get_linestyle() not in ("None", "none", "", " "):
            out += [("a data line", b) for b in _segment_boxes(pts, line.get_linewidth() * px / 2)]
    return [(what, c) for what, b in out if (c := _clipped(b, box)) is not None]


def overlap_with_data(fig, renderer, tol: float = 1.0) -> list[str]:
    """Texts and legends drawn over a panel's data: a label on a bar, a legend over whiskers. A text outside every
    panel (titles, tick and axis labels, a figure legend below the panels) cannot cover data and is not checked."""
    found = []
    for ax in _data_axes(fig):
        data = _data_boxes(ax, renderer)
        if not data:
            continue
        covers = [(f"text {t.get_text()[:30]!r}", t.get_window_extent(renderer)) for t in ax.texts
                  if t.get_visible() and t.get_text().strip()]
        legends = [leg for leg in [ax.get_legend(), *fig.legends] if leg is not None and leg.get_visible()]
        covers += [("the legend", leg.get_window_extent(renderer)) for leg in legends]
        for name, bb in covers:
            for what, d in data:
                if min(bb.x1, d.x1) - max(bb.x0, d.x0) > tol and min(bb.y1, d.y1) - max(bb.y0, d.y0) > tol:
                    found.append(f"{name} covers {what} in panel {ax.get_title()[:40]!r}")
                    break
    return found


def missing_title(fig, axes) -> list[str]:
    title = fig._suptitle.get_text().strip() if getattr(fig, "_suptitle", None) is not None else ""
    if title or (len(axes) == 1 and axes[0].get_title().strip()):
        return []
    return ["the figure has no title (say what it shows and where: model, platform, prompt, chunk, routing)"]


def bars_on_log_axes(axes) -> list[str]:
    """Bars whose length starts at zero (or the axis edge) on a log or symlog value axis."""
    from matplotlib.container import BarContainer
    found = []
    for ax in axes:
        for cont in ax.containers:
            if not isinstance(cont, BarContainer) or not cont.patches:
                continue
            horizontal = getattr(cont, "orientation", None) == "horizontal"
            scale = ax.get_xscale() if horizontal else ax.get_yscale()
            starts = [p.get_x() if horizontal else p.get_y() for p in cont.patches]
            if scale in ("log", "symlog") and any(v <= 0 for v in starts):
                name = ax.get_xlabel() if horizontal else ax.get_ylabel()
                found.append(f"panel {name!r} draws bars on a {scale} axis (a bar's length means nothing there: "
                             "draw points, or a linear axis)")
    return found


def scale_mismatches(axes) -> list[str]:
    """Axes of one grid column that show the same quantity (axis label) on different scales."""
    found, groups = [], {}
    for ax in axes:
        spec = ax.get_subplotspec() if hasattr(ax, "get_subplotspec") else None
        if spec is None:
            continue
        grid = id(spec.get_gridspec())
        groups.setdefault(("x", grid, spec.colspan.start, ax.get_xlabel()), []).append(ax.get_xscale())
        groups.setdefault(("y", grid, spec.colspan.start, ax.get_ylabel()), []).append(ax.get_yscale())
    for (axis, _, col, label), scales in groups.items():
        if len(set(scales)) > 1:
            found.append(f"column {col} mixes {axis} scales {sorted(set(scales))} for {label!r}: use one scale "
                         "per column")
    return found


def record(name: str, fig) -> None:
    """Append this figure's audit to $NPUMOE_FIGURE_AUDIT (when set)."""
    path = os.environ.get("NPUMOE_FIGURE_AUDIT")
    if not path:
        return
    with open(path, "a") as fh:
        fh.write(json.dumps({"figure": name, "problems": audit_figure(fig)}) + "\n")
