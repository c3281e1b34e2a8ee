"""Figures from synthetic results written and loaded through the store: files, labels, error bars, values."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from matplotlib.container import ErrorbarContainer

from npumoe_lab import cli
from npumoe_lab.viz import plots
from npumoe_lab.viz import plot_helpers as pk
from npumoe_lab.errors import NpuMoeError
from npumoe_lab.results.store import load_results, write_rows

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
    timed = [ax for ax in fig.axes if any(k in ax.get_ylabel() + ax.get_xlabel() for k in TIMED_LABELS)]
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
    # measured host rows and modeled m4-ane rows never share an axis: one row of three panels each
    assert len(timed) == 6 and [ax.get_xlabel().split("\n")[0] for ax in timed[:3]] == [
        "TTFT (s)", "energy per token (mJ/token)", "CPU cycles (10⁹ cycles)"]
    assert all(ax.get_xlabel().endswith("whiskers: IQR over 3 repeats") for ax in timed)   # what whiskers are
    labels = [[t.get_text().replace("\n", " ") for t in ax.texts if t.get_gid() == plots.SOURCE_GID][0]
              for ax in timed]   # wrapped to the panel width
    assert set(labels[:3]) == {"modeled (platform m4-ane)"}
    assert labels[3:] == [f"measured (host {HOST})", f"measured (host {HOST}) energy",  # RAPL in this fixture
                          f"measured (host {HOST}) CPU time × modeled clock (platform ?)"]
    assert [ax.get_title() for ax in (timed[0], timed[3])] == ["m4-ane", "host"]
    assert [t.get_text() for t in timed[0].get_yticklabels()] == list(plots.VARIANT_ORDER[2:])
    assert [t.get_text() for t in timed[1].get_yticklabels()] == [""] * 7    # named once per row
    assert all(_has_errorbars(ax) for ax in timed)
    assert not fig.legends and all(ax.get_legend() is None for ax in fig.axes)   # colour = variant, named on y
    widths = [p.get_width() for p in timed[3].patches] + [p.get_width() for p in timed[0].patches]
    assert widths == pytest.approx([4.0, 3.0, 6.0, 2.5, 2.0, 2.0 / 1.5, 1.0, 0.5, 0.6])  # medians (repeat 1)
    pdf, png = plots.save_figure(fig, tmp_path, "baselines")
    assert pdf.read_bytes()[:4] == b"%PDF" and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert png.stat().st_size > 10_000


def test_measured_cpu_rows_label_energy_and_cycles_as_partly_modeled():
    rows = pd.DataFrame([dict(variant="npumoe", platform="cpu", timing_source="measured", energy_source="modeled",
                              host="h1")])
    assert pk.metric_source(rows, "ttft_s") == "measured (host h1)"
    assert pk.metric_source(rows, "energy_per_token_mj") == "measured (host h1) time × modeled power (platform cpu)"
    assert pk.metric_source(rows, "cpu_cycles") == "measured (host h1) CPU time × modeled clock (platform cpu)"


def test_a_point_outside_its_interval_is_drawn_so_and_said():
    """Modeled rows whose sourced point lies below its draws' 90 % interval: the whisker spans the stored interval
    (not clipped to the point) and the axis note says why the point sits at an end."""
    rows = pd.DataFrame([_base(v, 0, platform="m2-max", ttft_s=t, ttft_s_lo=t * lo, ttft_s_hi=t * 10)
                         for v, t, lo in (("npumoe-tg", 0.006, 1.1), ("npumoe", 0.004, 0.8))])
    fig = plots.plot_baselines(rows)
    ax = fig.axes[0]
    (cont,) = [c for c in ax.containers if isinstance(c, ErrorbarContainer)]
    seg = cont.lines[2][0].get_segments()
    spans = sorted((float(s[0][0]), float(s[1][0])) for s in seg)
    assert spans[0] == pytest.approx((4.0 * 0.8, 40.0)) and spans[1] == pytest.approx((6.0 * 1.1, 60.0))  # ms
    assert "at or past an end of its interval" in ax.get_xlabel().replace("\n", " ")


def test_error_bars_are_the_iqr_of_repeats():
    t = [1.0, 2.0, 4.0, 8.0, 9.0]
    df = pd.DataFrame([_base("npumoe", r, ttft_s=x) for r, x in enumerate(t)])
    st = pk.stats(df, "ttft_s").iloc[0]
    assert (st["median"], st["lo"], st["hi"]) == (np.median(t), np.percentile(t, 25), np.percentile(t, 75))


def test_log_axes_where_values_span_decades():
    from matplotlib.figure import Figure
    ax = Figure().subplots()
    pk.auto_scale(ax, [0.01, 0.5, 2.0], "y")
    assert ax.get_yscale() == "log"
    pk.auto_scale(ax, [0.0, 16.0, 256.0, 1e9], "x")      # notebook 04's thresholds: zero included
    assert ax.get_xscale() == "symlog"
    ax2 = Figure().subplots()
    pk.auto_scale(ax2, [1.0, 2.0, 8.0], "y")
    assert ax2.get_yscale() == "linear"


def test_ablation_speedups_without_the_papers_values_on_another_model(results):
    fig = plots.plot_ablation(load_results(results / "baselines"))
    [ax] = fig.axes
    assert [t.get_gid() for t in ax.texts] == [plots.SOURCE_GID]  # speedups are time: labelled too
    assert ax.texts[0].get_text() == "modeled (platform m4-ane)"
    assert [p.get_width() for p in ax.patches] == pytest.approx([1.0, 1.5, 2.0, 4.0])
    assert not ax.collections[1:], "the paper's Phi-3.5-MoE values are not drawn on the tiny model's panel"
    assert "1.00 / 1.48 / 2.11 / 2.89x" in fig._supxlabel.get_text()       # quoted instead, said as another setting
    assert _has_errorbars(ax) and "IQR over 3 repeats" in ax.get_xlabel()


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
    assert _has_errorbars(ax)
    assert {t.get_text() for t in tiers.legends[0].get_texts()} >= {"n_tiers = 1", "n_tiers = 3"}

    acc = plots.plot_accuracy(df)
    [ax] = acc.axes
    assert ax.get_ylabel().startswith("accuracy delta vs reference (points)")
    [bars] = [c for c in ax.containers if isinstance(c, ErrorbarContainer)]
    ylo, yhi = bars.lines[2][1].get_segments()[1][:, 1]  # the stored CI of the drop_rate=0.1 point, in points
    assert (ylo, yhi) == pytest.approx((-2.0, 0.0))


def test_popularity_heatmap_shares_sum_to_100_per_layer(results):
    fig = plots.plot_popularity_heatmap(results / "calib")
    data = fig.axes[0].images[0].get_array()
    assert data.shape == (8, 4) and np.allclose(data.sum(axis=0), 100.0)
    assert data[7, 0] == pytest.approx(100 * 8 / 36)


def test_compared_heatmaps_share_one_colour_scale(results):
    counts = pd.read_parquet(results / "calib" / "counts.parquet")
    flat = counts.assign(count=1)
    fig = plots.plot_popularity_heatmaps({"skewed": counts, "flat": flat})
    clims = [ax.images[0].get_clim() for ax in fig.axes if ax.images]
    assert len(clims) == 2 and clims[0] == clims[1] == (0.0, pytest.approx(100 * 8 / 36))


def test_make_all_figures_and_cli_skip_what_is_missing(results, tmp_path, capsys):
    logged = []
    paths = plots.make_all_figures(results, tmp_path / "figs", log=logged.append, dpi=60)
    names = sorted({p.stem for p in paths})
    assert names == ["ablation", "accuracy", "baselines", "grouping", "popularity", "residency", "tiers"]
    assert all(p.stat().st_size > 0 for p in paths) and len(paths) == 14 and not logged

    only = tmp_path / "only-baselines"
    write_rows(baseline_rows(), only)
    assert cli.main(["figures", str(only), "--out", str(tmp_path / "f2")]) == 0
    printed = capsys.readouterr()        # the figures' paths on stdout, what was skipped (and why) on stderr
    assert "baselines.png" in printed.out and "skipped accuracy" not in printed.out
    assert "skipped accuracy: figure accuracy needs column(s) drop_rate" in printed.err
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


def test_ablation_drop_rates_in_the_tick_labels_and_paper_marks_on_the_papers_setting():
    """Each step's drop rate sits in its tick label (a label on the data was overprinted); the paper's values are
    hollow diamonds on the Phi-3.5-MoE / M2 Ultra panel only. Reference: the paper's numbers and figcheck."""
    from npumoe_lab.sim.run import simulate
    from npumoe_lab.viz.figcheck import audit_figure
    rows = simulate(geometry="phi-3.5-moe,phi-tiny-moe", variants="npumoe-base,npumoe-t,npumoe-tg,npumoe",
                    platforms="m2-max,m2-ultra", prompt_len=512, chunk=256)
    rows["drop_rate"] = 0.0123
    fig = plots.plot_ablation(rows)
    assert audit_figure(fig) == []
    marked = {}
    for ax in fig.axes:
        assert [t.get_text() for t in ax.get_yticklabels()][1] == "npumoe-t\ndrop 1.2%"
        assert not [t for t in ax.texts if t.get_text().startswith("drop ")]
        diamonds = [c for c in ax.collections if len(getattr(c, "get_offsets", lambda: [])())]
        marked[ax.get_title()] = [c.get_offsets()[:, 0].tolist() for c in diamonds]
    assert marked.pop("m2-ultra · phi-3.5-moe") == [pytest.approx([1.00, 1.48, 2.11, 2.89])]
    assert all(v == [] for v in marked.values()), marked
