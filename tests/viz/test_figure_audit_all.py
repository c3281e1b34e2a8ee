"""figcheck audits every figure the workbench draws besides the result figures (tests/viz/test_figures.py): the
explorer's four panels, the sensitivity tornado and the paper-check figure, and `tune`'s Pareto front; each passes
the extended rules (a title saying what and where, no bars from zero on a log axis, one scale per column)."""
import pandas as pd
import pytest

from npumoe_lab.viz.figcheck import audit_figure

GEOMETRY = "phi-tiny-moe"


@pytest.fixture(scope="module")
def evaluation():
    from npumoe_lab.viz.explorer import Knobs, make_lab
    lab = make_lab(GEOMETRY, prompt_len=512, chunk=256, seed=0)
    return lab, lab.evaluate(Knobs())


def test_explorer_panels_pass_the_audit(evaluation):
    from npumoe_lab.execution.timeline import to_frame
    from npumoe_lab.viz.explorer import summary_rows
    from npumoe_lab.viz.plan import capacity_vs_load, group_map, metrics_vs_baselines
    from npumoe_lab.viz.timeline import timeline
    lab, ev = evaluation
    figs = {"baselines": metrics_vs_baselines(pd.DataFrame(summary_rows(ev)), "modeled (platform m2-max)", width=9.0),
            "timeline": timeline(to_frame(ev.result.events).assign(platform="m2-max"), title="this plan",
                                 platform="m2-max", width=9.0),
            "capacity": capacity_vs_load(ev.plan, ev.profile, ev.plan.layers[0]["layer"], width=9.0),
            "groups": group_map(ev.plan, width=9.0)}
    problems = {name: audit_figure(fig) for name, fig in figs.items()}
    assert problems == {name: [] for name in figs}


def test_sensitivity_and_paper_check_figures_pass_the_audit():
    from npumoe_lab.sim.figures import paper_check_figure, tornado
    res = pd.DataFrame({"conclusion": "npumoe faster than cpu-only", "geometry": GEOMETRY, "platform": "m2-max",
                        "case": ["baseline", "npu_dispatch_s=low", "npu_dispatch_s=high", "cpu_flops=low"],
                        "knob": ["-", "npu_dispatch_s", "npu_dispatch_s", "cpu_flops"],
                        "ratio": [1.6, 1.2, 2.4, 0.9]})
    assert audit_figure(tornado(res, "npumoe faster than cpu-only")) == []
    table = pd.DataFrame({"quantity": [f"quantity {i}" for i in range(6)], "ratio": [0.5, 0.9, 1.0, 1.1, 2.0, 4.0]})
    fig = paper_check_figure(table)
    assert audit_figure(fig) == [] and not fig.axes[0].containers        # stems and points, no log bars


def test_tune_front_passes_the_audit(tmp_path, monkeypatch):
    import json
    from npumoe_lab.studies.tune import tune
    audit = tmp_path / "audit.jsonl"
    monkeypatch.setenv("NPUMOE_FIGURE_AUDIT", str(audit))
    tune(geometry=GEOMETRY, routing="synthetic:gini=0.6", budget_drop=0.05, chunk=256, prompt_len=512,
         n_candidates=6, out=tmp_path / "tune")
    records = [json.loads(line) for line in audit.read_text().splitlines()]
    assert [r["figure"] for r in records] == ["tune-front"] and records[0]["problems"] == []
    assert (tmp_path / "tune" / "front.png").stat().st_size > 0


def test_variants_at_one_point_are_dodged_apart():
    """Three dropless variants at (drop 0, delta 0) are three markers, not one ( 5 of 9 under one)."""
    import numpy as np
    from npumoe_lab.viz.plots import plot_accuracy
    rows = [dict(model="m", workload="w", variant=v, platform="m2-max", prompt_len=256, chunk=128, repeat=0,
                 drop_rate=d, accuracy_delta=a, timing_source="modeled", ttft_s=0.01)
            for v, d, a in (("reference", 0.0, 0.0), ("cpu-only", 0.0, 0.0), ("anemll", 0.0, 0.0),
                            ("npumoe", 0.1, -0.02))]
    fig = plot_accuracy(pd.DataFrame(rows))
    ax = next(a for a in fig.axes if a.get_visible() and a.lines)
    xs = [round(float(np.asarray(line.get_xdata(), dtype=float)[0]), 9) for line in ax.lines
          if len(line.get_xdata()) == 1
          and float(line.get_ydata()[0]) == 0.0]
    assert len(set(xs)) >= 3, xs
    assert audit_figure(fig) == []
