"""Every figure of `make demo` is legible (figcheck: axes >= half the figure, <= 12 legend entries, no overlapping
text, a source label on each time/energy panel), drawn from demo-shaped results of a small stand-in model.
The notebooks' figures are audited the same way in tests/test_notebooks.py."""
from __future__ import annotations

import json

import pytest
from matplotlib.figure import Figure

from npumoe_lab.viz.figcheck import audit_figure
from npumoe_lab.models import TINY_MODEL_DIR


@pytest.fixture(scope="module")
def demo_out(tmp_path_factory):
    """A demo output folder: rows of every variant on cpu (measured, 3 repeats) and m2-max (modeled) at two
    prompt lengths, in sweep-cell folders, plus the calibration profile."""
    if not (TINY_MODEL_DIR / "tokenizer.json").exists():
        pytest.skip("bundled tokenizer not present")
    import os

    from npumoe_lab.execution.calibrate import calibration_profile
    from npumoe_lab.experiments.runner import run_experiment
    from npumoe_lab.models import load_model
    from tests.model_zoo import save_standin
    out = tmp_path_factory.mktemp("demo")
    os.environ["NPUMOE_CACHE"] = str(tmp_path_factory.mktemp("cache"))   # outside: its profiles are not the demo's
    try:
        model = load_model(str(save_standin(out / "standin", TINY_MODEL_DIR)))
        for prompt_len in (128, 256):
            run_experiment(model=model, model_name="standin", workload="fewshot-cls", variants="all",
                           platforms="cpu,m2-max", prompt_len=prompt_len, chunk=64, n_samples=1, calib_tokens=1024,
                           warmup=0, out=out / "sweep" / "cells" / f"p{prompt_len}")
        calibration_profile(*model, "mixed", 64, 1024).save(out / "profiles" / "chunk64")
    finally:
        del os.environ["NPUMOE_CACHE"]
    return out


def test_every_demo_figure_passes_the_audit(demo_out, monkeypatch):
    from npumoe_lab.experiments.demo import draw_figures
    audit = demo_out / "audit.jsonl"
    monkeypatch.setenv("NPUMOE_FIGURE_AUDIT", str(audit))
    paths = draw_figures(demo_out)
    names = {p.stem for p in paths}
    assert {"baselines", "ablation", "accuracy", "tiers", "popularity", "baselines-cpu", "baselines-m2-max"} <= names
    records = [json.loads(line) for line in audit.read_text().splitlines()]
    assert len(records) >= 7
    assert [r for r in records if r["problems"]] == []


def _bad_figure(n_legend=0, tiny_axes=False, overlap=False, timed=False, untitled=False, log_bars=False,
                mixed_scales=False):
    fig = Figure(figsize=(4, 3))
    if not untitled:
        fig.suptitle("what and where")
    if mixed_scales:       # one column, two panels of the same quantity, one log and one linear
        top, bottom = fig.subplots(2, 1)
        for ax in (top, bottom):
            ax.plot([1, 100], [1, 2])
            ax.set_xlabel("TTFT (ms)")
        top.set_xscale("log")
        return fig
    ax = fig.add_axes([0.4, 0.4, 0.2, 0.2] if tiny_axes else [0.1, 0.1, 0.8, 0.8])
    for i in range(n_legend):
        ax.plot([0, 1], [i, i], label=f"line {i}")
    if n_legend:
        ax.legend()
        ax.set_xlim(5, 6)         # the lines out of view: only the legend's size is at fault
    if overlap:
        ax.text(0.5, 0.5, "first label")
        ax.text(0.5, 0.5, "second label")
    if timed:
        ax.set_ylabel("TTFT (s)")
    if log_bars:
        ax.barh([0, 1], [0.01, 10])
        ax.set_xscale("log")
    return fig


@pytest.mark.parametrize("kind, problem", [
    (dict(tiny_axes=True), "axes cover"), (dict(n_legend=13), "13 entries"),
    (dict(overlap=True), "overlaps"), (dict(timed=True), "without a source label"),
    (dict(untitled=True), "has no title"), (dict(log_bars=True), "draws bars on a log axis"),
    (dict(mixed_scales=True), "column 0 mixes x scales ['linear', 'log']")])
def test_the_audit_catches_each_defect(kind, problem):
    assert any(problem in p for p in audit_figure(_bad_figure(**kind)))
    assert audit_figure(_bad_figure(n_legend=3)) == []


def test_a_floating_range_bar_on_a_log_axis_and_a_titled_single_panel_pass():
    fig = Figure(figsize=(4, 3))
    ax = fig.add_axes([0.1, 0.1, 0.8, 0.8])
    ax.barh([0, 1], [2.0, 3.0], left=[0.5, 1.0])          # a range from 0.5 to 2.5: meaningful on a log axis
    ax.set_xscale("log")
    from matplotlib.ticker import NullFormatter
    ax.xaxis.set_minor_formatter(NullFormatter())
    ax.set_title("tornado: one panel, its own title")
    assert audit_figure(fig) == []


def test_columns_get_one_scale_and_bars_turn_to_points_on_a_log_column():
    """plot_baselines: a metric spanning > 30x over the facets is a log column in every facet, drawn as points."""
    import pandas as pd
    from npumoe_lab.viz.plots import plot_baselines
    rows = [dict(model="m", workload="w", variant=v, platform=p, prompt_len=256, chunk=128, repeat=0,
                 ttft_s=t * (1 if p == "m2-max" else 50), timing_source="modeled")
            for p in ("m2-max", "m2-ultra") for v, t in (("cpu-only", 0.004), ("npumoe", 0.002))]
    fig = plot_baselines(pd.DataFrame(rows))
    axes = [a for a in fig.axes if a.get_visible()]
    assert {a.get_xscale() for a in axes} == {"log"} and not any(a.containers for a in axes)
    assert audit_figure(fig) == [] and "model m" in fig._suptitle.get_text() and "prompt 256" in fig._suptitle.get_text()
    assert all(a.get_xlabel() == "TTFT (ms)" for a in axes)          # every TTFT below 1 s: milliseconds


def test_modeled_bars_carry_their_interval_as_whiskers():
    """plot_baselines: modeled rows with ttft_s_lo/_hi (one per configuration) get whiskers at exactly that interval
    and an axis label that says so; without the columns, no whiskers (one value: no IQR)."""
    import pandas as pd
    from npumoe_lab.viz.plots import plot_baselines
    rows = [dict(model="m", workload="w", variant=v, platform="m2-max", prompt_len=256, chunk=128, repeat=0,
                 ttft_s=t, ttft_s_lo=t * 0.8, ttft_s_hi=t * 1.5, timing_source="modeled")
            for v, t in (("cpu-only", 0.004), ("npumoe", 0.003))]
    fig = plot_baselines(pd.DataFrame(rows))
    ax = [a for a in fig.axes if a.get_visible()][0]
    assert "90 % interval" in ax.get_xlabel()
    bars = [c for c in ax.containers if type(c).__name__ == "ErrorbarContainer"]
    assert len(bars) == 1
    segs = bars[0].lines[2][0].get_segments()           # one horizontal segment per variant, in ms
    got = sorted((round(s[0][0], 6), round(s[1][0], 6)) for s in segs)
    assert got == sorted([(3.2, 6.0), (2.4, 4.5)])
    assert audit_figure(fig) == []
    plain = plot_baselines(pd.DataFrame(rows).drop(columns=["ttft_s_lo", "ttft_s_hi"]))
    pa = [a for a in plain.axes if a.get_visible()][0]
    assert not [c for c in pa.containers if type(c).__name__ == "ErrorbarContainer"] and "interval" not in pa.get_xlabel()
