"""Op costs, device roofline estimates, platform YAMLs and overrides, host profile, measurement."""
import time

import pytest

from npumoe_lab.devices import (DeviceModel, OpCost, attention_cost, dense_cost, expert_ffn_cost,
                                format_platforms, get_platform, list_platforms, measure, memory_cost)
from npumoe_lab.devices import hostprofile, measured
from npumoe_lab.devices.platform import FIELDS, REQUIRED, _read_yaml
from npumoe_lab.errors import NpuMoeError

APPLE = ["m2-max", "m2-ultra", "m3-max", "m4-max"]


# --- costs (hand-computed) -------------------------------------------------------------------------------------
def test_expert_ffn_cost_by_hand():
    c = expert_ffn_cost(2, 4, 8, 16)  # G=2, C=4, H=8, I=16, fp16
    assert c.flops == 6 * 2 * 4 * 8 * 16 == 6144
    assert c.bytes == (3 * 2 * 8 * 16 + 2 * 2 * 4 * 8) * 2 == 1792  # weights + x in + y out
    assert (c.name, c.calls) == ("expert_group", 1)
    assert expert_ffn_cost(1, 1, 1, 1, dtype_bytes=4, calls=3).calls == 3


def test_attention_cost_by_hand():
    # chunk 4 over 12 past tokens, hidden 16, 4 heads / 2 kv heads of dim 4 -> 16 keys, q_dim 16, kv_dim 8
    c = attention_cost(chunk=4, past=12, hidden=16, n_heads=4, n_kv_heads=2, head_dim=4)
    proj = 16 * 16 + 2 * 16 * 8 + 16 * 16          # Wq, Wk, Wv, Wo = 768
    assert c.flops == 2 * 4 * proj + 2 * (2 * 4 * 4 * 16 * 4) == 10240
    assert c.bytes == (proj + 2 * 4 * 16 + 2 * 16 * 8 + 2 * 4 * 8) * 2 == 2432
    with pytest.raises(NpuMoeError, match="n_kv_heads"):
        attention_cost(4, 0, 16, 3, 2, 4)


def test_dense_and_memory_cost_by_hand():
    d = dense_cost(3, 5, 7)
    assert (d.flops, d.bytes) == (2 * 3 * 5 * 7, (35 + 15 + 21) * 2)
    m = memory_cost(1000, "scatter")
    assert (m.name, m.flops, m.bytes, m.calls) == ("scatter", 0.0, 1000.0, 1)
    both = OpCost.combine("moe_cpu", d, m)
    assert (both.flops, both.bytes, both.calls) == (210.0, 1142.0, 2)


def test_builders_carry_gemm_shape_and_weight_bytes():
    c = expert_ffn_cost(2, 4, 8, 16, weight_bytes=1)     # per expert [C, H] x [H, I]: (M, N, K) = (4, 16, 8)
    assert c.gemm == (4, 16, 8)
    assert c.bytes == 3 * 2 * 8 * 16 * 1 + 2 * 2 * 4 * 8 * 2 == 1024  # int8 weights, fp16 activations
    assert expert_ffn_cost(2, 4, 8, 16, dtype_bytes=4).bytes == (3 * 2 * 8 * 16 + 2 * 2 * 4 * 8) * 4
    d = dense_cost(3, 5, 7, weight_bytes=1)
    assert (d.gemm, d.bytes) == ((3, 7, 5), 35 * 1 + (15 + 21) * 2)
    a = attention_cost(chunk=4, past=12, hidden=16, n_heads=4, n_kv_heads=2, head_dim=4, weight_bytes=1)
    assert a.gemm == (4, 16, 16)                          # the Q projection [4, 16] x [16, 4*4]
    assert a.bytes == 768 * 1 + (2 * 4 * 16 + 2 * 16 * 8 + 2 * 4 * 8) * 2
    both = OpCost.combine("x", memory_cost(10, "m"), d, expert_ffn_cost(1, 1, 2, 2))
    assert both.gemm == d.gemm                            # the op with the most FLOPs (210 vs 24)
    with pytest.raises(NpuMoeError, match="weight_bytes"):
        expert_ffn_cost(1, 1, 1, 1, weight_bytes=0)


def test_opcost_validation():
    with pytest.raises(NpuMoeError, match=r"\(M, N, K\)"):
        OpCost("x", 1.0, 1.0, gemm=(1, 2))
    with pytest.raises(NpuMoeError, match="gemm N"):
        OpCost("x", 1.0, 1.0, gemm=(1, 0, 2))
    with pytest.raises(NpuMoeError, match="flops"):
        OpCost("x", -1.0, 0.0)
    with pytest.raises(NpuMoeError, match="calls"):
        OpCost("x", 1.0, 1.0, calls=0)
    with pytest.raises(NpuMoeError, match="capacity"):
        expert_ffn_cost(1, 0, 8, 8)


# --- roofline estimate -------------------------------------------------------------------------------------------
NPU = DeviceModel("npu", "modeled", throughput_flops=2e12, bandwidth_bytes_s=5e10, active_power_w=4.0,
                  idle_power_w=0.0, dispatch_s=2e-4, sync_s=1e-4, graph_limit_bytes=1e9, max_dim=100)


def test_estimate_compute_bound():
    op = OpCost("g", flops=2e10, bytes=1e8, calls=1)  # 10 ms compute vs 2 ms memory
    assert NPU.estimate(op) == pytest.approx(3e-4 + 1e-2)


def test_estimate_bandwidth_bound_and_calls():
    op = OpCost("g", flops=2e9, bytes=1e9, calls=4)  # 1 ms compute vs 20 ms memory, 4 dispatches
    assert NPU.estimate(op) == pytest.approx(4 * 3e-4 + 2e-2)


def test_cpu_per_op_overhead():
    cpu = DeviceModel("cpu", "modeled", throughput_flops=1e11, bandwidth_bytes_s=1e10, active_power_w=8.0,
                      idle_power_w=0.1, op_overhead_s=1e-5, freq_hz=3e9, cores=4)
    assert cpu.estimate(OpCost("cold", 1e9, 1e6, calls=3)) == pytest.approx(3e-5 + 1e-2)


def test_fits_graph_and_model_validation():
    assert NPU.fits_graph(5e8, dims=(64, 100)) and not NPU.fits_graph(2e9) and not NPU.fits_graph(1.0, (101,))
    with pytest.raises(NpuMoeError, match="role 'gpu'"):
        DeviceModel("gpu", "modeled", 1.0, 1.0, 1.0, 0.0)
    with pytest.raises(NpuMoeError, match="throughput_flops"):
        DeviceModel("npu", "modeled", 0.0, 1.0, 1.0, 0.0)


# --- platform files ----------------------------------------------------------------------------------------------
def test_platform_list_and_yaml_completeness():
    assert list_platforms() == sorted(["cpu", *APPLE])
    for name in list_platforms():
        raw = _read_yaml(name)
        for role, keys in REQUIRED.items():
            assert set(keys) <= set(raw[role]), (name, role)
            for key, entry in raw[role].items():
                assert all(f in entry for f in FIELDS), (name, role, key)
                assert entry["source"].strip() and entry["note"].strip() and entry["unit"].strip()
                assert entry["confidence"] in ("H", "M", "L")
        p = get_platform(name)
        for role in ("npu", "cpu"):
            for key, entry in p.params[role].items():  # after loading, every value is a number (or points)
                v = entry["value"]
                if key == "throughput_curve":
                    assert all(isinstance(x, (int, float)) for pt in v for x in pt), (name, role, key)
                else:
                    assert isinstance(v, (int, float)) and entry["source"], (name, role, key)


def test_apple_platforms_are_modeled_and_host_is_measured():
    for name in APPLE:
        p = get_platform(name)
        assert (p.kind, p.npu.kind, p.cpu.kind, p.npu_shares_cpu) == ("modeled", "modeled", "modeled", False)
    host = get_platform("cpu")
    assert (host.kind, host.npu_shares_cpu) == ("measured", True)
    assert host.npu.active_power_w == host.cpu.active_power_w  # same cores


def test_m2_max_key_values():
    p = get_platform("m2-max")
    assert p.npu.throughput_flops == 5.38e12  # measured single GEMM, not the 15.8 TOPS marketing figure
    assert p.params["npu"]["throughput_flops"]["alternatives"]["marketing"] == 1.58e13
    assert (p.npu.bandwidth_bytes_s, p.npu.dispatch_s + p.npu.sync_s) == (6.201e10, pytest.approx(3e-4))
    assert (p.npu.graph_limit_bytes, p.npu.max_dim, p.cpu.cores) == (1.2e9, 16384, 8)
    assert p.cpu.active_power_w == pytest.approx(19.2)


def test_m2_ultra_uses_one_ane_cluster():
    ultra, m2max = get_platform("m2-ultra"), get_platform("m2-max")
    assert ultra.npu.throughput_flops == m2max.npu.throughput_flops
    assert ultra.npu.bandwidth_bytes_s == pytest.approx(m2max.npu.bandwidth_bytes_s, rel=0.01)
    assert any("one 16-core ANE cluster" in a.lower() or "ONE 16-core" in a for a in ultra.params["assumptions"])
    assert ultra.cpu.cores == 16


def test_gemm_rate_curve_log_log_and_clamped():
    p = get_platform("m2-max")
    npu = p.npu
    assert npu.gemm_rate((1024, 1024, 1024)) == pytest.approx(1.68e12)          # a measured point, exactly
    assert npu.gemm_rate((2048, 2048, 2048)) == pytest.approx(4.51e12)
    # (512*1024*2048)**(1/3) = 1024: a non-square GEMM rated as the cube of the same work
    assert npu.gemm_rate((512, 1024, 2048)) == pytest.approx(1.68e12)
    # 1448 ~ sqrt(1024*2048): half way in log size -> geometric mean of the two rates
    assert npu.gemm_rate((1448, 1448, 1448)) == pytest.approx((1.68e12 * 4.51e12) ** 0.5, rel=1e-3)
    assert npu.gemm_rate((8, 8, 8)) == 0.93e12 and npu.gemm_rate((9000, 9000, 9000)) == 5.38e12   # clamped
    assert npu.gemm_rate(None) == 5.38e12                                       # no shape: the flat rate
    assert p.cpu.gemm_rate((8, 8, 8)) == p.cpu.throughput_flops                 # no curve on this role
    op = OpCost("g", 2.0 * 1024 ** 3, 1.0, gemm=(1024, 1024, 1024))
    assert npu.estimate(op) == pytest.approx(3e-4 + 2.0 * 1024 ** 3 / 1.68e12)
    m4 = get_platform("m4-max").npu                                             # falls above 2048 (SRAM spill)
    assert m4.gemm_rate((4096,) * 3) == pytest.approx(6.68e12) and m4.gemm_rate((2048,) * 3) == pytest.approx(8.87e12)


def test_curve_and_weight_overrides():
    flat = get_platform("m2-max", npu_throughput_flops="gemm_2048")
    assert flat.npu.throughput_curve is None                     # a flat-rate override means that rate everywhere
    assert flat.npu.gemm_rate((1024,) * 3) == 4.51e12
    assert "set aside" in flat.params["npu"]["throughput_curve"]["note"]
    assert get_platform("m2-max", npu_throughput_curve="flat").npu.throughput_curve is None
    sub = get_platform("m2-max", npu_throughput_curve="dispatch_subtracted").npu
    assert sub.gemm_rate((1024,) * 3) == pytest.approx(1.82e12)                # 2*1024**3 / (1.278 ms - 0.1 ms)
    with pytest.raises(NpuMoeError, match="alternatives"):
        get_platform("m2-max", npu_throughput_curve=1e12)
    int8 = get_platform("m2-max", npu_weight_bytes="int8")
    assert (int8.npu.weight_bytes, get_platform("m2-max").npu.weight_bytes) == (1, 2)
    with pytest.raises(NpuMoeError, match="whole number"):
        get_platform("m2-max", npu_weight_bytes=1.5)
    with pytest.raises(NpuMoeError, match="strictly increasing"):
        DeviceModel("npu", "modeled", 1e12, 1e10, 1.0, 0.0, throughput_curve=((1024, 1e12), (512, 2e12)))


def test_bandwidth_per_chip_and_role():
    m2max, ultra, m4 = (get_platform(n) for n in ("m2-max", "m2-ultra", "m4-max"))
    assert (m2max.cpu.bandwidth_bytes_s, ultra.cpu.bandwidth_bytes_s) == (4.0e10, 8.0e10)   # two dies
    assert ultra.params["cpu"]["bandwidth_bytes_s"]["alternatives"]["chip_spec"] == 8.0e11
    assert m2max.params["cpu"]["bandwidth_bytes_s"]["alternatives"]["chip_spec"] == 4.0e11
    assert (m2max.npu.bandwidth_bytes_s, ultra.npu.bandwidth_bytes_s) == (6.201e10, 6.168e10)  # the ANE's own
    assert m4.cpu.bandwidth_bytes_s == 1.2e11


def test_unknown_platform_lists_valid_ones():
    with pytest.raises(NpuMoeError) as err:
        get_platform("m9-giga")
    for name in list_platforms():
        assert name in str(err.value)


def test_overrides_change_values_and_hash():
    base = get_platform("m2-max")
    p = get_platform("m2-max", npu_dispatch_s=4e-4)
    assert p.npu.dispatch_s == 4e-4 and p.hash != base.hash
    assert p.params["npu"]["dispatch_s"]["source"].startswith("override")
    assert get_platform("m2-max").hash == base.hash  # overrides do not leak into the cached file
    alt = get_platform("m2-max", npu_throughput_flops="fused_block")
    assert alt.npu.throughput_flops == 1.197e13 and alt.hash not in (base.hash, p.hash)
    with pytest.raises(NpuMoeError, match="valid knobs: .*npu_dispatch_s"):
        get_platform("m2-max", npu_dispach_s=1e-4)
    with pytest.raises(NpuMoeError, match="fused_block"):
        get_platform("m2-max", npu_throughput_flops="fastest")
    with pytest.raises(NpuMoeError, match="number >= 0"):
        get_platform("m2-max", npu_sync_s=-1.0)


def test_format_platforms_table():
    text = format_platforms()
    for name in list_platforms():
        assert name in text
    assert "measured" in text and "modeled" in text and "anemll-bench" in text


# --- host profile --------------------------------------------------------------------------------------------------
def test_host_profile_defaults_then_measured(tmp_path, monkeypatch):
    monkeypatch.setenv("NPUMOE_CACHE_DIR", str(tmp_path))
    p = get_platform("cpu")
    assert "NOT measured" in p.params["cpu"]["throughput_flops"]["source"]
    assert p.cpu.throughput_flops == hostprofile.DEFAULTS["gemm_bf16_flops"]
    prof = hostprofile.measure_host_profile(seconds=0.25, gemm_n=128, mem_mb=8)
    assert hostprofile.profile_path().is_file() and prof["measured"]
    for key in ("gemm_fp32_flops", "gemm_bf16_flops", "mem_read_bytes_s", "op_overhead_s", "module_call_s"):
        assert prof[key] > 0
    assert prof["threads"] == 1
    q = get_platform("cpu")
    assert q.cpu.throughput_flops == pytest.approx(prof["gemm_bf16_flops"])
    assert q.npu.dispatch_s == pytest.approx(prof["module_call_s"])
    assert "measured on this host" in q.params["cpu"]["bandwidth_bytes_s"]["source"]
    assert q.params["cpu"]["throughput_flops"]["alternatives"]["fp32"] == pytest.approx(prof["gemm_fp32_flops"])
    assert q.hash != p.hash


# --- measurement -----------------------------------------------------------------------------------------------------
def test_measure_wall_and_cpu_time():
    def spin(cpu_seconds):  # burn a fixed amount of CPU time, however loaded the shared machine is
        end = time.process_time() + cpu_seconds
        while time.process_time() < end:
            pass
        return "done"
    result, m = measure(spin, 0.03)
    assert result == "done" and m.timing_source == "measured"
    assert 0.03 <= m.cpu_s < 0.03 + 0.05 and m.wall_s >= 0.9 * m.cpu_s  # one thread: wall >= its CPU time
    _, idle = measure(time.sleep, 0.05)
    assert idle.wall_s >= 0.05 and idle.cpu_s < 0.02  # sleeping uses no CPU


def test_rapl_absent_gives_no_energy(tmp_path, monkeypatch):
    monkeypatch.setattr(measured, "RAPL_GLOB", str(tmp_path / "intel-rapl*"))
    assert not measured.rapl_available()
    _, m = measure(lambda: None)
    assert m.energy_j is None


def test_rapl_read_and_wraparound(tmp_path, monkeypatch):
    dom = tmp_path / "intel-rapl:0"
    sub = tmp_path / "intel-rapl:0:0"  # subzone: must not be double counted
    for d in (dom, sub):
        d.mkdir()
        (d / "energy_uj").write_text("999000000\n")
        (d / "max_energy_range_uj").write_text("1000000000\n")
    monkeypatch.setattr(measured, "RAPL_GLOB", str(tmp_path / "intel-rapl*"))
    assert measured.rapl_domains() == [dom]
    before = measured.read_rapl_uj()
    (dom / "energy_uj").write_text("2000000\n")  # wrapped: 1 J to the wrap + 2 J after
    assert measured.rapl_delta_j(before, measured.read_rapl_uj()) == pytest.approx(3.0)
