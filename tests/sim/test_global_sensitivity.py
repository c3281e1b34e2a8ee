"""Global sensitivity (SALib Morris): the fast stream pricer equals the engine's summary, every continuous parameter
(high-confidence ones too) is a factor, the three NPU cost structures are covered, and P(holds) is a share."""
import pytest

from npumoe_lab.devices import get_platform
from npumoe_lab.execution.clock import TimelineClock
from npumoe_lab.execution.runtime import PrefillConfig, PrefillResult, finish
from npumoe_lab.planning.variants import parse_variants
from npumoe_lab.sim.global_sensitivity import STRUCTURES, StreamPricer, factors, run_global
from npumoe_lab.sim.run import iter_simulation

FIT = "data/fits/m2-max-fit.yaml"


@pytest.fixture(scope="module")
def streams():
    base = get_platform("m2-max")
    return {r["variant"]: res for r, res in iter_simulation("phi-tiny-moe", "synthetic:gini=0.6", [base],
                                                              "cpu-only,npumoe,naive-npu", 512, 256, engine="ops")}


@pytest.mark.parametrize("spec", ["m2-max[npu_dispatch_s=3e-4]", "m2-ultra", FIT])
def test_stream_pricer_equals_the_engine_summary(streams, spec):
    p = get_platform(spec)
    att = {v.name: v.attention for v in parse_variants("cpu-only,npumoe,naive-npu")}
    for name, r in streams.items():
        clock = TimelineClock(p, measured=False, stats=r.stats)
        for op, deps, wall in r.ops:
            clock.record(op, wall, deps)
        want = finish(PrefillResult(None, None, clock.events, r.stats, 0.0), PrefillConfig(p, 256, attention=att[name]),
                      512).summary
        got = StreamPricer(r, 512).summary(p)
        for k in got:
            assert got[k] == pytest.approx(want[k], rel=1e-9), (name, k)


def test_factors_include_high_confidence_parameters_and_posterior_ranges():
    src = {k: (lo, hi, why) for k, lo, hi, why in factors(get_platform("m2-max"))}
    assert "npu_bandwidth_bytes_s" in src                      # confidence H in the sourced platform
    assert src["npu_dispatch_s"][:2] == (1e-4, 4e-4)           # its sourced alternatives (direct_path, coreml_high)
    fit = {k: why for k, _, _, why in factors(get_platform(FIT))}
    assert fit["npu_graph_peak_flops"] == "posterior 5-95 %"


def test_run_global_covers_structures_and_gives_probabilities():
    effects, probs = run_global(FIT, geometry="phi-tiny-moe", prompt_len=512, chunk=256, trajectories=2,
                                posterior_draws=10)
    assert set(effects.structure) == set(STRUCTURES)
    assert set(probs.structure) == set(STRUCTURES) | {"as fitted"}
    assert set(probs.platform) == set(effects.platform) == {"m2-max-fit"}      # the label, not the file path
    assert probs.p_holds.between(0, 1).all() and (probs[probs.over == "posterior draws"].n == 10).all()
    assert (effects.mu_star >= 0).all() and effects.factor.nunique() == len(factors(get_platform(FIT)))
