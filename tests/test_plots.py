"""Figures from synthetic results written and loaded through the store: files, labels, error bars, values."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from matplotlib.container import ErrorbarContainer

from npumoe_lab import cli, plots
from npumoe_lab.errors import NpuMoeError
from npumoe_lab.experiments.store import load_results, write_rows

HOST = "linux-x86_64 2cpu (ci)"
MEASURED = ("reference", "cpu-only")
TIMED_LABELS = ("TTFT", "energy", "CPU cycles")


def _base(variant, repeat, **kw):
    measured = variant in MEASURED
    row = dict(model="tiny", workload="ruler-vt", variant=variant, platform=None if measured else "m4-ane",
               prompt_len=256, chunk=64, repeat=repeat, timing_source="measured" if measured else "modeled",
               host=HOST, energy_source="measured" if measured else "modeled")  # follows variant: no legend
    row.update(kw)
    return row


def baseline_rows():
    rng = np.random.default_rng(0)
    ttft = dict(zip(plots.VARIANT_ORDER, [4.0, 3.0, 6.0, 2.5, 2.0, 2.0 / 1.5, 1.0, 0.5, 0.6]))
    return [_base(v, r, ttft_s=t * (1 + 0.05 * (r - 1)), energy_per_token_mj=10 * t + rng.random(),
                  cpu_cycles=1e9 * t) for v, t in ttft.items() for r in range(3)]


def sweep_rows():
    rows = []
    for r in range(3):
        rows += [_base("npumoe", r, group_size=g, ttft_s=1.0 / g + 0.01 * r, energy_per_token_mj=5.0 / g,
                       n_npu_calls=64 / g) for g in (1, 2, 4, 8)]
        rows += [_base("npumoe", r, hot_threshold=h, ttft_s=0.5 + h, energy_per_token_mj=3 - h) for h in (0.1, 0.5)]
        rows += [_base("npumoe-t", r, n_tiers=k, pad_rate=0.4 / k, drop_rate=0.05 * k + 0.01 * r) for k in (1, 2, 3)]
        rows += [_base("npumoe", r, workload="boolq", drop_rate=d, accuracy_delta=-d / 10 - 0.001 * r,
                       accuracy_ci_low=-d / 10 - 0.01, accuracy_ci_high=-d / 10 + 0.01, score_name="accuracy",
                       plan_hash=f"plan-drop{d}")
                 for d in (0.0, 0.1, 0.2)]
    return rows


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    root = tmp_path_factory.mktemp("results")
    write_rows(baseline_rows(), root / "baselines")
    write_rows(sweep_rows(), root / "sweeps" / "cell-a")
    counts = pd.DataFrame([{"layer": layer, "expert": e, "chunk_id": 0, "count": (e + 1) * (layer + 1)}
                           for layer in range(4) for e in range(8)])
    (root / "calib").mkdir()
    counts.to_parquet(root / "calib" / "counts.parquet")
    return root


def _check_labels(fig):
    """Every axis showing time or energy carries the measured/modeled text of the rows it draws."""
    timed = [ax for ax in fig.axes if any(k in ax.get_ylabel() for k in TIMED_LABELS)]
    assert timed
    for ax in timed:
        texts = [t.get_text() for t in ax.texts if t.get_gid() == plots.SOURCE_GID]
        assert texts and ("modeled (platform m4-ane)" in texts[0] or f"measured (host {HOST})" in texts[0]), \
            (ax.get_ylabel(), texts)
    return timed


def _has_errorbars(ax):
    return any(isinstance(c, ErrorbarContainer) for c in ax.containers)


def test_baselines_figure_order_labels_errorbars_and_files(results, tmp_path):
    df = load_results(results / "baselines")
    fig = plots.plot_baselines(df)
    timed = _check_labels(fig)
    assert len(timed) == 3 and [ax.get_ylabel() for ax in timed] == [
        "TTFT (s)", "energy per token (mJ/token)", "CPU cycles (10⁹ cycles)"]
    label = [t.get_text() for t in timed[0].texts if t.get_gid() == plots.SOURCE_GID][0]
    assert label == f"measured (host {HOST}); modeled (platform m4-ane)"
    assert [t.get_text() for t in timed[0].get_xticklabels()] == list(plots.VARIANT_ORDER)
    assert all(_has_errorbars(ax) for ax in timed)
    assert timed[0].get_legend() is None  # energy_source follows the variant: nothing to tell apart
    heights = [p.get_height() for p in timed[0].patches]
    assert heights == pytest.approx([4.0, 3.0, 6.0, 2.5, 2.0, 2.0 / 1.5, 1.0, 0.5, 0.6])  # medians (repeat 1)
    pdf, png = plots.save_figure(fig, tmp_path, "baselines")
    assert pdf.read_bytes()[:4] == b"%PDF" and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert png.stat().st_size > 10_000


def test_ablation_speedups_against_paper_markers(results):
    fig = plots.plot_ablation(load_results(results / "baselines"))
    [ax] = fig.axes
    assert [t.get_gid() for t in ax.texts] == [plots.SOURCE_GID]  # speedups are time: labelled too
    assert ax.texts[0].get_text() == "modeled (platform m4-ane)"
    assert [p.get_height() for p in ax.patches] == pytest.approx([1.0, 1.5, 2.0, 4.0])
    markers = [c for c in ax.collections if c.get_label() == "paper (NPUMoE §5.8)"]
    assert markers[0].get_offsets()[:, 1].tolist() == pytest.approx([1.00, 1.48, 2.11, 2.89])
    assert _has_errorbars(ax)


def test_sweep_figures_have_units_labels_and_errorbars(results):
    df = load_results(results)
    for fn, xlabel in [(plots.plot_grouping, "group size (experts per NPU graph)"),
                       (plots.plot_residency, "hot threshold")]:
        fig = fn(df[df["variant"] == "npumoe"])
        timed = _check_labels(fig)
        assert all(xlabel in ax.get_xlabel() and _has_errorbars(ax) for ax in fig.axes)
        assert len(timed) == 2
    calls = [ax for ax in plots.plot_grouping(df).axes if ax.get_ylabel().startswith("NPU calls")]
    assert calls and not [t for t in calls[0].texts if t.get_gid() == plots.SOURCE_GID]

    tiers = plots.plot_tiers(df)
    [ax] = tiers.axes
    assert ax.get_xlabel() == "dropped assignments (%)" and ax.get_ylabel() == "padding (% of NPU slots)"
    assert _has_errorbars(ax) and {t.get_text() for t in ax.get_legend().get_texts()} >= {"n_tiers=1", "n_tiers=3"}

    acc = plots.plot_accuracy(df)
    [ax] = acc.axes
    [bars] = [c for c in ax.containers if isinstance(c, ErrorbarContainer)]
    ylo, yhi = bars.lines[2][1].get_segments()[1][:, 1]  # the stored CI of the drop_rate=0.1 point
    assert (ylo, yhi) == pytest.approx((-0.02, 0.0))


def test_popularity_heatmap_shares_sum_to_100_per_layer(results):
    fig = plots.plot_popularity_heatmap(results / "calib")
    data = fig.axes[0].images[0].get_array()
    assert data.shape == (8, 4) and np.allclose(data.sum(axis=0), 100.0)
    assert data[7, 0] == pytest.approx(100 * 8 / 36)


def test_make_all_figures_and_cli_skip_what_is_missing(results, tmp_path, capsys):
    logged = []
    paths = plots.make_all_figures(results, tmp_path / "figs", log=logged.append, dpi=60)
    names = sorted({p.stem for p in paths})
    assert names == ["ablation", "accuracy", "baselines", "grouping", "popularity", "residency", "tiers"]
    assert all(p.stat().st_size > 0 for p in paths) and len(paths) == 14 and not logged

    only = tmp_path / "only-baselines"
    write_rows(baseline_rows(), only)
    assert cli.main(["figures", str(only), "--out", str(tmp_path / "f2")]) == 0
    out = capsys.readouterr().out
    assert "baselines.png" in out and "skipped accuracy: figure accuracy needs column(s) drop_rate" in out
    assert not (tmp_path / "f2" / "accuracy.png").exists()


def test_missing_columns_raise_clear_errors(tmp_path):
    df = pd.DataFrame([_base("npumoe", 0, score=1.0)])
    with pytest.raises(NpuMoeError, match="figure baselines needs column.*ttft_s"):
        plots.plot_baselines(df)
    with pytest.raises(NpuMoeError, match="npumoe-base"):
        plots.plot_ablation(df.assign(ttft_s=1.0))
    write_rows(df, tmp_path)
    with pytest.raises(NpuMoeError, match="no figure can be made"):
        plots.make_all_figures(tmp_path, tmp_path / "figs", log=lambda _: None)
