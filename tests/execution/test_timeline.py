"""Timeline scheduling, summary metrics and energy against a hand-computed case."""
import math

import pytest

from npumoe_lab.devices import DeviceModel, OpCost, Platform, get_platform
from npumoe_lab.devices.cost import expert_ffn_cost
from npumoe_lab.devices.measured import Measurement
from npumoe_lab.errors import NpuMoeError
from npumoe_lab.execution.timeline import Event, measured_event, modeled_event, schedule, summarize, to_frame



def toy_platform(shares: bool = False) -> Platform:
    # round numbers so every duration below is computed by hand
    npu = DeviceModel("npu", "modeled", throughput_flops=1e12, bandwidth_bytes_s=1e11, active_power_w=4.0,
                      idle_power_w=0.0, dispatch_s=0.5e-3, sync_s=0.5e-3, graph_limit_bytes=1e9, max_dim=16384,
                      host_cores=1.0)
    cpu = DeviceModel("cpu", "modeled", throughput_flops=1e11, bandwidth_bytes_s=5e10, active_power_w=8.0,
                      idle_power_w=0.5, freq_hz=3e9, cores=4)
    return Platform("toy", "hand-made", "modeled", npu, cpu, shares, {}, "0" * 64)


def toy_events(p: Platform) -> list[Event]:
    ops = [
        (p.npu, OpCost("group_a", 4e9, 2e8), ()),   # compute-bound: 1 ms call + 4 ms = 5 ms
        (p.npu, OpCost("group_b", 1e9, 5e8), ()),   # bandwidth-bound: 1 ms call + 5 ms = 6 ms
        (p.cpu, OpCost("cold", 6e8, 1e8), ()),      # cpu compute-bound: 6 ms
        (p.cpu, OpCost("scatter", 0.0, 1e8), (0, 1, 2)),  # 2 ms, after everything
    ]
    return [modeled_event(dev, op, chunk=0, layer=3, deps=deps) for dev, op, deps in ops]


def test_modeled_durations_by_hand():
    ev = toy_events(toy_platform())
    assert [e.duration_s for e in ev] == pytest.approx([5e-3, 6e-3, 6e-3, 2e-3])
    assert all(e.timing_source == "modeled" for e in ev)


def test_overlapping_schedule_and_summary_by_hand():
    p = toy_platform()
    ev = schedule(toy_events(p))
    # NPU: a [0,5], b [5,11]; CPU: cold [0,6] runs alongside; scatter waits for b: [11,13] ms
    assert [e.start_s for e in ev] == pytest.approx([0, 5e-3, 0, 11e-3])
    s = summarize(ev, p, n_tokens=100)
    assert s["ttft_s"] == pytest.approx(13e-3)
    assert s["npu_busy_s"] == pytest.approx(11e-3)
    assert s["cpu_busy_s"] == pytest.approx(8e-3)
    assert s["n_npu_calls"] == 2
    # host core-seconds: cpu events 8 ms x 4 cores, plus 2 NPU calls x 1 core x (0.5 + 0.5) ms dispatch + sync
    core_s = 8e-3 * 4 + 2 * 1e-3
    assert s["cpu_core_s"] == pytest.approx(core_s)
    assert s["cpu_cycles"] == pytest.approx(core_s * 3e9)
    # npu: 4 W x 11 ms + 0; cpu: (8 W / 4 cores) x core-seconds + 0.5 W x (13 - 8) ms
    energy = 4.0 * 11e-3 + 2.0 * core_s + 0.5 * 5e-3
    assert s["energy_j"] == pytest.approx(energy)
    assert s["energy_per_token_mj"] == pytest.approx(energy / 100 * 1e3)
    assert (s["timing_source"], s["energy_source"], s["cycles_source"]) == ("modeled",) * 3


def test_shared_queue_serialises_npu_and_cpu():
    p = toy_platform(shares=True)
    ev = schedule(toy_events(p), npu_shares_cpu=True)
    assert [e.start_s for e in ev] == pytest.approx([0, 5e-3, 11e-3, 17e-3])
    s = summarize(ev, p, n_tokens=10)
    assert s["ttft_s"] == pytest.approx(19e-3)
    # the NPU role is host cores here: cpu events x 4 cores + NPU events x host_cores (1), no separate NPU power;
    # the host is busy all 19 ms, so no idle energy
    core_s = 8e-3 * 4 + 11e-3 * 1
    assert s["energy_j"] == pytest.approx(2.0 * core_s)
    assert s["cpu_cycles"] == pytest.approx(core_s * 3e9)


def test_summarize_schedules_unscheduled_events_with_platform_flag():
    p = toy_platform(shares=True)
    assert summarize(toy_events(p), p, 10)["ttft_s"] == pytest.approx(19e-3)


def test_dependency_waits_across_devices():
    ev = schedule([Event("attn", 0, 0, "npu", 3.0, 0, 0, "modeled"),
                   Event("router", 0, 0, "cpu", 1.0, 0, 0, "modeled", deps=(0,)),
                   Event("other", 0, 0, "cpu", 1.0, 0, 0, "modeled")])
    # router waits for attn (3 s); "other" queues behind router on the CPU in submission order
    assert [(e.start_s, e.end_s) for e in ev] == [(0.0, 3.0), (3.0, 4.0), (4.0, 5.0)]


def test_mixed_and_measured_sources():
    p = toy_platform()
    m = Measurement(wall_s=2e-3, cpu_s=4e-3)
    ev = [measured_event("cold", "cpu", m, chunk=0, layer=0, flops=1.0), *toy_events(p)[:2]]
    s = summarize(ev, p, n_tokens=1)
    assert s["timing_source"] == "mixed"
    assert s["timing_source_cpu"] == "measured" and s["timing_source_npu"] == "modeled"
    # measured CPU seconds (both threads), not wall, plus the two modeled NPU calls' 1 ms dispatch + sync each
    assert s["cpu_cycles"] == pytest.approx((4e-3 + 2e-3) * 3e9)
    assert s["cycles_source"] == "mixed" and s["energy_source"] == "mixed"
    assert summarize(ev[:1], p, n_tokens=1)["cycles_source"] == "measured-cpu-time x modeled-clock"
    assert summarize(ev[:1], p, n_tokens=1)["energy_source"] == "measured-time x modeled-power"
    s = summarize(ev, p, n_tokens=1, measured_energy_j=1.5)
    assert s["energy_j"] == 1.5 and s["energy_source"] == "measured"


def test_two_thread_measured_run_counts_both_threads():
    # a measured run without per-op CPU time (what runtime.Clock records): each event keeps the run's 2 torch
    # threads busy for its wall time; on the host platform the NPU role's graphs run on the same threads
    p = toy_platform(shares=True)
    ev = [Event("attention", 0, 0, "cpu", 0.5, 0, 0, "measured"),
          Event("group0", 0, 0, "npu", 0.25, 0, 0, "measured", deps=(0,))]
    s = summarize(ev, p, n_tokens=4, threads=2)
    assert s["cpu_core_s"] == pytest.approx(2 * (0.5 + 0.25))
    assert s["cpu_cycles"] == pytest.approx(2 * 0.75 * 3e9)
    assert s["energy_j"] == pytest.approx(2.0 * 2 * 0.75)   # 2 W per core x 2 threads x 0.75 s, never idle
    assert s["cpu_threads"] == 2
    assert s["cycles_source"] == "measured-time x threads x modeled-clock"
    assert s["energy_source"] == "measured-time x modeled-power" and s["timing_source"] == "measured"
    assert summarize(ev, p, n_tokens=4, threads=1)["cpu_cycles"] == pytest.approx(0.75 * 3e9)
    with pytest.raises(NpuMoeError, match="threads"):
        summarize(ev, p, n_tokens=4, threads=0)


def test_bad_dependencies_and_fields_raise():
    with pytest.raises(NpuMoeError, match="not earlier events"):
        schedule([Event("a", 0, 0, "npu", 1.0, 0, 0, "modeled", deps=(1,)),
                  Event("b", 0, 0, "npu", 1.0, 0, 0, "modeled")])
    with pytest.raises(NpuMoeError, match="device 'gpu'"):
        Event("a", 0, 0, "gpu", 1.0, 0, 0, "modeled")
    with pytest.raises(NpuMoeError, match="timing_source"):
        Event("a", 0, 0, "cpu", 1.0, 0, 0, "guessed")
    with pytest.raises(NpuMoeError, match="duration_s"):
        Event("a", 0, 0, "cpu", -1.0, 0, 0, "modeled")
    with pytest.raises(NpuMoeError, match="n_tokens"):
        summarize([], toy_platform(), 0)
    with pytest.raises(NpuMoeError, match="schedule"):
        Event("a", 0, 0, "cpu", 1.0, 0, 0, "modeled").end_s


def test_to_frame_round_trip():
    df = to_frame(schedule(toy_events(toy_platform())))
    assert list(df["name"]) == ["group_a", "group_b", "cold", "scatter"]
    assert df.loc[3, "deps"] == "0 1 2"
    assert df.loc[3, "end_s"] == pytest.approx(13e-3)
    assert set(df["timing_source"]) == {"modeled"}


def test_m2_max_expert_group_by_hand():
    # Qwen3-30B-A3B geometry: 8 experts x capacity 64, H=2048, I=768, fp16 on the M2 Max ANE
    p = get_platform("m2-max")
    flops = 6 * 8 * 64 * 2048 * 768
    nbytes = (3 * 8 * 2048 * 768 + 2 * 8 * 64 * 2048) * 2
    expected = 2e-4 + 1e-4 + max(flops / 5.38e12, nbytes / 6.201e10)  # bandwidth-bound: 1.285 ms
    ev = modeled_event(p.npu, OpCost("expert_group", flops, nbytes), chunk=0, layer=0)
    assert ev.duration_s == pytest.approx(expected)
    assert math.isclose(nbytes / 6.201e10, 1.2851e-3, rel_tol=1e-3)
    s = summarize([ev], p, n_tokens=512)
    # ANE: the fit's power model, floor 0.5 W + (4.6 - 0.5) W x utilisation (achieved / peak 5.38 TF/s), i.e.
    # 0.5 W through the busy time + 4.1 W through the compute-at-peak time; one P-core (2.4 W) through the 0.3 ms
    # dispatch + sync; the CPU rail idles at 27 mW meanwhile
    ane_j = 0.5 * expected + (4.6 - 0.5) * (flops / 5.38e12)
    assert s["energy_j"] == pytest.approx(ane_j + 2.4 * 3e-4 + 0.027 * expected)
    assert s["cpu_cycles"] == pytest.approx(3e-4 * 3.3e9)


def test_m2_max_shape_aware_ane_rate_by_hand():
    # one expert, C=1024 rows, H=I=2048: GEMM (M, N, K) = (1024, 2048, 2048), effective size (1024*2048*2048)**(1/3)
    # = 2**(32/3) = 1625.5, two thirds of the way (in log size) from the 1024 point (1.68 TF/s) to the 2048 point
    # (4.51 TF/s): rate = 1.68e12 * (4.51 / 1.68) ** (2 / 3) = 3.245e12 FLOP/s
    p = get_platform("m2-max")
    rate = 1.68e12 * (4.51 / 1.68) ** (2 / 3)
    assert math.isclose(rate, 3.245e12, rel_tol=1e-3)
    flops = 6 * 1024 * 2048 * 2048                               # 2.577e10: compute-bound at 7.94 ms
    nbytes = 3 * 2048 * 2048 * 2 + 2 * 1024 * 2048 * 2           # 33.6 MB: 0.54 ms at 62.01 GB/s
    ev = modeled_event(p.npu, expert_ffn_cost(1, 1024, 2048, 2048), chunk=0, layer=0)
    assert (ev.flops, ev.bytes) == (flops, nbytes)
    assert ev.duration_s == pytest.approx(3e-4 + flops / rate)
    assert math.isclose(ev.duration_s, 8.241e-3, rel_tol=1e-3)


def test_m2_max_int8_weights_by_hand():
    # C=4 rows is bandwidth-bound: int8 weights halve the streamed weight bytes, the activations stay fp16
    p = get_platform("m2-max", npu_weight_bytes="int8")
    assert p.npu.weight_bytes == 1
    op = expert_ffn_cost(1, 4, 2048, 2048, weight_bytes=p.npu.weight_bytes)
    nbytes = 3 * 2048 * 2048 * 1 + 2 * 4 * 2048 * 2              # 12,615,680 B: 0.2034 ms at 62.01 GB/s
    compute = 6 * 4 * 2048 * 2048 / 0.93e12                      # size (4*2048*2048)**(1/3) = 256 < 512: clamped, 0.108 ms
    ev = modeled_event(p.npu, op, chunk=0, layer=0)
    assert ev.bytes == nbytes
    assert ev.duration_s == pytest.approx(3e-4 + nbytes / 6.201e10)
    assert nbytes / 6.201e10 > compute
    fp16 = modeled_event(p.npu, expert_ffn_cost(1, 4, 2048, 2048, weight_bytes=2), chunk=0, layer=0)
    assert fp16.duration_s == pytest.approx(3e-4 + (3 * 2048 * 2048 * 2 + 2 * 4 * 2048 * 2) / 6.201e10)
