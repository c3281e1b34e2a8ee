"""What planning keeps between plans gives what it would compute afresh: GEMM rate tables against the device's own
gemm_rate, layouts kept by content against a fresh build, and a kept check that still stops a bad layer."""
import numpy as np
import pytest

from npumoe_lab.devices import as_platform
from npumoe_lab.errors import NpuMoeError
from npumoe_lab.planning import layout as layout_mod
from npumoe_lab.planning.layout import LayerLayout
from npumoe_lab.planning.makespan import gemm_rates
from npumoe_lab.planning.plan import _check_layer


@pytest.mark.parametrize("name", ["m2-max", "m4-max"])
def test_gemm_rate_table_equals_the_device(name):
    cpu = as_platform(name).cpu
    rng = np.random.default_rng(0)
    for top in (5, 300, 9000):                  # the table grows past what it held
        m = rng.integers(1, top + 1, size=(7, 11)).astype(np.float64)
        want = np.array([[cpu.gemm_rate((int(x), 768, 2048)) for x in row] for row in m])
        np.testing.assert_array_equal(gemm_rates(cpu, m, 768, 2048), want)
    with pytest.raises(NpuMoeError):
        gemm_rates(cpu, np.array([1.5]), 768, 2048)


def _layer(resident, tier=0, capacity=4):
    return {"layer": 3, "n_experts": 4, "top_k": 2, "hidden": 8, "intermediate": 16,
            "capacity": [capacity] * 4, "tier": [tier] * 4, "tier_capacities": [capacity],
            "groups": [{"id": 0, "experts": [0, 1], "capacity": capacity, "resident": resident[0], "tier": tier},
                       {"id": 1, "experts": [3, 2], "capacity": capacity, "resident": resident[1], "tier": tier}]}


def test_kept_layouts_equal_fresh_ones():
    layout_mod._LAYOUTS.clear()
    layout_mod._GROUPS.clear()
    for flags in [(True, False), (False, False), (True, False), (True, True)]:
        lp = _layer(flags)
        got = LayerLayout.from_plan_layer(lp)
        assert got == LayerLayout._from_plan_layer(lp)
        assert [g.device for g in got.groups] == ["npu" if f else "cpu" for f in flags]
    assert LayerLayout.from_plan_layer(_layer((True, False))) is LayerLayout.from_plan_layer(_layer((True, False)))
    # 1.0 == 1 hashes alike: a float tier is not handed the int tier of a kept layout
    LayerLayout.from_plan_layer(_layer((True, True), tier=1))
    again = LayerLayout.from_plan_layer(_layer((True, True), tier=1.0))
    assert all(type(g.tier) is float for g in again.groups)


def test_a_kept_check_still_stops_a_bad_layer():
    _check_layer(_layer((True, False)))
    bad = _layer((True, False))
    bad["capacity"][2] = 5                       # differs from its tier's and its group's capacity
    with pytest.raises(NpuMoeError, match="capacity"):
        _check_layer(bad)
    split = _layer((True, False))
    split["groups"][1]["experts"] = [3, 1]       # expert 1 twice, expert 2 in none
    with pytest.raises(NpuMoeError, match="exactly once"):
        _check_layer(split)
    with pytest.raises(NpuMoeError, match="capacity"):       # a layout check after a kept content check
        lp = _layer((True, False))
        _check_layer(lp)
        lp["groups"][0]["capacity"] = 0
        lp["groups"][1]["capacity"] = 0
        lp["capacity"], lp["tier_capacities"] = [0] * 4, [0]
        _check_layer(lp)
