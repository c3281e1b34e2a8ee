"""One forward per numerics (experiments/shared_numerics.py) and the dtype columns of result rows.

References: a modeled platform's own forward (its timeline must equal the one derived from a measured run's op
records), and the same runner call with sharing switched off (equal rows, more forwards)."""
import pandas as pd
import pytest
import torch

import npumoe_lab as nl
from npumoe_lab.experiments import runner
from npumoe_lab.experiments.runner import run_experiment
from npumoe_lab.experiments.shared_numerics import Numerics, remodel
from npumoe_lab.execution.geometry import ModelGeometry
from npumoe_lab.planning.layout import ExecutionLayout
from npumoe_lab.models import describe
from npumoe_lab.execution.runtime import PrefillConfig, run_prefill
from tests.model_zoo import tiny_model
from tests.experiments.test_runner import standin  # noqa: F401 (fixture)

torch.set_num_threads(1)
SUMMARY = ["ttft_s", "energy_j", "cpu_busy_s", "npu_busy_s", "n_npu_calls", "drop_rate", "pad_rate"]


def prefills_counted(monkeypatch) -> list:
    """The platform of every forward the runner runs (run_prefill), in order."""
    calls, real = [], runner.run_prefill

    def counting(model, ids, config, **kw):
        calls.append(config.platform.name)
        return real(model, ids, config, **kw)
    monkeypatch.setattr(runner, "run_prefill", counting)
    return calls


@pytest.mark.parametrize("attached", [False, True])
def test_remodelled_timeline_equals_a_modeled_forward(attached):
    model = tiny_model("qwen3_moe", seed=8)
    ids = torch.randint(3, 128, (1, 50), generator=torch.Generator().manual_seed(2))
    nl.detach(model)
    model.set_experts_implementation("eager")
    if attached:
        nl.attach(model, ExecutionLayout.dropless(describe(model)), cold="dynamic")
    measured = run_prefill(model, ids, PrefillConfig("cpu", 16, attention="npu"))
    modeled_cfg = PrefillConfig("m2-max", 16, attention="npu")
    own = run_prefill(model, ids, modeled_cfg)
    src = Numerics("cpu", measured.ops, measured.stats, measured.wall_s, {}, {})
    derived = remodel(src, modeled_cfg, ModelGeometry.from_config(model.config), n_tokens=50)
    nl.detach(model)
    assert [e.name for e in derived.events] == [e.name for e in own.events]
    assert all(e.timing_source == "modeled" for e in derived.events)
    for k in SUMMARY:
        assert derived.summary[k] == pytest.approx(own.summary[k], rel=1e-9, abs=1e-15), k


def test_runner_shares_forwards_between_platforms_and_records_dtype(standin, tmp_path, monkeypatch):  # noqa: F811
    monkeypatch.setenv("NPUMOE_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("NPUMOE_CPU_FLAGS", "avx2,fma")          # the AVX2-only EPYC: fp32 is the fast dtype
    calls = prefills_counted(monkeypatch)
    kw = dict(model=str(standin), workload="lm-heldout", variants="reference,cpu-only,npumoe-tg",
              platforms="cpu,m2-max", prompt_len=256, chunk=128, n_samples=2, repeats=2, calib_tokens=1024, warmup=0)
    shared = run_experiment(**kw)
    n_shared = list(calls)
    calls.clear()
    alone = run_experiment(**kw, share_numerics=False)            # every row from its own forward
    # modeled rows: reference and cpu-only from the measured run's records, npumoe-tg once per sample
    assert n_shared.count("m2-max") == 2 + 2 and n_shared.count("cpu") == 3 * 2 * 2
    assert calls.count("m2-max") == 3 * 2 * 2 + 2 and calls.count("cpu") == 3 * 2 * 2
    assert set(shared.dtype) == {"fp32"} and set(shared.cpu_flags) == {"avx2,fma+override"}
    keys = ["variant", "platform", "repeat"]
    a, b = shared.set_index(keys).sort_index(), alone.set_index(keys).sort_index()
    modeled = a.index.get_level_values("platform") == "m2-max"
    cols = ["ttft_s", "energy_j", "n_npu_calls", "drop_rate", "pad_rate", "score", "kl", "top1_agree"]
    pd.testing.assert_frame_equal(a.loc[modeled, cols], b.loc[modeled, cols], rtol=1e-9)
    assert (a.loc[~modeled, ["score", "kl"]].values == b.loc[~modeled, ["score", "kl"]].values).all()


def test_dtype_asked_for_a_loaded_model_of_another_dtype_is_an_error(standin):  # noqa: F811
    from npumoe_lab.errors import NpuMoeError
    from npumoe_lab.models import load_model
    with pytest.raises(NpuMoeError, match="load_model"):
        run_experiment(model=load_model(str(standin), dtype="fp32"), workload="lm-heldout", variants="reference",
                       platforms="m2-max", dtype="bf16")


def test_a_plan_with_every_group_on_the_cpu_shares_the_dynamic_forward(standin, tmp_path, monkeypatch):  # noqa: F811
    """npumoe whose residency keeps no group on the NPU (the cost rule on M2 Ultra, or on M2 Max for the bundled
    model) computes what anemll computes: its modeled rows come from that forward, and equal its own forwards'."""
    from npumoe_lab.experiments.shared_numerics import all_cold, numerics_key
    from npumoe_lab.planning.plan import variant_plan
    from npumoe_lab.planning.variants import get_variant
    monkeypatch.setenv("NPUMOE_CACHE", str(tmp_path / "cache"))
    calls = prefills_counted(monkeypatch)
    kw = dict(model=str(standin), workload="lm-heldout", variants="anemll,npumoe,npumoe-spill,npumoe-tg",
              platforms="cpu,m2-max", prompt_len=256, chunk=128, n_samples=2, repeats=1, calib_tokens=1024,
              warmup=0, residency="threshold", hot_threshold=1e9)      # no group is that hot: all on the CPU
    shared = run_experiment(**kw)
    n_shared = list(calls)
    calls.clear()
    alone = run_experiment(**kw, share_numerics=False)
    # m2-max: anemll, npumoe and npumoe-spill from the measured anemll forward; npumoe-tg (residency "all") its own
    assert n_shared.count("m2-max") == 2 and calls.count("m2-max") == 4 * 2
    keys = ["variant", "platform", "repeat"]
    a, b = shared.set_index(keys).sort_index(), alone.set_index(keys).sort_index()
    cols = ["ttft_s", "energy_j", "n_npu_calls", "drop_rate", "pad_rate", "score", "kl", "top1_agree"]
    modeled = a.index.get_level_values("platform") == "m2-max"
    pd.testing.assert_frame_equal(a.loc[modeled, cols], b.loc[modeled, cols], rtol=1e-9)
    calls_of = a.loc[modeled, "n_npu_calls"].droplevel(["platform", "repeat"])
    assert calls_of["npumoe"] == calls_of["npumoe-spill"] == calls_of["anemll"] < calls_of["npumoe-tg"]  # attention
    # the key: a plan with one resident group is not the dynamic path
    m = nl.load_model(str(standin), dtype="fp32")[0]
    prof = runner.calibration_profile(m, nl.load_model(str(standin), dtype="fp32")[1], "mixed", 128, 1024, 0)
    cold = variant_plan(prof, "npumoe", m, platform="m2-max", residency="threshold", hot_threshold=1e9)
    hot = variant_plan(prof, "npumoe-tg", m, platform="m2-max")
    config = PrefillConfig("m2-max", 128, attention="npu")
    assert all_cold(cold) and not all_cold(hot)
    assert numerics_key(get_variant("npumoe"), cold, config) == numerics_key(get_variant("anemll"), None, config)
    assert numerics_key(get_variant("npumoe-tg"), hot, config) != numerics_key(get_variant("anemll"), None, config)
