"""The timeline figure against a hand-built prefill: schedule, critical path and drawn bars computed by hand."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from npumoe_lab.viz import plots
from npumoe_lab.errors import NpuMoeError
from npumoe_lab.viz.timeline import CRITICAL_GID, OVERHEAD_GID, critical_path, op_kind, timeline
from npumoe_lab.execution.timeline import Event, schedule, to_frame

# (name, device, duration ms, deps) of one chunk of one MoE layer: attention on the NPU, routing on the CPU, two
# static groups on the NPU (group0 slow, group1 queued behind it), cold experts on the CPU beside them
CHUNK = [("attention", "npu", 2.0, ()), ("router", "cpu", 0.5, (0,)), ("dispatch", "cpu", 0.2, (1,)),
         ("pack", "cpu", 0.3, (2,)), ("group0", "npu", 3.0, (3,)), ("group1", "npu", 1.0, (3,)),
         ("cold", "cpu", 1.0, (3,)), ("scatter", "cpu", 0.4, (4, 5, 6)), ("other", "cpu", 0.5, (7,))]


def hand_events(n_chunks=2, calls=1):
    events = []
    for c in range(n_chunks):
        base = len(events)
        for name, dev, ms, deps in CHUNK:
            d = tuple(base + x for x in deps) + ((base - 1,) if c and name == "attention" else ())
            events.append(Event(name, c, -1 if name == "other" else 0, dev, ms * 1e-3, 0.0, 0.0, "modeled", d,
                                calls=calls if dev == "npu" else 1))
    return events


def test_op_kinds_from_event_names():
    assert [op_kind(n) for n, *_ in CHUNK] == ["attention", "router", "dispatch", "pack", "expert_group",
                                              "expert_group", "experts_dynamic", "scatter", "other"]
    assert op_kind("experts") == "experts_hf" and op_kind("spill") == "experts_dynamic"


def test_critical_path_by_hand_separate_queues():
    ev = schedule(hand_events(1))
    # by hand: attention 0-2 | router 2-2.5 | dispatch -2.7 | pack -3.0 | group0 3-6 (npu) | group1 6-7 (npu queue)
    # | cold 3-4 (cpu, beside group0) | scatter 7-7.4 (waits for group1) | other 7.4-7.9
    assert [round(e.start_s * 1e3, 6) for e in ev] == [0, 2, 2.5, 2.7, 3, 6, 3, 7, 7.4]
    path = critical_path(ev)
    assert path == [0, 1, 2, 3, 4, 5, 7, 8]           # cold experts (6) had slack; group1 waited in the NPU queue
    assert sum(ev[i].duration_s for i in path) == pytest.approx(ev[-1].end_s)   # no gaps on the path


def test_critical_path_by_hand_one_shared_queue():
    ev = schedule(hand_events(1), npu_shares_cpu=True)       # a measured host: one queue, everything serial
    assert critical_path(ev) == list(range(9))                # the queue binds every event (inferred: no overlap)
    # told the queues are separate, the walk stops at cold (7-8): its dep (pack) and CPU predecessor ended at 3
    assert critical_path(ev, shared_queue=False) == [6, 7, 8]


def test_figure_draws_the_hand_computed_critical_path_kinds_and_overhead():
    ev = schedule(hand_events(2, calls=2))
    frame = to_frame(ev).assign(platform="m2-max", variant="npumoe", sample=0)
    fig = plots.timeline(frame, title="hand-built", platform="m2-max")
    ax = fig.axes[0]
    # the red underline: exactly the critical events, in ms (chunk 1 repeats chunk 0 after 7.9 ms)
    crit = [c for c in ax.collections if c.get_gid() == CRITICAL_GID]
    got = sorted((round(p.get_extents().x0, 6), round(p.get_extents().width, 6))
                 for c in crit for p in c.get_paths())
    one = [(0, 2), (2, .5), (2.5, .2), (2.7, .3), (3, 3), (6, 1), (7, .4), (7.4, .5)]
    want = sorted((round(s + off, 6), round(w, 6)) for off in (0.0, 7.9) for s, w in one)
    assert got == want
    # hatched NPU dispatch + sync: 2 calls x (dispatch_s + sync_s) of M2 Max, clipped to each NPU event
    from npumoe_lab.devices import get_platform
    npu = get_platform("m2-max").npu
    per = 2 * (npu.dispatch_s + npu.sync_s) * 1e3
    hatch = [c for c in ax.collections if c.get_gid() == OVERHEAD_GID]
    widths = sorted(round(p.get_extents().width, 9) for c in hatch for p in c.get_paths())
    assert widths == sorted(round(min(per, d), 9) for d in (2.0, 3.0, 1.0) * 2)
    texts = [t.get_text() for t in ax.texts if t.get_gid() == plots.SOURCE_GID]
    assert texts == ["modeled (platform m2-max)"]
    assert "TTFT 15.8 ms" in ax.get_title()
    assert [t.get_text() for t in ax.texts if "chunk" in t.get_text()] == [" chunk 0", " chunk 1"]
    assert [lbl.get_text() for lbl in ax.get_yticklabels()] == ["critical path", "NPU", "CPU"]


def _boxes(fig, artists):
    r = fig.canvas.get_renderer()
    return [a.get_window_extent(r) for a in artists]


def test_legend_outside_the_data_and_labels_do_not_overlap():
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    ev = schedule(hand_events(30))
    fig = timeline(ev, platform="m2-max")
    FigureCanvasAgg(fig).draw()
    (legend,), ax = fig.legends, fig.axes[0]
    lb = _boxes(fig, [legend])[0]
    assert all(not lb.overlaps(b) for b in _boxes(fig, fig.axes))
    labels = [t for t in ax.texts if "chunk" in t.get_text()]
    assert 2 <= len(labels) < 30                                # thinned: 30 chunks, labels spaced apart
    boxes = _boxes(fig, labels)
    assert all(not a.overlaps(b) for i, a in enumerate(boxes) for b in boxes[i + 1:])


def test_measured_label_and_aggregation_above_max_events():
    ev = [e.__class__(**{**e.__dict__, "timing_source": "measured", "start_s": None})
          for e in hand_events(3)]
    ev = schedule(ev, npu_shares_cpu=True)
    fig = timeline(ev, host="ci-box", max_events=10)
    ax = fig.axes[0]
    label = [t.get_text() for t in ax.texts if t.get_gid() == plots.SOURCE_GID][0]
    assert label.startswith("measured (host ci-box)") and "merged per (chunk, layer, kind)" in label
    assert "NPU role (host CPU)" in [lbl.get_text() for lbl in ax.get_yticklabels()]
    # merged: one bar per (chunk, layer, kind, role) in the role lanes -> group0+group1 are one span per chunk
    f = to_frame(ev)
    f["kind"] = f["name"].map(op_kind)
    n_spans = f.groupby(["chunk", "layer", "kind", "device"]).ngroups
    drawn = sum(len(c.get_paths()) for c in ax.collections if c.get_gid() in ("lane-npu", "lane-cpu"))
    assert drawn == n_spans
    assert np.isclose(sum(len(c.get_paths()) for c in ax.collections if c.get_gid() == CRITICAL_GID), n_spans)


def test_bad_input_is_refused_with_a_clear_message():
    frame = to_frame(schedule(hand_events(1)))
    two = pd.concat([frame.assign(variant="a"), frame.assign(variant="b")])
    with pytest.raises(NpuMoeError, match="several prefills"):
        timeline(two)
    with pytest.raises(NpuMoeError, match="schedule them first"):
        timeline(hand_events(1))
    with pytest.raises(NpuMoeError, match="no events"):
        timeline(frame.iloc[:0])


def test_figures_command_draws_one_timeline_per_prefill_capped(tmp_path, capsys):
    from npumoe_lab import cli
    from npumoe_lab.results.store import write_rows, write_timeline
    from npumoe_lab.viz.timeline import MAX_FIGURES
    frame = to_frame(schedule(hand_events(2)))
    variants = ["npumoe", "npumoe-tg", "npumoe-t", "npumoe-base", "naive-npu"]       # one more than the cap
    tl = pd.concat([frame.assign(variant=v, platform="m2-max", sample=s) for v in variants for s in (0, 1)])
    write_timeline(tl, tmp_path / "run" / "timelines")
    write_rows([dict(model="tiny", workload="w", variant=v, platform="m2-max", prompt_len=256, chunk=128, repeat=0,
                     ttft_s=1e-3, timing_source="modeled", host="h") for v in variants], tmp_path / "run")
    assert cli.main(["figures", str(tmp_path / "run"), "--out", str(tmp_path / "figs")]) == 0
    out = capsys.readouterr().out
    made = sorted(p.name for p in (tmp_path / "figs").glob("timeline-*.png"))
    assert len(made) == MAX_FIGURES == 4 and "skipped 1 more timeline(s)" in out
    assert "timeline-tiny-npumoe-m2-max.png" in made     # the model named from the result rows
