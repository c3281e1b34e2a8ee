"""Residency: threshold and cost rules and the memory budget, by hand and against a simple independent cost model."""
from types import SimpleNamespace

import pytest

from npumoe_lab.errors import NpuMoeError
from npumoe_lab.grouping import Group
from npumoe_lab.residency import assign_residency

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
    with pytest.raises(NpuMoeError, match="threshold, cost, all"):
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
    assert assign_residency(gs, "cost", platform=plat, spec=spec) == [True, False]
