"""Static capacity tiers: a hand-worked example, the optimal rule against brute force, and the acceptance test
(tiers pad less than a uniform capacity at the same drop rate on skewed routing)."""
import itertools
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from npumoe_lab.errors import NpuMoeError
from npumoe_lab.planning.tiers import align_up, assign_tiers, expected_drop_rate, expected_padding, expected_kept_tokens

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "skewed_counts.parquet"
SKEW_CHUNK, SKEW_TOP_K, SKEW_E, SKEW_CHUNKS = 512, 2, 64, 64


def make_skewed_counts(seed: int = 0) -> np.ndarray:
    """[E=64, 64 chunks] of top-2 routing over 512-token chunks: Zipf(1.1) expert popularity (shuffled ids),
    per-chunk log-normal jitter of the probabilities, multinomial counts."""
    rng = np.random.default_rng(seed)
    base = 1.0 / np.arange(1, SKEW_E + 1) ** 1.1
    base = base[rng.permutation(SKEW_E)]
    out = np.zeros((SKEW_E, SKEW_CHUNKS), dtype=np.int64)
    for c in range(SKEW_CHUNKS):
        p = base * np.exp(0.3 * rng.standard_normal(SKEW_E))
        out[:, c] = rng.multinomial(SKEW_CHUNK * SKEW_TOP_K, p / p.sum())
    return out


def skewed_counts() -> np.ndarray:
    df = pd.read_parquet(FIXTURE)
    return df.pivot(index="expert", columns="chunk_id", values="count").to_numpy()


def test_fixture_is_reproducible():
    if not FIXTURE.exists():  # (re)create: the generator above is the fixture's definition
        c = make_skewed_counts()
        e, k = np.meshgrid(np.arange(SKEW_E), np.arange(SKEW_CHUNKS), indexing="ij")
        pd.DataFrame({"expert": e.ravel(), "chunk_id": k.ravel(), "count": c.ravel()}).to_parquet(FIXTURE)
    np.testing.assert_array_equal(skewed_counts(), make_skewed_counts())


# Worked example: 8 experts, top-2, chunk 64, 11 chunks. With 11 chunks numpy's linear 90th percentile is exactly
# the 2nd largest count, so the needs are the values placed at chunk 1 below.
NEEDS = [40, 30, 17, 12, 8, 6, 3, 1]


def worked_counts():
    c = np.zeros((8, 11), dtype=np.int64)
    for e, n in enumerate(NEEDS):
        c[e, 0] = min(64, n + 5)   # the largest (ignored by p90)
        c[e, 1] = n                # the 2nd largest = p90
        c[e, 2:] = n // 2
    return c


def test_worked_example_paper_rule():
    # buckets by popularity: top quartile {e0,e1} | {e2,e3,e4} | {e5,e6,e7}
    # tier capacities = bucket max need aligned to 8, >= 8: align(40)=40, align(17)=24, align(6)=8
    # each expert takes the SMALLEST covering tier: e1 (30) -> 40, e4 (8) -> 8 (not its bucket's 24)
    a = assign_tiers(worked_counts(), chunk=64, top_k=2, n_experts=8, tiers=3, percentile=90, align=8)
    assert a.need.tolist() == NEEDS
    assert a.tier_capacities == (40, 24, 8)
    assert a.capacity.tolist() == [40, 40, 24, 24, 8, 8, 8, 8]
    assert a.tier.tolist() == [0, 0, 1, 1, 2, 2, 2, 2]


def test_worked_example_multipliers_and_uniform():
    # base = coldest bucket's capacity 8; (4, 2, 1) -> 32, 16, 8; e0 (40) is over the top tier and gets 32
    a = assign_tiers(worked_counts(), 64, 2, 8, multipliers=(4, 2, 1))
    assert a.tier_capacities == (32, 16, 8)
    assert a.capacity.tolist() == [32, 32, 32, 16, 8, 8, 8, 8]
    # prototype rule: 64 * 2 / 8 + 16 = 32
    u = assign_tiers(worked_counts(), 64, 2, 8, rule="uniform")
    assert u.capacity.tolist() == [32] * 8 and u.tier_capacities == (32,)
    # one tier = the aligned largest need for everyone
    one = assign_tiers(worked_counts(), 64, 2, 8, tiers=1)
    assert one.capacity.tolist() == [40] * 8
    # naive: largest observed count per expert, aligned: 45, 35, 22, 17, 13, 11, 8, 6 -> 48 40 24 24 16 16 8 8
    m = assign_tiers(worked_counts(), 64, 2, 8, rule="max_observed")
    assert m.capacity.tolist() == [48, 40, 24, 24, 16, 16, 8, 8] and m.tier_capacities == (48, 40, 24, 16, 8)


def test_expected_padding_and_drop_by_hand():
    counts = np.array([[10, 20], [3, 0]])
    cap = [16, 8]
    # computed 2 chunks x 24 slots = 48; kept 10 + 16 + 3 + 0 = 29 -> padding 19/48; dropped 4 of 33 routed
    assert expected_padding(cap, counts) == pytest.approx(19 / 48)
    assert expected_drop_rate(cap, counts) == pytest.approx(4 / 33)
    assert expected_kept_tokens(cap, counts).tolist() == [13.0, 1.5]


def brute_force_total(needs, n_tiers, align=8, min_capacity=8):
    """Least sum of capacities over every choice of <= n_tiers capacities from the aligned needs."""
    fitted = sorted({max(align_up(n, align), min_capacity) for n in needs})
    best = None
    for r in range(1, n_tiers + 1):
        for caps in itertools.combinations(fitted, r):
            if caps[-1] < max(max(align_up(n, align), min_capacity) for n in needs):
                continue
            total = sum(min(c for c in caps if c >= n) for n in needs)
            best = total if best is None else min(best, total)
    return best


@pytest.mark.parametrize("seed", range(5))
def test_optimal_rule_matches_brute_force(seed):
    rng = np.random.default_rng(seed)
    counts = rng.integers(0, 60, size=(10, 11))
    for n_tiers in (1, 2, 3):
        a = assign_tiers(counts, 64, 2, 10, tiers=n_tiers, rule="optimal")
        assert int(a.capacity.sum()) == brute_force_total(a.need, n_tiers)
        assert (a.capacity >= a.need).all()


@pytest.mark.parametrize("rule", ["tiered", "optimal"])
def test_tiers_pad_less_than_uniform_at_same_drop_rate(rule):
    counts = skewed_counts()
    tiered = assign_tiers(counts, SKEW_CHUNK, SKEW_TOP_K, SKEW_E, tiers=3, percentile=90, align=8, rule=rule)
    t_drop, t_pad = expected_drop_rate(tiered, counts), expected_padding(tiered, counts)
    # the smallest uniform capacity whose drop rate is no worse than the tiered plan's
    uni_cap = next(c for c in range(1, SKEW_CHUNK + 1) if expected_drop_rate([c] * SKEW_E, counts) <= t_drop)
    u_drop, u_pad = expected_drop_rate([uni_cap] * SKEW_E, counts), expected_padding([uni_cap] * SKEW_E, counts)
    print(f"\n3-tier {rule} p90: capacities {tiered.tier_capacities}, experts per tier "
          f"{np.bincount(tiered.tier).tolist()}, drop {t_drop:.2%}, padding {t_pad:.2%}")
    print(f"uniform {uni_cap} (same drop rate): drop {u_drop:.2%}, padding {u_pad:.2%}")
    assert u_drop <= t_drop
    assert t_pad < u_pad - 0.1


def test_bad_input():
    c = worked_counts()
    with pytest.raises(NpuMoeError, match="min_capacity"):
        assign_tiers(c, 64, 2, 8, min_capacity=0)
    with pytest.raises(NpuMoeError, match="capacity 0"):
        assign_tiers(c, 64, 2, 8, multipliers=(4, 0, 1))
    with pytest.raises(NpuMoeError, match="align"):
        assign_tiers(c, 64, 2, 8, align=12)
    with pytest.raises(NpuMoeError, match=r"\[0, chunk=16\]"):
        assign_tiers(c, 16, 2, 8)
    with pytest.raises(NpuMoeError, match="n_experts=9"):
        assign_tiers(c, 64, 2, 9)
    with pytest.raises(NpuMoeError, match="capacity rule"):
        assign_tiers(c, 64, 2, 8, rule="dynamic")
