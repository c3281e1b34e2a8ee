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


def _bad_figure(n_legend=0, tiny_axes=False, overlap=False, timed=False):
    fig = Figure(figsize=(4, 3))
    ax = fig.add_axes([0.4, 0.4, 0.2, 0.2] if tiny_axes else [0.1, 0.1, 0.8, 0.8])
    for i in range(n_legend):
        ax.plot([0, 1], [i, i], label=f"line {i}")
    if n_legend:
        ax.legend()
    if overlap:
        ax.text(0.5, 0.5, "first label")
        ax.text(0.5, 0.5, "second label")
    if timed:
        ax.set_ylabel("TTFT (s)")
    return fig


@pytest.mark.parametrize("kind, problem", [
    (dict(tiny_axes=True), "axes cover"), (dict(n_legend=13), "13 entries"),
    (dict(overlap=True), "overlaps"), (dict(timed=True), "without a source label")])
def test_the_audit_catches_each_defect(kind, problem):
    assert any(problem in p for p in audit_figure(_bad_figure(**kind)))
    assert audit_figure(_bad_figure(n_legend=3)) == []
