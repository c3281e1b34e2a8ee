"""The array pricing of a graph-level NPU (pricing.graph -> devices/price.py) against the per-op engine
(DeviceModel.estimate -> graph_cost.graph_time, scheduled by timeline.schedule): the same numbers at the point values
on every variant, at the bundled and at the paper geometry, on a fitted YAML and on a sourced platform switched to
the graph structure; and its intervals: they follow the posterior's draws and widen with the predictive-noise hook."""
import dataclasses
import math

import numpy as np
import pytest

from npumoe_lab.devices import get_platform
from npumoe_lab.devices.cost import OpCost, attention_cost, expert_ffn_cost
from npumoe_lab.errors import NpuMoeError
from npumoe_lab.execution.runtime import PrefillConfig
from npumoe_lab.planning.variants import VARIANTS
from npumoe_lab.sim.array_replay import stream_metrics
from npumoe_lab.sim.geometries import load_geometry
from npumoe_lab.sim.pricing import parameter_draws, platform_params, price_stream, structure_of
from npumoe_lab.sim.replay import replay_prefill
from npumoe_lab.sim.routing import parse_routing
from npumoe_lab.sim.run import simulate, variant_executor
from npumoe_lab.sim.stream import NPU, CPU, build_stream, routing_counts, stream_from_ops
from tests.sim.test_array_replay import _assert_equal, _both, bundled  # noqa: F401  (bundled: a fixture)

FIT = "data/fits/m2-max-fit.yaml"
GRAPH_PLATFORMS = (FIT, "m2-max[npu_graph_model=graph]", "data/fits/m2-ultra-fit.yaml")


def test_the_platforms_here_are_graph_level():
    for spec in GRAPH_PLATFORMS:
        p = get_platform(spec)
        assert p.npu.graph_model and structure_of(platform_params(p)) == "graph"
    assert structure_of(platform_params(get_platform("m2-max"))) == "roofline"


def test_graph_pricing_is_graph_time_op_by_op():
    """Hand-made ops (an expert group, attention with context, a GEMV-like op, a memory op) priced on arrays equal
    DeviceModel.estimate (graph_cost.graph_time) one by one."""
    plat = get_platform(FIT)
    ops = [expert_ffn_cost(4, 64, 2048, 768), attention_cost(512, 1024, 2048, 32, 4, 128),
           expert_ffn_cost(1, 1, 4096, 1024), OpCost("pack", 0.0, 3e6, 1, weight_bytes=0.0),
           OpCost("lut", 2e9, 1e6, 2, (16, 512, 512), weight_bytes=5e5, rows=16, lut_params=1e6)]
    cols = {"role": np.full(len(ops), NPU), "flops": np.array([o.flops for o in ops]),
            "bytes": np.array([o.bytes for o in ops]), "calls": np.array([o.calls for o in ops]),
            "gemm_m": np.array([(o.gemm or (0, 0, 0))[0] for o in ops]),
            "gemm_n": np.array([(o.gemm or (0, 0, 0))[1] for o in ops]),
            "gemm_k": np.array([(o.gemm or (0, 0, 0))[2] for o in ops]),
            "attn_flops": np.array([o.attn_flops for o in ops]), "rows": np.array([o.gemm_rows for o in ops]),
            "lut_params": np.array([o.lut_params for o in ops])}
    got = price_stream(platform_params(plat), cols)[0]
    want = [plat.npu.estimate(o) for o in ops]
    np.testing.assert_allclose(got, want, rtol=1e-12)
    assert got[1] > plat.npu.call_overhead_s          # attention priced, not a zero
    cpu = price_stream(platform_params(plat), {**cols, "role": np.full(len(ops), CPU)})[0]
    np.testing.assert_allclose(cpu, [plat.cpu.estimate(o) for o in ops], rtol=1e-12)


@pytest.mark.parametrize("prompt,chunk", [(300, 128), (512, 256)])
def test_array_path_equals_per_op_replay_on_graph_platforms_at_the_bundled_geometry(bundled, prompt, chunk):  # noqa: F811
    geo, specs = bundled
    shared = dataclasses.replace(get_platform(FIT), npu_shares_cpu=True)
    for platform in (*map(get_platform, GRAPH_PLATFORMS), shared):
        for name, ref, got in _both(geo, specs, prompt, chunk, platform):
            _assert_equal(name, ref, got)


def test_array_path_equals_per_op_replay_on_graph_platforms_at_the_paper_geometry():
    _, _, geo = load_geometry("qwen3-30b-a3b")
    for spec in (FIT, "m2-max[npu_graph_model=graph]"):
        for name, ref, got in _both(geo, list(geo.moe), 1000, 256, get_platform(spec)):
            _assert_equal(name, ref, got)


def test_simulate_on_a_fitted_platform_has_intervals_from_the_posterior():
    kw = dict(geometry="phi-tiny-moe", routing="synthetic:gini=0.5", platforms=FIT, prompt_len="700", chunk="256")
    a, o = simulate(**kw, draws=80), simulate(**kw, engine="ops")
    for col in ("ttft_s", "energy_per_token_mj", "cpu_cycles"):
        np.testing.assert_allclose(a[col].to_numpy(float), o[col].to_numpy(float), rtol=1e-9)
        assert (a[f"{col}_lo"] < a[f"{col}_hi"]).all()
    assert set(a.interval_source) == {"posterior+prior"} and set(a.interval_draws) == {80}


def _stream(platform, variant="npumoe", prompt=512, chunk=256):
    _, _, geo = load_geometry("phi-tiny-moe")
    specs = list(geo.moe)
    src = parse_routing("synthetic:gini=0.6", specs, 0)
    executor, _ = variant_executor(VARIANTS[variant], specs, src.calibration_profile(specs, chunk, 0), platform, {})
    routed = src.chunks(specs, prompt, chunk, 0)
    config = PrefillConfig(platform, chunk, attention=VARIANTS[variant].attention)
    return (build_stream(geo, executor, routing_counts(routed, specs, prompt, chunk),
                         attention=VARIANTS[variant].attention),
            replay_prefill(geo, executor, config, routed, prompt)[0])


def _posterior_around(plat, factor: float, n: int = 200, spread: float = 0.1, seed: int = 3):
    """A posterior over graph_peak_flops and attention_flops, log-symmetric around `factor` x the point values."""
    names = ["npu_graph_peak_flops", "npu_attention_flops"]
    point = np.array([plat.npu.graph_peak_flops, plat.npu.attention_flops])
    z = np.random.default_rng(seed).standard_normal((n, 2))
    z = np.concatenate([z, -z])                       # exactly symmetric in log: the median is the centre
    return {"params": names, "draws": (factor * point * np.exp(spread * z)).tolist()}


def test_interval_contains_the_point_and_moves_with_the_draws():
    plat = get_platform(FIT)
    stream, _ = _stream(plat)
    point = stream_metrics(stream, platform_params(plat), False)["ttft_s"][0]
    around = dataclasses.replace(plat, posterior=_posterior_around(plat, 1.0))
    t = stream_metrics(stream, parameter_draws(around, 400, seed=0, rest="fixed"), False)["ttft_s"]
    lo, hi = np.percentile(t, [5, 95])
    assert lo < point < hi
    # half the peak and attention rates in every draw: compute-bound ops take longer, so the interval moves up
    slow = dataclasses.replace(plat, posterior=_posterior_around(plat, 0.5))
    t_slow = stream_metrics(stream, parameter_draws(slow, 400, seed=0, rest="fixed"), False)["ttft_s"]
    assert np.percentile(t_slow, 5) > lo and np.percentile(t_slow, 95) > hi and np.median(t_slow) > point
    # each draw is that parameter set priced: draw 0 equals the platform with those values set by hand
    d = parameter_draws(slow, 5, seed=1, rest="fixed")
    by_hand = dataclasses.replace(plat, npu=dataclasses.replace(plat.npu, graph_peak_flops=d["npu_graph_peak_flops"][0],
                                                                attention_flops=d["npu_attention_flops"][0]))
    got = stream_metrics(stream, d, False)["ttft_s"][0]
    assert math.isclose(got, stream_metrics(stream, platform_params(by_hand), False)["ttft_s"][0], rel_tol=1e-12)


def test_the_fits_posterior_moves_graph_parameters():
    """The fitted YAML's posterior columns (graph-level parameters included) reach the priced parameters."""
    plat = get_platform(FIT)
    d = parameter_draws(plat, 300, seed=0)
    names = plat.posterior["params"]
    assert "npu_graph_peak_flops" in names and d["npu_graph_peak_flops"].std() > 0
    rows = np.asarray(plat.posterior["draws"], float)
    j = names.index("npu_work_half_flops")
    assert set(np.round(d["npu_work_half_flops"], 6)) <= set(np.round(rows[:, j], 6))
    # fit-device's transfer sigma (cross-validated on fit rows) is the fit's predictive noise: one factor per draw
    sigma = float(plat.posterior["transfer_sigma_log"])
    assert sigma > 0 and np.std(np.log(d["noise_factor"])) == pytest.approx(sigma, rel=0.15)
    assert "noise_factor" not in parameter_draws(plat, 300, seed=0, noise="none")


def test_predictive_noise_hook_widens_the_interval_by_one_factor_per_draw():
    plat = get_platform(FIT)
    stream, _ = _stream(plat)
    n_post = len(plat.posterior["draws"])
    noisy = dataclasses.replace(plat, posterior={**plat.posterior, "predictive_sigma_log": [0.3] * n_post})
    base, with_noise = parameter_draws(plat, 300, seed=4, noise="none"), parameter_draws(noisy, 300, seed=4)
    for k, v in base.items():              # the same parameter draws (noise drawn after them)
        if not k.endswith("_throughput_curve"):
            np.testing.assert_array_equal(v, with_noise[k])
    f = with_noise["noise_factor"]
    assert abs(np.log(f).std() - 0.3) < 0.05
    a, b = price_stream(base, stream), price_stream(with_noise, stream)
    np.testing.assert_allclose(b, a * f[:, None], rtol=1e-12)     # every op of a draw scaled alike
    ta = stream_metrics(stream, base, False)["ttft_s"]
    tb = stream_metrics(stream, with_noise, False)["ttft_s"]
    assert np.subtract(*np.percentile(np.log(tb), [95, 5])) > np.subtract(*np.percentile(np.log(ta), [95, 5]))
    assert "noise_factor" not in parameter_draws(noisy, 10, noise="none")
    fit_sigma = parameter_draws(plat, 10, noise="fit")["noise_factor"]          # the likelihood's sigma_log
    assert fit_sigma.shape == (10,) and (fit_sigma > 0).all()
    with pytest.raises(NpuMoeError, match="predictive_sigma_log"):
        parameter_draws(dataclasses.replace(plat, posterior={**plat.posterior, "predictive_sigma_log": [0.1, 0.2]}),
                        5)


def test_a_recorded_op_list_on_a_graph_platform_prices_like_the_replay():
    """stream_from_ops carries what the graph structure reads (attention FLOPs, rows): a modeled run's ops on a
    fitted platform give the replay's point metrics, so `run` rows get intervals there too."""
    plat = get_platform(FIT)
    for variant in ("npumoe-spill", "reference"):
        _, res = _stream(plat, variant, 600, 256)
        stream = stream_from_ops(res.ops, 600)
        m = stream_metrics(stream, platform_params(plat), shared=False)
        for key in ("ttft_s", "energy_per_token_mj", "cpu_cycles"):
            assert math.isclose(m[key][0], res.summary[key], rel_tol=1e-9), (variant, key)


def test_a_fit_draws_what_it_did_not_fit_from_the_prior():
    """m2-max-fit fitted the direct path's dispatch, not Core ML's dispatch_s (what simulations pay): that one is
    drawn from its sourced range as on the sourced platform; fitted columns are posterior rows; structure stays."""
    from npumoe_lab.sim.pricing import draws_source
    plat = get_platform(FIT)
    assert "npu_dispatch_s" not in plat.posterior["params"] and draws_source(plat) == "posterior+prior"
    d = parameter_draws(plat, 400, seed=2)
    e = plat.params["npu"]["dispatch_s"]
    v, alts = e["value"], list(e["alternatives"].values())
    f = max(max(alts) / v, v / min(alts))            # the prior is centred on the sourced value
    assert d["npu_dispatch_s"].min() >= v / f and d["npu_dispatch_s"].max() <= v * f and d["npu_dispatch_s"].std() > 0
    rows = np.asarray(plat.posterior["draws"], float)
    j = plat.posterior["params"].index("npu_graph_peak_flops")
    assert np.isin(d["npu_graph_peak_flops"], rows[:, j]).all()
    fixed = parameter_draws(plat, 50, seed=2, rest="fixed")
    assert (fixed["npu_dispatch_s"] == plat.npu.dispatch_s).all()
    assert (d["npu_clusters"] == plat.npu.clusters).all()        # structural: fixed
    # the unfitted spread widens the interval: the TTFT interval with the prior for the rest contains the fixed one
    stream, _ = _stream(plat)
    wide = stream_metrics(stream, parameter_draws(plat, 300, seed=5), False)["ttft_s"]
    narrow = stream_metrics(stream, parameter_draws(plat, 300, seed=5, rest="fixed"), False)["ttft_s"]
    assert np.subtract(*np.percentile(wide, [95, 5])) > np.subtract(*np.percentile(narrow, [95, 5]))
