"""Groups of same-tier experts: hand-worked layouts, the caps on group size, and invariants."""
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from npumoe_lab.errors import NpuMoeError
from npumoe_lab.planning.grouping import group_size_limit, make_groups, make_groups_with_notes

TIER = [0, 0, 1, 1, 2, 2, 2, 2]
CAP = [40, 40, 24, 24, 8, 8, 8, 8]
LOAD = [30.0, 25.0, 12.0, 9.0, 5.0, 4.0, 2.0, 1.0]
H, I = 16, 32          # one expert = 3 * 16 * 32 * 2 bytes = 3072


def layout(groups):
    return [(g.tier, g.capacity, g.experts) for g in groups]


def test_popularity_groups_by_hand():
    gs = make_groups(TIER, CAP, LOAD, 2, hidden=H, intermediate=I)
    assert layout(gs) == [(0, 40, (0, 1)), (1, 24, (2, 3)), (2, 8, (4, 5)), (2, 8, (6, 7))]
    assert [g.id for g in gs] == [0, 1, 2, 3]
    assert [g.expected_tokens for g in gs] == [55.0, 21.0, 9.0, 3.0]
    assert [g.weight_bytes for g in gs] == [6144] * 4


def test_group_size_one_is_one_graph_per_expert():
    gs = make_groups(TIER, CAP, LOAD, 1, hidden=H, intermediate=I)
    assert [g.experts for g in gs] == [(e,) for e in range(8)]


def test_cap_to_tier_and_strict():
    gs, notes = make_groups_with_notes(TIER, CAP, LOAD, 3, hidden=H, intermediate=I)
    assert layout(gs) == [(0, 40, (0, 1)), (1, 24, (2, 3)), (2, 8, (4, 5, 6)), (2, 8, (7,))]
    assert notes == ["tier 0: group size 3 capped to the tier's 2 experts",
                     "tier 1: group size 3 capped to the tier's 2 experts"]
    with pytest.raises(NpuMoeError, match="group_size 3 is larger than the 2 experts"):
        make_groups(TIER, CAP, LOAD, 3, hidden=H, intermediate=I, strict=True)


def test_device_limits_cap_group_size():
    # byte budget 2 experts; packed axis 48: tier 0 (C=40) -> 1, tier 2 (C=8) -> 6
    assert group_size_limit(8, 8, 8, H, I, graph_limit_bytes=6144) == (
        2, ["group size 8 capped to 2 by the graph budget"])
    assert group_size_limit(8, 8, 40, H, I, max_dim=48)[0] == 1
    assert group_size_limit(8, 8, 8, H, I, max_dim=48)[0] == 6
    assert group_size_limit(8, 8, 8, H, 40000)[0] == 1          # 2 * 40000 > 65536
    with pytest.raises(NpuMoeError, match="one expert alone"):
        group_size_limit(2, 8, 8, H, I, graph_limit_bytes=3000)
    with pytest.raises(NpuMoeError, match="max dimension 24"):
        make_groups(TIER, CAP, LOAD, 2, hidden=H, intermediate=I, max_dim=24)
    with pytest.raises(NpuMoeError, match="group_size must be an int >= 1"):
        make_groups(TIER, CAP, LOAD, 0, hidden=H, intermediate=I)


def test_coactivation_order_by_hand():
    co = np.zeros((8, 8))
    co[4, 7] = co[7, 4] = 50      # 4 and 7 fire together; popularity would pair 4 with 5
    gs = make_groups(TIER, CAP, LOAD, 2, "coactivation", co, hidden=H, intermediate=I)
    assert [g.experts for g in gs if g.tier == 2] == [(4, 7), (5, 6)]
    with pytest.raises(NpuMoeError, match="needs the coactivation matrix"):
        make_groups(TIER, CAP, LOAD, 2, "coactivation", hidden=H, intermediate=I)
    with pytest.raises(NpuMoeError, match="mixes capacities"):
        make_groups(TIER, [40, 32] + CAP[2:], LOAD, 2, hidden=H, intermediate=I)


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 40), st.integers(1, 4), st.integers(1, 9), st.booleans(), st.integers(0, 999))
def test_partition_invariants(E, n_tiers, G, coact, seed):
    rng = np.random.default_rng(seed)
    tier = rng.integers(0, n_tiers, E)
    cap = (n_tiers - tier) * 8
    load = rng.random(E) * 50
    co = rng.integers(0, 9, (E, E)) if coact else None
    gs = make_groups(tier, cap, load, G, "coactivation" if coact else "popularity", co, hidden=8, intermediate=8)
    assert sorted(e for g in gs for e in g.experts) == list(range(E))
    for g in gs:
        assert 1 <= g.size <= G and all(tier[e] == g.tier and cap[e] == g.capacity for e in g.experts)
        assert g.expected_tokens == pytest.approx(load[list(g.experts)].sum())
