"""Residency: threshold and cost rules and the memory budget, by hand and against a simple independent cost model."""
import math
from types import SimpleNamespace

import pytest

from npumoe_lab.errors import NpuMoeError
from npumoe_lab.planning.grouping import Group
from npumoe_lab.planning.residency import assign_residency, group_times

H, I = 16, 32
SPEC = SimpleNamespace(hidden=H, intermediate=I)


def groups(*loads, size=2, cap=256, nbytes=100):
    return [Group(i, 0, cap, tuple(range(2 * i, 2 * i + size)), float(x), nbytes) for i, x in enumerate(loads)]


def test_threshold():
    gs = groups(55.0, 21.0, 9.0, 0.0)
    assert assign_residency(gs, "threshold", hot_threshold=21) == [True, True, False, False]
    assert assign_residency(gs, "threshold", hot_threshold=0) == [True] * 4
    assert assign_residency(gs, "all") == [True] * 4
    with pytest.raises(NpuMoeError, match="needs hot_threshold"):
        assign_residency(gs, "threshold")
    with pytest.raises(NpuMoeError, match="threshold, cost, all, makespan"):
        assign_residency(gs, "hot")


def test_memory_budget_greedy_by_tokens_per_byte():
    gs = [Group(0, 0, 8, (0,), 40.0, 400), Group(1, 0, 8, (1,), 30.0, 100), Group(2, 0, 8, (2,), 10.0, 200),
          Group(3, 0, 8, (3,), 5.0, 50)]
    # tokens/byte: g1 .3, g0 .1, g3 .1, g2 .05 (g0 before g3 by id). Budget 500: g1 (100) + g0 (400) = 500 full,
    # g3 and g2 no longer fit
    assert assign_residency(gs, "all", npu_memory_budget_bytes=500) == [True, True, False, False]
    # budget 350: g1 100; g0 400 does not fit, skipped; g3 50 -> 150; g2 200 -> 350
    assert assign_residency(gs, "all", npu_memory_budget_bytes=350) == [False, True, True, True]


class Linear:
    """seconds = calls * overhead + flops / rate (an independent, simpler cost model than the platforms')."""
    def __init__(self, overhead, rate):
        self.overhead, self.rate = overhead, rate

    def estimate(self, op):
        return op.calls * self.overhead + op.flops / self.rate


def test_cost_mode_by_hand():
    plat = SimpleNamespace(npu=Linear(1e-3, 1e12), cpu=Linear(0.0, 1e9))
    gs = groups(100.0, 400.0, 0.0)
    # npu per call: 1e-3 + 6*2*256*16*32 / 1e12 = 1.0016e-3 s for every group
    # cpu: g0 2 experts x 50 rows: 6*2*50*16*32 / 1e9 = 3.07e-4 s < npu -> CPU
    #      g1 2 x 200 rows: 1.229e-3 s > npu -> NPU;  g2 expects nothing -> CPU
    assert assign_residency(gs, "cost", platform=plat, spec=SPEC) == [False, True, False]
    with pytest.raises(NpuMoeError, match="needs a platform"):
        assign_residency(gs, "cost")


def test_cost_mode_with_a_modeled_platform():
    from npumoe_lab.devices.platform import get_platform
    plat = get_platform("m2-max")
    spec = SimpleNamespace(hidden=2048, intermediate=768)
    gs = [Group(0, 0, 256, tuple(range(8)), 1500.0, 8 * 3 * 2048 * 768 * 2),
          Group(1, 1, 8, (8,), 0.2, 3 * 2048 * 768 * 2)]
    # group 0: 8 experts x 256 slots, 1500 tokens expected. NPU: GEMM (256, 768, 2048), effective size
    # (256*768*2048)**(1/3) = 738.5, between the 512 (0.93 TF/s) and 1024 (1.68 TF/s) points: log-log rate
    # 0.93e12 * (1.68/0.93)**log2(738.5/512) = 1.271e12 -> 0.3 ms + 6*8*256*2048*768 / 1.271e12 = 15.5 ms
    # (compute-bound: 92.3 MB / 62.01 GB/s = 1.49 ms). CPU: 188 rows per expert, 8 op calls:
    # 8 * 2e-5 + max(6*8*188*2048*768 / 2.28e12, 87.8 MB / 40 GB/s) = 0.16 + 6.23 = 6.39 ms -> the CPU is faster
    rate = 0.93e12 * (1.68 / 0.93) ** math.log2((256 * 768 * 2048) ** (1 / 3) / 512)
    npu_s = 3e-4 + 6 * 8 * 256 * 2048 * 768 / rate
    cpu_s = 8 * 2e-5 + 6 * 8 * 188 * 2048 * 768 / 2.28e12
    assert group_times(gs[0], plat, 2048, 768, load=1500.0) == (pytest.approx(npu_s), pytest.approx(cpu_s))
    assert (round(npu_s * 1e3, 1), round(cpu_s * 1e3, 2)) == (15.5, 6.39)
    assert assign_residency(gs, "cost", platform=plat, spec=spec) == [False, False]
    # at the flat 5.38 TF/s (the curve set aside) the same group takes 0.3 + 3.59 ms on the NPU: resident
    flat = get_platform("m2-max", npu_throughput_curve="flat")
    assert group_times(gs[0], flat, 2048, 768)[0] == pytest.approx(3e-4 + 6 * 8 * 256 * 2048 * 768 / 5.38e12)
    assert assign_residency(gs, "cost", platform=flat, spec=spec) == [True, False]
    # the CPU's load is the routed one when given: 60 tokens make the CPU faster than the flat NPU call too
    assert assign_residency(gs, "cost", platform=flat, spec=spec, loads=[60.0, 0.2]) == [False, False]
    with pytest.raises(NpuMoeError, match="one per group"):
        assign_residency(gs, "cost", platform=flat, spec=spec, loads=[1.0])
