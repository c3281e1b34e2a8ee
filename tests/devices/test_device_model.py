"""The graph-level NPU cost structure, the vectorised pricer and platform specs."""
import math

import numpy as np
import pytest

from npumoe_lab.devices.cost import OpCost, attention_cost, dense_cost, expert_ffn_cost, memory_cost
from npumoe_lab.devices.measurements import load_measurements
from npumoe_lab.devices.platform import get_platform, parse_platform_spec, resolve_platform
from npumoe_lab.devices.price import op_columns, platform_params, price, with_draws
from npumoe_lab.devices.workload import row_op
from npumoe_lab.errors import NpuMoeError
from npumoe_lab.utils import REPO_ROOT

GRAPH = "m2-max[npu_graph_model=graph]"


def test_graph_time_by_hand():
    """One op priced by the formula of graph_cost.py, written out here with the platform's numbers."""
    p = get_platform("m4-max[npu_graph_model=graph]")
    d = p.npu
    op = OpCost("x", flops=3e9, bytes=5e6, calls=2, gemm=(64, 2048, 4096), rows=64, attn_flops=1e9, lut_params=4e6)
    x4 = (2 * 2048 * 4096 / d.sram_bytes) ** 4
    slow = 1 + (1 / d.spill_factor - 1) * x4 / (1 + x4)
    # row tile (a GEMM of 64 rows takes max(64, rows_half) rows' time per weight, spilled) + 2 calls' pipeline fill
    compute = (2e9 * max(1, d.rows_half / 64) * slow + 2 * d.work_half_flops) / d.graph_peak_flops \
        + 1e9 / d.attention_flops
    expect = 2 * (d.dispatch_s + d.sync_s) + max(compute, 5e6 / d.bandwidth_bytes_s, 4e6 / d.decompress_params_s)
    assert d.estimate(op) == pytest.approx(expect, rel=1e-12)
    # the roofline structure ignores the graph fields: same op, old formula
    r = get_platform("m4-max").npu
    rate = r.gemm_rate(op.gemm)
    assert r.estimate(op) == pytest.approx(2 * r.call_overhead_s + max(3e9 / rate, 5e6 / r.bandwidth_bytes_s))


def test_fused_graph_beats_single_op_rate():
    """The point of the structure: a group of small expert GEMMs in one call is not charged the small-op floor."""
    old, new = get_platform("m2-max").npu, get_platform(GRAPH).npu
    group = expert_ffn_cost(32, 64, 2048, 768)          # Qwen3-30B-A3B-like expert group at capacity 64
    assert old.gemm_rate(group.gemm) == pytest.approx(9.3e11)   # clamped at the curve's smallest point
    assert group.flops / (new.estimate(group) - new.call_overhead_s) > 2 * old.gemm_rate(group.gemm)


def test_one_row_graph_pays_per_weight_not_per_call():
    """The row-tile floor: a 1-row graph of k GEMVs' weights costs k GEMVs' compute in ONE call (only the call cost
    and the pipeline fill are per call), so a decoder step of 1 GB of weights cannot amortise like a compute-bound
    graph (the structure before 2026-12-02 priced the M4 Max toy decoder 4.5x too fast for that reason)."""
    d = get_platform("m4-max[npu_graph_model=graph; npu_bandwidth_bytes_s=1e15; npu_rows_half=64; "
                     "npu_sram_bytes=1e12]").npu      # compute-bound, no spill: only the compute term shows
    gemv = OpCost("gemv", 2.0 * 4096 * 4096, 2.0 * 4096 * 4096, gemm=(1, 4096, 4096), rows=1)
    k = 32
    step = OpCost("step", k * gemv.flops, k * gemv.bytes, gemm=(1, 4096, 4096), rows=1)
    fill = d.work_half_flops / d.graph_peak_flops
    one = d.estimate(gemv) - d.call_overhead_s - fill
    assert one == pytest.approx(gemv.flops * 64 / d.graph_peak_flops)          # 64 rows' time per weight
    assert d.estimate(step) - d.call_overhead_s - fill == pytest.approx(k * one)
    many = OpCost("rows", 64 * gemv.flops, gemv.bytes, gemm=(64, 4096, 4096), rows=64)
    assert d.estimate(many) == pytest.approx(d.estimate(gemv))                 # 64 rows fill the tile for free


def _ops_of_every_kind():
    df = load_measurements(REPO_ROOT / "data/measurements")
    ops = [(r.device, row_op(r), r.path) for r in df.itertuples()]
    ops += [("npu", expert_ffn_cost(8, 32, 1024, 512, weight_bytes=0.5), "coreml"),
            ("npu", attention_cost(128, 3000, 2048, 32, 4, 64), "coreml"),
            ("cpu", dense_cost(7, 2048, 128), "coreml"), ("npu", memory_cost(1e6, "pack", calls=3), "coreml"),
            ("npu", OpCost.combine("grp", dense_cost(4, 64, 64), attention_cost(4, 0, 64, 4, 4, 16)), "direct"),
            ("npu", OpCost("wide", 2e12, 3e9, calls=5, gemm=(3, 8192, 8192), rows=3, weight_bytes=2e9), "coreml"),
            ("npu", OpCost("tall", 2e12, 3e9, calls=2, gemm=(4096, 8192, 8192), rows=4096), "direct")]
    return ops


@pytest.mark.parametrize("spec", ["m2-max", GRAPH, "m4-max[npu_graph_model=graph]", "m2-ultra", "m3-max",
                                  "m2-ultra[npu_graph_model=graph; npu_clusters=two_clusters]"])
def test_vectorised_price_equals_estimate(spec):
    p = resolve_platform(spec)
    ops = _ops_of_every_kind()
    cols = op_columns([(r, o) for r, o, _ in ops], paths=[path for *_, path in ops])
    got = price(platform_params(p), cols)
    want = [p.device(r).for_path(path).estimate(o) for r, o, path in ops]
    assert got.shape == (1, len(ops))
    np.testing.assert_allclose(got[0], want, rtol=1e-12)


def test_price_over_draws_equals_overridden_platforms():
    """Each draw (a row of the parameter matrix) prices like the platform loaded with those values."""
    base = get_platform(GRAPH)
    ops = _ops_of_every_kind()
    cols = op_columns([(r, o) for r, o, _ in ops], paths=[path for *_, path in ops])
    draws = np.array([[4e12, 1e8, 5e10], [9e12, 3e9, 7e10], [2e13, 1e6, 1.2e11]])
    names = ["npu_graph_peak_flops", "npu_work_half_flops", "npu_bandwidth_bytes_s"]
    got = price(with_draws(platform_params(base), names, draws), cols)
    assert got.shape == (3, len(ops))
    for i, d in enumerate(draws):
        p = get_platform(GRAPH, **dict(zip(names, d)))
        np.testing.assert_allclose(got[i], [p.device(r).for_path(path).estimate(o) for r, o, path in ops],
                                   rtol=1e-12)


def test_sourced_platforms_unchanged_unless_selected():
    """The graph structure is a named alternative: the sourced default prices as the per-op roofline did."""
    p = get_platform("m2-max")
    assert not p.npu.graph_model and get_platform(GRAPH).npu.graph_model
    op = expert_ffn_cost(4, 16, 2048, 768)
    n = p.npu
    assert n.estimate(op) == n.call_overhead_s + max(op.flops / n.gemm_rate(op.gemm), op.bytes / n.bandwidth_bytes_s)


def test_ultra_clusters_option():
    one = get_platform("m2-ultra[npu_graph_model=graph]").npu
    two = get_platform("m2-ultra[npu_graph_model=graph; npu_clusters=two_clusters]").npu
    assert (one.clusters, two.clusters) == (1, 2)
    big = expert_ffn_cost(64, 512, 2048, 768)
    assert two.estimate(big) - two.call_overhead_s == pytest.approx((one.estimate(big) - one.call_overhead_s) / 2)


def test_lut_formats_hit_the_decompression_floor():
    d = get_platform("m2-max[npu_graph_model=graph; npu_decompress_params_s=1e10]").npu
    fp16 = OpCost("w", 2e6, 2e9, weight_bytes=2e9, rows=1, gemm=(1, 1000, 1000))
    lut4 = OpCost("w", 2e6, 5e8, weight_bytes=5e8, rows=1, gemm=(1, 1000, 1000), lut_params=1e9)
    assert d.estimate(lut4) == pytest.approx(d.call_overhead_s + 1e9 / 1e10)        # floor, not 5e8 / bandwidth
    assert d.estimate(fp16) == pytest.approx(d.call_overhead_s + 2e9 / d.bandwidth_bytes_s)


def test_platform_specs(tmp_path):
    assert parse_platform_spec("m2-max") == ("m2-max", {})
    assert parse_platform_spec("m2-max[npu_dispatch_s=4e-4, npu_graph_model=graph]") == \
        ("m2-max", {"npu_dispatch_s": 4e-4, "npu_graph_model": "graph"})
    assert get_platform("m2-max[npu_dispatch_s=4e-4]").npu.dispatch_s == 4e-4
    path = tmp_path / "mine.yaml"
    text = open(REPO_ROOT / "npumoe_lab/devices/platforms/m2-max.yaml").read().replace("name: m2-max", "name: mine", 1)
    path.write_text(text)
    mine = get_platform(f"{path}[npu_sync_s=0]")
    assert (mine.name, mine.chip, mine.npu.sync_s) == ("mine", "m2-max", 0.0)
    for bad, msg in (("m2-max[npu_dispatch_s=4e-4", "does not parse"), ("m2-max[npu_dispatch_s]", "does not parse"),
                     ("[npu_sync_s=0]", "names no platform"), ("m2-max[npu_nope=1]", "unknown platform override"),
                     (str(tmp_path / "none.yaml"), "does not exist"), ("m9-max", "unknown platform")):
        with pytest.raises(NpuMoeError, match=msg):
            get_platform(bad)
    (tmp_path / "broken.yaml").write_text("name: [unclosed\n")
    with pytest.raises(NpuMoeError, match="not valid YAML"):
        get_platform(str(tmp_path / "broken.yaml"))


def test_opcost_graph_fields_validated():
    with pytest.raises(NpuMoeError, match="attn_flops"):
        OpCost("x", 1.0, 1.0, attn_flops=2.0)
    with pytest.raises(NpuMoeError, match="rows"):
        OpCost("x", 1.0, 1.0, rows=0)
    a = attention_cost(8, 56, 64, 4, 2, 16)
    assert a.attn_flops == 2 * 2.0 * 4 * 8 * 64 * 16 and a.rows == 8 and math.isclose(
        a.weight_bytes, (64 * 64 + 2 * 64 * 32 + 64 * 64) * 2)


def test_vectorised_power_equals_call_power():
    """Power rows: floor + (active - floor) x achieved/peak rate, the same in NumPy as in graph_cost.call_power."""
    from npumoe_lab.devices.graph_cost import call_power
    from npumoe_lab.devices.price import power
    for spec in (GRAPH, "m2-max"):
        p = resolve_platform(spec)
        ops = [("npu", OpCost(f"g{n}", 2.0 * n ** 3, 6.0 * n * n, gemm=(n, n, n), weight_bytes=2.0 * n * n))
               for n in (256, 1024, 4096)] + [("cpu", dense_cost(64, 512, 512))]
        cols = op_columns(ops)
        params = platform_params(p)
        t = price(params, cols)
        got = power(params, cols, t)[0]
        want = [call_power(p.device(r), o, p.device(r).estimate(o)) if r == "npu" else p.cpu.active_power_w
                for r, o in ops]
        np.testing.assert_allclose(got, want, rtol=1e-12)
        d = p.npu
        assert d.floor_power_w < want[0] < want[2] <= d.active_power_w     # power rises with the achieved rate
