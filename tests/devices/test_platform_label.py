"""Platform.label: the name plus its overrides (what rows, summaries and figure titles show), a fitted YAML its own
name; rows keep the profile's name in platform_base, so two parameter sets of one chip are told apart."""
import pandas as pd

from npumoe_lab.devices import get_platform
from npumoe_lab.devices.platform import resolve_platform
from npumoe_lab.sim.report import ratios
from npumoe_lab.sim.run import simulate


def test_label_is_the_name_plus_sorted_overrides():
    assert get_platform("m2-max").label == "m2-max"
    p = resolve_platform("m2-max[npu_sync_s=2e-5; npu_dispatch_s=4e-4]")
    assert p.label == "m2-max[npu_dispatch_s=0.0004; npu_sync_s=2e-05]" and p.name == "m2-max"
    assert resolve_platform("m2-max[npu_graph_model=graph]").label == "m2-max[npu_graph_model=graph]"
    # the label is a spec of the same platform
    assert resolve_platform(p.label).hash == p.hash


def test_a_fitted_yaml_is_labelled_by_its_own_name():
    fit = get_platform("data/fits/m2-max-fit.yaml")
    assert fit.label == fit.name == "m2-max-fit"
    assert resolve_platform("data/fits/m2-max-fit.yaml[npu_dispatch_s=1e-4]").label == \
        "m2-max-fit[npu_dispatch_s=0.0001]"


def test_simulated_rows_tell_overridden_platforms_apart():
    specs = ["m2-max", "m2-max[npu_dispatch_s=4e-4]"]
    df = simulate("phi-tiny-moe", "synthetic:gini=0.5", [resolve_platform(s) for s in specs], "npumoe,cpu-only",
                  512, 256)
    assert set(df.platform) == {"m2-max", "m2-max[npu_dispatch_s=0.0004]"}
    assert set(df.platform_base) == {"m2-max"} and set(df.platform_chip) == {"m2-max"}
    assert df.groupby("platform").platform_hash.nunique().eq(1).all() and df.platform_hash.nunique() == 2
    # summaries keep them apart: one speedup row per label, not a mix of both under one name
    r = ratios(df, "ttft_s")
    assert len(r) == 2 and set(r.platform) == set(df.platform)
    slow = df[df.platform == "m2-max[npu_dispatch_s=0.0004]"].set_index("variant").ttft_s
    fast = df[df.platform == "m2-max"].set_index("variant").ttft_s
    assert slow["npumoe"] > fast["npumoe"]          # a larger dispatch cost: npumoe's NPU calls take longer
    assert isinstance(df, pd.DataFrame)


def test_run_rows_carry_the_label_and_a_fitted_platform_gets_its_posterior_interval():
    """`run` on a fitted (graph-level) platform and on an overridden one: labels in `platform`, the chip profile in
    `platform_base`, and the fitted platform's rows an interval from its posterior (its ops priced on arrays)."""
    from npumoe_lab.experiments.runner import run_experiment
    df = run_experiment(model="tiny", workload="lm-heldout", variants="npumoe", prompt_len=256, chunk=128,
                        platforms="data/fits/m2-max-fit.yaml,m2-max[npu_dispatch_s=4e-4]", n_samples=1,
                        calib_tokens=1024, draws=40)
    by = df.set_index("platform")
    assert set(by.index) == {"m2-max-fit", "m2-max[npu_dispatch_s=0.0004]"}
    assert by.at["m2-max-fit", "platform_base"] == "m2-max-fit"
    assert by.at["m2-max[npu_dispatch_s=0.0004]", "platform_base"] == "m2-max"
    assert set(df.platform_chip) == {"m2-max"}          # sourced and fitted rows of one chip group together
    fit = by.loc["m2-max-fit"]
    assert fit.interval_source == "posterior+prior" and fit.interval_draws == 40
    assert fit.ttft_s_lo < fit.ttft_s_hi and fit.energy_per_token_mj_lo < fit.energy_per_token_mj_hi
