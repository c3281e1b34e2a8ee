"""The host speed probe (devices/hostspeed.py): its note by hand, the fit keeping the rows' median probe, and
validate-device --runs showing a run's probe beside the fit's while still counting the run (a reading, not a rule)."""
import math

import pandas as pd
import pytest

from npumoe_lab.devices import cpu_fit, hostspeed


def test_probe_times_something_real():
    t = hostspeed.probe_s()
    assert math.isfinite(t) and 1e-5 < t < 5.0


@pytest.mark.parametrize("probe, ref, verdict", [
    (0.0100, 0.0100, ""), (0.0114, 0.0100, ""), (0.0088, 0.0100, ""),        # within 15 % either way
    (0.0116, 0.0100, "16% slower"), (0.0086, 0.0100, "14% faster"),          # 1/1.15 = 0.8696
    (float("nan"), 0.0100, ""), (0.0100, None, ""), (0.0, 0.0100, "")])       # unknown: no verdict
def test_speed_note_by_hand(probe, ref, verdict):
    note = hostspeed.speed_note(probe, ref)
    assert (verdict in note) if verdict else note == ""
    if verdict:
        assert "speed probe" in note and "than when fitted" in note


def test_a_run_at_another_host_speed_than_the_fit_is_shown_and_still_counted(tmp_path):
    from tests.devices.test_cpu_model import TRUE
    from tests.devices.test_host_fit import _rows_df
    from tests.experiments.test_validate_runs import fake_run
    from npumoe_lab.experiments.validate_runs import validate_runs
    df = _rows_df(tmp_path, {"bf16": TRUE})
    df["host_probe_s"] = [0.010 + 1e-4 * (i % 3) for i in range(len(df))]     # median 0.0101
    res = cpu_fit.fit_host(df)
    assert res["probe_s"] == pytest.approx(0.0101)
    path = cpu_fit.write_fit(res, tmp_path / "f", "m")
    assert cpu_fit.load_host_uncertainty(path)["probe_s"] == pytest.approx(0.0101)
    runs, _ = fake_run(tmp_path, cpu_fit.load_host_model(path))
    rows_file = next(runs.glob("rows-*.parquet"))
    rows = pd.read_parquet(rows_file)
    rows["host_busy"] = False
    rows["host_probe_s"] = [0.0102, 0.0102, 0.0125, 0.0125]    # npumoe as fitted; reference 24 % slower
    rows.to_parquet(rows_file)
    from npumoe_lab.experiments.validate_runs import table_lines
    df = validate_runs(path, runs)
    got = df.set_index("variant")
    assert got.loc["npumoe", "counted"] and got.loc["reference", "counted"]
    assert got.loc["npumoe", "host_speed_note"] == ""
    assert "host 24% slower than when fitted" in got.loc["reference", "host_speed_note"]
    assert got.loc["reference", "host_busy_reason"] == ""
    ref_line = next(line for line in table_lines(df) if "| reference |" in line)
    assert ref_line.endswith("| yes | 12.50 vs 10.10 | 1.000 (- / -) |")


def test_the_probe_survives_a_measurements_file_into_the_fit(tmp_path):
    import yaml
    from tests.devices.test_cpu_model import TRUE, synthetic_ops
    from tests.experiments.test_validate_runs import host_rows
    from npumoe_lab.devices.measurements import load_measurements
    rows = host_rows(synthetic_ops())
    for i, r in enumerate(rows):
        r["id"] = f"tiny-bf16-L1-static-c64-p512-k0-l0-{r['id']}"
        r["host_probe_s"] = 0.020 if i % 2 else 0.022
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "measurements.yaml").write_text(yaml.safe_dump({"description": "a test", "rows": rows}))
    df = load_measurements(tmp_path / "m")
    assert df["host_probe_s"].tolist() == [r["host_probe_s"] for r in rows]
    assert cpu_fit.fit_host(df, cv=False)["probe_s"] == pytest.approx(0.021 if len(rows) % 2 == 0 else 0.022)
    rows[0]["host_probe_s"] = -1.0
    (tmp_path / "m" / "measurements.yaml").write_text(yaml.safe_dump({"description": "a test", "rows": rows}))
    with pytest.raises(Exception, match="host_probe_s"):
        load_measurements(tmp_path / "m")


def test_the_verdict_says_how_many_runs_read_another_host_speed():
    from npumoe_lab.experiments.validate_runs import summary, verdict
    df = pd.DataFrame({"counted": [True, True, True, False], "abs_err": [0.02, 0.04, 0.30, 0.9],
                       "host_speed_note": ["", "", "host 24% slower than when fitted (...)", "host 40% ..."]})
    s = summary(df)
    assert s["n_speed_off"] == 1 and s["median_abs_err_speed_steady"] == pytest.approx(0.03)
    assert s["median_abs_err"] == pytest.approx(0.04) and s["worst_abs_err"] == pytest.approx(0.30)  # all counted
    line = verdict(s)
    assert "1 of the 3 counted runs read the host speed probe more than 15% off" in line
    assert "median |error| of the other 2: 3.0 %" in line and "stay counted" in line
    steady = summary(df.assign(host_speed_note=""))
    assert steady["n_speed_off"] == 0 and "host speed probe" not in verdict(steady)


@pytest.mark.parametrize("run, fit, factor", [
    (0.130, 0.065, 2.0), (0.052, 0.065, 0.8), (0.065, 0.065, 1.0),
    (float("nan"), 0.065, 1.0), (0.1, None, 1.0), (0.0, 0.1, 1.0), (0.1, float("inf"), 1.0)])
def test_anchor_factor_by_hand(run, fit, factor):
    assert hostspeed.anchor_factor(run, fit) == pytest.approx(factor)


def test_the_anchor_times_a_fixed_prefill_of_the_tiny_geometry():
    from npumoe_lab.experiments import speed_anchor
    from npumoe_lab.experiments.geometry_model import bundled_depth
    t = speed_anchor.anchor_s()
    model, ids, config = speed_anchor._STATE["anchor"]
    assert model.config.num_hidden_layers == bundled_depth()
    assert ids.shape == (1, speed_anchor.ANCHOR_TOKENS) and config.chunk == speed_anchor.ANCHOR_CHUNK
    assert math.isfinite(t) and 1e-4 < t < 10.0
    speed_anchor.anchor_s()
    assert speed_anchor._STATE["anchor"][0] is model             # built once: the next reading reuses it


def test_a_run_priced_at_the_fit_is_scaled_by_its_anchor_over_the_fits(tmp_path):
    """The fit's price x (the run's anchor / the fit rows' median anchor), checked against a by-hand price of the op
    stream; --no-speed-anchor (use_anchor=False) and a run without readings keep the price as is."""
    from tests.devices.test_cpu_model import TRUE
    from tests.devices.test_host_fit import _rows_df
    from tests.experiments.test_validate_runs import fake_run
    from npumoe_lab.experiments.validate_runs import summary, table_lines, validate_runs, verdict
    df = _rows_df(tmp_path, {"bf16": TRUE})
    df["host_anchor_s"] = [0.060 if i % 2 else 0.070 for i in range(len(df))]
    res = cpu_fit.fit_host(df)
    assert res["anchor_s"] == pytest.approx(float(pd.Series(df["host_anchor_s"]).median()))
    path = cpu_fit.write_fit(res, tmp_path / "f", "m")
    ref = cpu_fit.load_host_uncertainty(path)["anchor_s"]
    runs, _ = fake_run(tmp_path, cpu_fit.load_host_model(path))
    rows_file = next(runs.glob("rows-*.parquet"))
    rows = pd.read_parquet(rows_file)
    rows["host_busy"] = False
    rows["host_anchor_s"] = [ref, ref, 1.3 * ref, 1.3 * ref]    # npumoe at the fit's speed; reference 30 % slower
    rows["anchor_geometry"] = True
    rows.to_parquet(rows_file)
    got = validate_runs(path, runs).set_index("variant")
    plain = validate_runs(path, runs, use_anchor=False).set_index("variant")
    for v, factor in (("npumoe", 1.0), ("reference", 1.3)):
        assert got.loc[v, "speed_factor"] == pytest.approx(factor)
        assert got.loc[v, "fit_price_s"] == pytest.approx(plain.loc[v, "modeled_ttft_s"])
        assert got.loc[v, "modeled_ttft_s"] == pytest.approx(factor * plain.loc[v, "modeled_ttft_s"])
        assert got.loc[v, "modeled_ttft_lo_s"] == pytest.approx(factor * plain.loc[v, "modeled_ttft_lo_s"])
        assert got.loc[v, "unanchored_abs_err"] == pytest.approx(plain.loc[v, "abs_err"])
    assert (plain["speed_factor"] == 1.0).all()
    s = summary(got.reset_index())
    assert s["anchored"] and s["median_abs_err_unanchored"] == pytest.approx(plain["abs_err"].median())
    assert "the fit's price alone: median |error|" in verdict(s)
    assert "the fit's price alone" not in verdict(summary(plain.reset_index()))
    assert next(line for line in table_lines(got.reset_index()) if "| reference |" in line).endswith(
        f"| 1.300 ({1.3 * ref * 1e3:.1f} / {ref * 1e3:.1f}) |")
    rows["anchor_geometry"] = [True, True, False, False]     # another geometry than the anchor's: not scaled
    rows.to_parquet(rows_file)
    other = validate_runs(path, runs).set_index("variant")
    assert other.loc["reference", "speed_factor"] == 1.0
    assert other.loc["reference", "modeled_ttft_s"] == pytest.approx(plain.loc["reference", "modeled_ttft_s"])


def test_the_anchor_geometry_is_the_tiny_one():
    from npumoe_lab.experiments.geometry_model import geometry_config
    from npumoe_lab.models import load_model
    tiny, qwen = (geometry_config(g, 1) for g in ("tiny", "qwen3-30b-a3b"))
    from npumoe_lab.experiments.speed_anchor import is_anchor_geometry
    assert is_anchor_geometry(load_model("tiny")[0].config)       # the bundled trained model too
    assert is_anchor_geometry(tiny) and not is_anchor_geometry(qwen)
    assert hostspeed.geometry_key(tiny) != hostspeed.geometry_key(qwen)


def _tracking_rows(beta, n=40, reps=5, noise=0.02, seed=0):
    """First rows of n tiny prefills whose totals follow their anchors with slope `beta` (plus noise), each
    prefill at its own level; and one Qwen3 prefill that does not follow (ignored: another geometry)."""
    import numpy as np
    rng = np.random.default_rng(seed)
    rows = []
    for i in range(n):
        a = 0.065 * np.exp(rng.normal(0, 0.15, reps))
        t = (0.01 + 0.01 * i) * (a / 0.065) ** beta * np.exp(rng.normal(0, noise, reps))
        rows.append({"work": {"geometry": "tiny"}, "prefill_reps_s": list(t), "host_anchor_reps_s": list(a)})
    rows.append({"work": {"geometry": "qwen3-30b-a3b"}, "prefill_reps_s": [1.0, 1.0, 1.0, 1.0, 1.0],
                 "host_anchor_reps_s": [0.05, 0.06, 0.07, 0.08, 0.09]})
    rows.append({"work": {"geometry": "tiny"}, "prefill_reps_s": None, "host_anchor_reps_s": None})   # not a first row
    return pd.DataFrame(rows)


@pytest.mark.parametrize("beta", [0.0, 0.4, 1.0])
def test_the_tracking_slope_is_recovered_from_measures_repeats(beta):
    got = cpu_fit.anchor_tracking(_tracking_rows(beta))
    assert got["n_prefills"] == 40
    assert got["beta"] == pytest.approx(beta, abs=0.05)
    assert 0 < got["beta_se"] < 0.05


def _across_rows(beta, n=30, ops=4, seed=0):
    """Op rows of n tiny prefills (ids as `measure` writes them) whose measured totals are the fit's price x (the
    prefill's anchor / 0.065) ** beta x a common bias x noise; the prices; and one Qwen3 prefill that does not
    follow its anchor (another geometry: ignored)."""
    import numpy as np
    rng = np.random.default_rng(seed)
    rows, prices = [], []
    for i in range(n):
        a = 0.065 * float(np.exp(rng.normal(0, 0.2)))
        factor = (a / 0.065) ** beta * 1.1 * float(np.exp(rng.normal(0, 0.02)))
        for k in range(ops):
            p = 0.001 * (1 + k + i % 7)
            rows.append({"id": f"tiny-bf16-L4-static-c{32 << (i % 4)}-p{512 + i}-k{k}-l0-op",
                         "work": {"geometry": "tiny"}, "measured_s": p * factor, "host_anchor_s": a})
            prices.append(p)
    for k in range(ops):
        rows.append({"id": f"qwen3-30b-a3b-bf16-L2-static-c64-p512-k{k}-l0-op", "work": {"geometry": "qwen3-30b-a3b"},
                     "measured_s": 1.0, "host_anchor_s": 0.2})
        prices.append(0.5)
    return pd.DataFrame(rows), prices


@pytest.mark.parametrize("beta", [0.0, 0.6, 1.0])
def test_the_tracking_slope_is_read_across_prefills_against_the_fits_price(beta):
    """The slope a run's factor uses: log(measured / price) on log(anchor / the fit's), across prefills, with an
    intercept (a fit's common bias of 10 % does not leak into it)."""
    rows, prices = _across_rows(beta)
    got = cpu_fit.anchor_tracking(rows, prices, 0.065)
    assert got["method"] == "across prefills" and got["n_prefills"] == 30
    assert got["beta"] == pytest.approx(beta, abs=0.05)
    assert 0 < got["beta_se"] < 0.05


def test_the_anchor_readings_reliability_is_recovered():
    """Per prefill a true level (sd 0.2 across prefills) read 5 times with noise sd 0.1: the share of the spread of
    the median reading that is the level, ~0.04 / (0.04 + 0.01 / 5) (the median's noise a little above the mean's)."""
    import numpy as np
    rng = np.random.default_rng(3)
    rows = []
    for i in range(400):
        level = rng.normal(0, 0.2)
        rows.append({"work": {"geometry": "tiny"}, "prefill_reps_s": [1.0] * 5,
                     "host_anchor_reps_s": list(0.065 * np.exp(level + rng.normal(0, 0.1, 5)))})
    rows.append({"work": {"geometry": "qwen3-30b-a3b"}, "prefill_reps_s": [1.0] * 3,
                 "host_anchor_reps_s": [0.01, 1.0, 100.0]})                       # another geometry: ignored
    got = cpu_fit.anchor_reliability(pd.DataFrame(rows))
    assert got == pytest.approx(0.04 / (0.04 + 0.01 / 5), abs=0.03)
    assert math.isnan(cpu_fit.anchor_reliability(pd.DataFrame(rows[:2])))


def test_without_prices_the_slope_is_the_within_prefill_one():
    rows = _tracking_rows(0.4)
    assert cpu_fit.anchor_tracking(rows) == cpu_fit.anchor_tracking(rows, None, 0.065)
    assert cpu_fit.anchor_tracking(rows)["method"] == "within"


def test_no_repeats_no_slope():
    got = cpu_fit.anchor_tracking(pd.DataFrame({"work": [{"geometry": "tiny"}]}))
    assert got["n_prefills"] == 0 and math.isnan(got["beta"])


def _priced_runs(tmp_path, tracking: dict):
    """A bf16 fit (anchor 0.05 s) with `tracking` as its anchor_tracking, written; a fake run at an anchor 1.44x the
    fit's, priced by validate-device --runs: (the fit file's host_fit section, validate_runs' table)."""
    import yaml
    from tests.devices.test_cpu_model import TRUE
    from tests.devices.test_host_fit import _rows_df
    from tests.experiments.test_validate_runs import fake_run
    from npumoe_lab.experiments.validate_runs import validate_runs
    df = _rows_df(tmp_path, {"bf16": TRUE})
    df["host_anchor_s"] = 0.05
    res = cpu_fit.fit_host(df)
    res["anchor_tracking"] = tracking
    path = cpu_fit.write_fit(res, tmp_path / "f", "m")
    runs, _ = fake_run(tmp_path, cpu_fit.load_host_model(path))
    rows_file = next(runs.glob("rows-*.parquet"))
    rows = pd.read_parquet(rows_file)
    rows["host_busy"], rows["host_anchor_s"], rows["anchor_geometry"] = False, 0.05 * 1.44, True
    rows.to_parquet(rows_file)
    return yaml.safe_load(path.read_text())["host_fit"], validate_runs(path, runs)


def test_a_runs_factor_is_raised_to_the_fits_slope(tmp_path):
    """validate-device --runs: modeled = price x (run anchor / fit anchor) ** beta, beta from the fit file."""
    fit, got = _priced_runs(tmp_path, {"beta": 0.5, "beta_se": 0.01, "n_prefills": 10})
    assert fit["anchor_beta"] == 0.5
    assert got["speed_factor"].tolist() == pytest.approx([1.2, 1.2])              # 1.44 ** 0.5
    assert (got["modeled_ttft_s"] / got["fit_price_s"]).tolist() == pytest.approx([1.2, 1.2])


def test_the_slope_corrected_for_reliability_is_recorded_not_priced(tmp_path):
    """The fit file keeps beta / reliability (0.8) beside beta (0.5); runs are priced with beta as read (a factor
    of 1.44 ** 0.5): the correction was tried on the development draw and not taken (cpu_fit.pricing_slope)."""
    fit, got = _priced_runs(tmp_path, {"beta": 0.5, "beta_se": 0.01, "n_prefills": 10, "reliability": 0.625,
                                       "beta_corrected": 0.8})
    assert fit["anchor_beta"] == 0.5 and fit["anchor_beta_corrected"] == 0.8 and fit["anchor_reliability"] == 0.625
    assert got["speed_factor"].tolist() == pytest.approx([1.2] * 2)
    assert cpu_fit.pricing_slope({"anchor_beta": 0.5, "anchor_beta_corrected": 0.8}) == 0.5
    assert cpu_fit.pricing_slope({}) == 1.0                                       # fits before the slope
    assert cpu_fit.pricing_slope({"anchor_beta": -0.2}) == 0.0
    assert cpu_fit.pricing_slope({"anchor_beta": float("nan")}) == 1.0


def test_the_reliability_correction_is_capped():
    """anchor_tracking divides by max(reliability, MIN_RELIABILITY): noisy readings can at most double the slope."""
    rows, prices = _across_rows(0.6)
    import numpy as np
    rng = np.random.default_rng(1)
    rows["prefill_reps_s"] = None
    rows["host_anchor_reps_s"] = None
    reps = {}
    for i, g in enumerate(cpu_fit.prefill_group(r) for r in rows.to_dict("records")):
        if g and g.startswith("tiny") and g not in reps:           # the first row of each prefill: its readings
            reps[g] = i
            rows.at[i, "host_anchor_reps_s"] = list(0.065 * np.exp(rng.normal(0, 1.0, 3)))   # pure noise
            rows.at[i, "prefill_reps_s"] = [1.0] * 3
    got = cpu_fit.anchor_tracking(rows, prices, 0.065)
    assert got["reliability"] < cpu_fit.MIN_RELIABILITY
    assert got["beta_corrected"] == pytest.approx(got["beta"] / cpu_fit.MIN_RELIABILITY)
