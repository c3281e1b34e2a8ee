"""The array path (sim/stream.py + array_replay.py) against the per-op replay (sim/replay.py, the engine's own op
records scheduled by timeline.schedule and summarised by timeline.summarize): the same numbers on every variant, at
the bundled model's geometry and at the paper's (Qwen3-30B-A3B), on a separate NPU and on a shared one; and the
pieces (counts, pricing, draws) against independent NumPy / hand computations."""
import dataclasses
import math

import numpy as np
import pytest

import npumoe_lab as nl
from npumoe_lab.devices import get_platform
from npumoe_lab.errors import NpuMoeError
from npumoe_lab.execution.geometry import ModelGeometry
from npumoe_lab.execution.runtime import PrefillConfig
from npumoe_lab.planning.variants import VARIANTS
from npumoe_lab.sim.array_replay import stream_metrics, summarize_stream
from npumoe_lab.sim.geometries import load_geometry
from npumoe_lab.sim.pricing import parameter_draws, platform_params, price_stream
from npumoe_lab.sim.replay import replay_prefill
from npumoe_lab.sim.routing import parse_routing
from npumoe_lab.sim.run import simulate, variant_executor
from npumoe_lab.sim.stream import NPU, build_stream, routing_counts

KEYS = ("ttft_s", "energy_j", "energy_per_token_mj", "cpu_cycles", "cpu_core_s", "npu_busy_s", "cpu_busy_s",
        "n_npu_calls", "drop_rate", "pad_rate", "timing_source_npu", "timing_source_cpu", "cycles_source")


def _both(geo, specs, prompt, chunk, platform, routing="synthetic:gini=0.6", seed=0):
    src = parse_routing(routing, specs, seed)
    profile = src.calibration_profile(specs, chunk, seed)
    routed = src.chunks(specs, prompt, chunk, seed)
    counts = routing_counts(routed, specs, prompt, chunk)
    for v in VARIANTS.values():
        executor, _ = variant_executor(v, specs, profile, platform, {})
        config = PrefillConfig(platform, chunk, attention=v.attention)
        ref = replay_prefill(geo, executor, config, routed, prompt)[0].summary
        stream = build_stream(geo, executor, counts, attention=v.attention, dtype_bytes=config.dtype_bytes,
                              npu_weight_bytes=config.npu_weight_bytes)
        yield v.name, ref, summarize_stream(stream, platform)


def _assert_equal(name, ref, got):
    assert set(ref) - {"host_wall_s"} <= set(got), (name, set(ref) - set(got))      # every summary column
    for key in KEYS:
        a, b = ref[key], got[key]
        if isinstance(a, float):
            assert math.isclose(b, a, rel_tol=1e-9, abs_tol=1e-15), (name, key, a, b)
        else:
            assert a == b, (name, key, a, b)


@pytest.fixture(scope="module")
def bundled():
    model, _ = nl.load_model("tiny")
    geo = ModelGeometry.from_config(model.config)
    return geo, list(geo.moe)


@pytest.mark.parametrize("prompt,chunk", [(300, 128), (512, 256)])      # a padded last chunk, and none
def test_array_path_equals_per_op_replay_at_the_bundled_geometry(bundled, prompt, chunk):
    geo, specs = bundled
    shared = dataclasses.replace(get_platform("m2-max"), npu_shares_cpu=True)   # one queue for both roles
    for platform in (get_platform("m2-max"), get_platform("m2-ultra", npu_weight_bytes="int8"), shared):
        for name, ref, got in _both(geo, specs, prompt, chunk, platform):
            _assert_equal(name, ref, got)


def test_array_path_equals_per_op_replay_at_the_paper_geometry():
    _, _, geo = load_geometry("qwen3-30b-a3b")
    for name, ref, got in _both(geo, list(geo.moe), 1000, 256, get_platform("m2-max")):
        _assert_equal(name, ref, got)


def test_simulate_default_engine_rows_equal_the_per_op_engine():
    kw = dict(geometry="phi-tiny-moe", routing="synthetic:gini=0.5", platforms="m2-max,m3-max", prompt_len="700",
              chunk="256")
    a, o = simulate(**kw), simulate(**kw, engine="ops")
    for col in ("ttft_s", "energy_per_token_mj", "cpu_cycles", "n_npu_calls", "drop_rate", "pad_rate"):
        np.testing.assert_allclose(a[col].to_numpy(float), o[col].to_numpy(float), rtol=1e-9, atol=1e-15)


def test_routing_counts_are_the_bincount_of_the_real_tokens():
    _, _, geo = load_geometry("phi-tiny-moe")
    specs = list(geo.moe)
    routed = parse_routing("synthetic:gini=0.6", specs, 3).chunks(specs, 300, 128, 3)
    counts = routing_counts(routed, specs, 300, 128)
    for c, n_real in enumerate((128, 128, 44)):
        for j, s in enumerate(specs):
            idx = np.asarray(routed[c][s.layer][0])
            assert (counts.real[c, j] == np.bincount(idx[:n_real].reshape(-1), minlength=s.n_experts)).all()
            assert counts.touched[c, j] == len(np.unique(idx))


def test_pricing_is_the_roofline_by_hand():
    plat = get_platform("m2-max")
    cols = {"role": np.array([NPU, 1, NPU]), "flops": np.array([2.0e9, 0.0, 6.0 * 4 * 512 * 2048 * 768]),
            "bytes": np.array([1e6, 4e8, 3.0 * 4 * 2048 * 768 * 2]), "calls": np.array([1, 1, 1]),
            "gemm_m": np.array([0, 0, 512]), "gemm_n": np.array([0, 0, 768]), "gemm_k": np.array([0, 0, 2048])}
    d = price_stream(platform_params(plat), cols)[0]
    npu, cpu = plat.npu, plat.cpu
    call = npu.dispatch_s + npu.sync_s
    assert d[0] == pytest.approx(call + max(2.0e9 / npu.throughput_flops, 1e6 / npu.bandwidth_bytes_s), rel=1e-12)
    assert d[1] == pytest.approx(cpu.op_overhead_s + 4e8 / cpu.bandwidth_bytes_s, rel=1e-12)
    size = (512 * 768 * 2048) ** (1 / 3)                   # between the curve's 512 and 1024 points: log-log
    (s0, r0), (s1, r1) = [p for p in npu.throughput_curve if p[0] in (512.0, 1024.0)]
    rate = math.exp(math.log(r0) + math.log(size / s0) / math.log(s1 / s0) * math.log(r1 / r0))
    assert d[2] == pytest.approx(call + max(cols["flops"][2] / rate, cols["bytes"][2] / npu.bandwidth_bytes_s),
                                 rel=1e-12)


def test_prior_draws_span_the_alternatives_and_give_an_interval_around_the_point():
    plat = get_platform("m2-max")
    d = parameter_draws(plat, 400, seed=1)
    disp = plat.params["npu"]["dispatch_s"]
    v, alts = disp["value"], list(disp["alternatives"].values())
    f = max(max(alts) / v, v / min(alts))            # centred on the sourced value, every alternative inside
    assert d["npu_dispatch_s"].min() >= v / f and d["npu_dispatch_s"].max() <= v * f
    assert d["npu_dispatch_s"].min() < min(alts) * 1.1 and d["npu_dispatch_s"].max() > max(alts) / 1.1
    assert np.median(np.log(d["npu_dispatch_s"] / v)) == pytest.approx(0.0, abs=0.15)
    assert d["npu_dispatch_s"].std() > 0
    assert (d["npu_bandwidth_bytes_s"] == plat.npu.bandwidth_bytes_s).all()       # confidence H: fixed
    np.testing.assert_array_equal(parameter_draws(plat, 50, seed=2)["cpu_freq_hz"],
                                  parameter_draws(plat, 50, seed=2)["cpu_freq_hz"])   # seeded
    rows = simulate("phi-tiny-moe", "synthetic:gini=0.5", "m2-max", "npumoe,cpu-only", 512, 256, draws=100)
    for m in ("ttft_s", "energy_per_token_mj", "cpu_cycles"):
        assert (rows[f"{m}_lo"] < rows[f"{m}_hi"]).all()
    assert set(rows.interval_source) == {"prior"} and set(rows.interval_draws) == {100}


def test_posterior_draws_are_resampled_from_the_platform_file():
    plat = get_platform("m2-max")
    post = {"params": ["npu_dispatch_s"], "draws": [[1e-4], [3e-4]]}
    p = dataclasses.replace(plat, posterior=post)        # fit-device's format: {params, draws[, sigma_log]}
    d = parameter_draws(p, 200, seed=0)
    assert set(np.unique(d["npu_dispatch_s"])) == {1e-4, 3e-4}
    # not in the posterior: drawn from its prior (confidence L, sourced alternatives), or fixed on request
    sync = plat.params["npu"]["sync_s"]
    f = max(max(sync["alternatives"].values()) / sync["value"], sync["value"] / max(min(sync["alternatives"].values()), 1e-300))
    assert d["npu_sync_s"].std() > 0 and d["npu_sync_s"].min() >= sync["value"] / f
    assert (parameter_draws(p, 50, seed=0, rest="fixed")["npu_sync_s"] == plat.npu.sync_s).all()
    assert (d["npu_bandwidth_bytes_s"] == plat.npu.bandwidth_bytes_s).all()     # confidence H: its point value
    with pytest.raises(NpuMoeError, match="draws"):
        parameter_draws(plat, 0)


def test_one_draw_at_the_point_values_is_the_point_summary():
    _, _, geo = load_geometry("phi-tiny-moe")
    specs = list(geo.moe)
    plat = get_platform("m2-max")
    src = parse_routing("synthetic:gini=0.6", specs, 0)
    executor, _ = variant_executor(VARIANTS["npumoe"], specs, src.calibration_profile(specs, 256, 0), plat, {})
    stream = build_stream(geo, executor, routing_counts(src.chunks(specs, 512, 256, 0), specs, 512, 256))
    point = platform_params(plat)
    many = {k: (np.full(3, v) if not k.endswith("_throughput_curve") else v) for k, v in point.items()}
    m = stream_metrics(stream, many, shared=False)
    assert np.allclose(m["ttft_s"], summarize_stream(stream, plat)["ttft_s"], rtol=1e-12)


def test_stream_events_are_the_per_op_timeline():
    """Names, roles, dependencies, start times and durations of the array stream's events equal the replay's."""
    from npumoe_lab.sim.array_replay import stream_events
    _, _, geo = load_geometry("phi-tiny-moe")
    specs, plat = list(geo.moe), get_platform("m2-max")
    src = parse_routing("synthetic:gini=0.6", specs, 0)
    routed = src.chunks(specs, 600, 256, 0)
    for name in ("npumoe-spill", "reference", "naive-npu"):
        v = VARIANTS[name]
        executor, _ = variant_executor(v, specs, src.calibration_profile(specs, 256, 0), plat, {})
        config = PrefillConfig(plat, 256, attention=v.attention)
        ref = replay_prefill(geo, executor, config, routed, 600)[0].events
        got = stream_events(build_stream(geo, executor, routing_counts(routed, specs, 600, 256),
                                         attention=v.attention), plat)
        assert [(e.name, e.device, e.layer, e.chunk, e.deps) for e in got] == \
            [(e.name, e.device, e.layer, e.chunk, e.deps) for e in ref]
        np.testing.assert_allclose([e.start_s for e in got], [e.start_s for e in ref], rtol=1e-9, atol=1e-15)
        np.testing.assert_allclose([e.duration_s for e in got], [e.duration_s for e in ref], rtol=1e-9, atol=1e-15)


def test_a_recorded_op_list_prices_like_its_stream():
    """stream_from_ops of the replay's own op records gives the same point metrics as the replay's summary."""
    from npumoe_lab.sim.stream import stream_from_ops
    _, _, geo = load_geometry("phi-tiny-moe")
    specs, plat = list(geo.moe), get_platform("m2-max")
    src = parse_routing("synthetic:gini=0.6", specs, 0)
    routed = src.chunks(specs, 600, 256, 0)
    for name in ("npumoe-spill", "reference"):
        v = VARIANTS[name]
        executor, _ = variant_executor(v, specs, src.calibration_profile(specs, 256, 0), plat, {})
        res = replay_prefill(geo, executor, PrefillConfig(plat, 256, attention=v.attention), routed, 600)[0]
        stream = stream_from_ops(res.ops, 600)
        m = stream_metrics(stream, platform_params(plat), shared=False)
        for key in ("ttft_s", "energy_per_token_mj", "cpu_cycles"):
            assert math.isclose(m[key][0], res.summary[key], rel_tol=1e-9), (name, key)


def test_run_rows_on_a_modeled_platform_carry_the_interval_of_the_samples_mean():
    """run_experiment(draws=N): each modeled row's _lo/_hi = percentiles over draws of the samples' mean, from each
    sample's own ops; the measured platform gets none."""
    from npumoe_lab.experiments.runner import run_experiment
    df = run_experiment(model="tiny", workload="lm-heldout", variants="npumoe", platforms="m2-max", prompt_len=256,
                        chunk=128, n_samples=2, calib_tokens=1024, draws=60)
    row = df.iloc[0]
    assert row.interval_draws == 60 and row.interval_source == "prior"
    assert row.ttft_s_lo < row.ttft_s_hi and row.cpu_cycles_lo < row.cpu_cycles_hi
