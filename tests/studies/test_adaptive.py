"""Drift on the bundled model, real numerics (slow): a plan calibrated on scripture prefilling held-out code is
flagged, and with recalibrate="rebuild" the later chunks drop within 2 points of a plan calibrated on code."""

from npumoe_lab.studies.adaptive import drift_run
from npumoe_lab.experiments.runner import run_experiment


def test_scripture_plan_on_code_is_flagged_and_recovers(tiny_model_fresh_cache):
    model, tok = tiny_model_fresh_cache
    rep = drift_run(model, tok, "scripture", "code", prompt_len=1024, chunk=128, calib_tokens=2048)
    print(rep.text())
    s = rep.summary
    assert s["drift_flagged_layers"] and s["warnings"] >= 1
    assert rep.rebuilds and s["rebuild_chunk"] < 7
    assert s["drop_static_later"] > s["drop_direct_later"] + 0.05       # the drift costs drops without a rebuild
    assert abs(s["drop_gap_points"]) <= 2.0
    assert s["ttft_old_ms_modeled"] > 0 and s["ttft_new_ms_modeled"] > 0
    assert 0 < s["graphs_recompiled"] <= s["graphs_total"]
    # the static run is the same plan without the monitor: identical drops until the first rebuild is adopted
    early = rep.per_chunk[rep.per_chunk["chunk"] <= s["rebuild_chunk"]]
    assert (early["drop_static"] == early["drop_adaptive"]).all()


def test_same_domain_stays_quiet(tiny_model_fresh_cache):
    model, tok = tiny_model_fresh_cache
    rep = drift_run(model, tok, "scripture", "scripture", prompt_len=1024, chunk=128, calib_tokens=2048,
                    recalibrate="off")
    assert not rep.rebuilds and rep.summary["drift_js_max"] < 0.3


def test_run_experiment_drift_columns(tiny_model_fresh_cache):
    df = run_experiment(model=tiny_model_fresh_cache, workload="lm-heldout", variants="npumoe,cpu-only",
                        platforms="m2-max", prompt_len=256, chunk=128, n_samples=1, calib_workload="scripture",
                        calib_tokens=1024,
                        warmup=0, drift=True, residency="all")
    plan_row = df[df.variant == "npumoe"].iloc[0]
    assert 0 <= plan_row["drift_js_max"] <= 1 and 0 <= plan_row["drift_hot_overlap_min"] <= 1
    assert plan_row["drift_policy"] == "off" and plan_row["drift_rebuilds"] == 0
    assert df[df.variant == "cpu-only"]["drift_js_max"].isna().all()    # no plan: nothing to monitor
