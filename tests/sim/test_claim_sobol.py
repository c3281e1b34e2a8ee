"""Sobol indices and 'to settle' gains of claim_sobol against hand-computed references."""
import numpy as np
import pytest

from npumoe_lab.errors import NpuMoeError
from npumoe_lab.sim.claim_sobol import factors_of, settle_gains, settle_line, sobol_indices


def _draws(n=4000, seed=1):
    rng = np.random.default_rng(seed)
    return {"npu_a": np.exp(rng.uniform(0, 1, n)), "npu_b": np.exp(rng.uniform(0, 2, n)),
            "npu_fixed": np.full(n, 3.0)}


def test_sobol_of_an_additive_log_model_matches_the_variance_shares():
    # log y = 2 log a + 1 log b, log a ~ U(0, 1), log b ~ U(0, 2): variances 4/12 and 4/12 -> S1 = ST = 0.5 each
    d = _draws()
    res = sobol_indices(d, lambda p: {"c": p["npu_a"] ** 2 * p["npu_b"]}, n_base=1024, seed=0)["c"]
    assert res["names"] == ["npu_a", "npu_b"]          # the constant input is not a factor
    assert res["S1"] == pytest.approx([0.5, 0.5], abs=0.06)
    assert res["ST"] == pytest.approx([0.5, 0.5], abs=0.06)


def test_sobol_of_an_input_that_does_not_matter_is_zero():
    d = _draws()
    res = sobol_indices(d, lambda p: {"c": p["npu_b"] * 1.0}, n_base=512, seed=0)["c"]
    assert res["ST"][0] == pytest.approx(0.0, abs=0.02) and res["ST"][1] == pytest.approx(1.0, abs=0.06)


def test_settle_gain_is_largest_for_the_deciding_parameter():
    d = _draws()
    y = d["npu_b"] / np.exp(1.0)          # holds iff log b > 1: P = 0.5; knowing b settles it, a says nothing
    g = settle_gains(d, y)
    # bins of +-0.1 in log b: each bin's P is 0 or 1 except the one at the threshold -> E|dP| ~ 0.5
    assert g["npu_b"] == pytest.approx(0.5, abs=0.05)
    assert g["npu_a"] < 0.05
    line = settle_line("x", "m2-max", g)
    assert "npu_b" in line and "m2-max" in line


def test_bad_inputs_say_what_to_do():
    with pytest.raises(NpuMoeError, match="power of two"):
        sobol_indices(_draws(), lambda p: {"c": p["npu_a"]}, n_base=100)
    with pytest.raises(NpuMoeError, match="varies"):
        sobol_indices({"npu_fixed": np.ones(10)}, lambda p: {"c": p["npu_fixed"]}, n_base=16)
    assert factors_of({"npu_x_throughput_curve": None, "npu_y": np.arange(5.0) + 1}) == ["npu_y"]


def test_sensitivity_sobol_apportions_power_only_to_energy():
    """run_sobol on a small simulation: power parameters cannot move a time or a cycle count (total index ~0
    there) and do move the energy conclusion; P(holds) is the share of joint draws where the ratio > 1."""
    from npumoe_lab.sim.global_sensitivity import run_sobol
    eff, probs = run_sobol("m2-max", "phi-tiny-moe", "synthetic:gini=0.5", 256, 128, n_base=32, draws=200)
    st = eff.set_index(["conclusion", "factor"]).ST
    for c in ("npumoe faster than cpu-only", "npumoe fewer CPU cycles than cpu-only"):
        assert abs(st[(c, "npu_active_power_w")]) < 0.02, c
    assert st[("npumoe less energy than cpu-only", "cpu_power_per_core_w")] > 0.05
    assert probs.p_holds.between(0, 1).all() and probs.settle.str.len().gt(0).all()
