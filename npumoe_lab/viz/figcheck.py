"""Legibility checks of a rendered matplotlib figure, used by the tests and by `NPUMOE_FIGURE_AUDIT`.

A figure fails when: its data axes cover less than half of the figure, a legend has more than 12 entries, two
visible text boxes overlap, or a panel showing time or energy carries no source label (gid `timing-source`).
Setting NPUMOE_FIGURE_AUDIT=<file> makes every figure built by `npumoe_lab.viz.plots` append one JSON line
{"figure": name, "problems": [...]} to that file (the notebook tests read it from their kernels).
"""
from __future__ import annotations

import json
import os

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
    for ax in axes:
        label = f"{ax.get_ylabel()} {ax.get_xlabel()}"
        if any(w in label for w in TIMED_WORDS) and not [t for t in ax.texts if t.get_gid() == SOURCE_GID]:
            problems.append(f"panel {ax.get_ylabel()!r} shows time/energy without a source label")
    return problems


def record(name: str, fig) -> None:
    """Append this figure's audit to $NPUMOE_FIGURE_AUDIT (when set)."""
    path = os.environ.get("NPUMOE_FIGURE_AUDIT")
    if not path:
        return
    with open(path, "a") as fh:
        fh.write(json.dumps({"figure": name, "problems": audit_figure(fig)}) + "\n")
