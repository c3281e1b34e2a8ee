"""Static capacity tiers (PAPER.md 3.2): every expert gets a fixed per-chunk token capacity from calibration.

Inputs are one layer's calibrated per-chunk routed counts [E, n_chunks]. An expert's *need* is the chosen
percentile of its per-chunk counts (numpy's linear interpolation, rounded up). Capacity rules (`CAPACITY_RULES`):

- `tiered` (default, the paper's scheme): sort experts by need, hottest first, and cut them into `tiers`
  popularity buckets: the top `top_fraction` (0.25, the paper's "top quartile") is bucket 0, the rest is split
  evenly. A bucket's tier capacity is its largest need, aligned up to `align` and at least `min_capacity`; with
  `multipliers` (e.g. (4, 2, 1), the paper's "top quartile gets 4x base") tier j is `base * multipliers[j]`
  aligned, base = the coldest bucket's capacity. Equal capacities merge, so tier capacities are strictly
  decreasing. Each expert then gets the SMALLEST tier capacity that covers its need (tau(e) = max{j: n_e <= C_j});
  an expert above the largest tier gets the largest (and drops its overflow).
- `optimal`: the same "smallest covering tier", with the <= tiers capacities chosen by dynamic programming to
  minimise the total computed slots sum_e C_tier(e) (least padding for full coverage of every need).
- `uniform`: the authors' prototype rule, one capacity `ceil(chunk * top_k / n_experts) + uniform_slack` aligned.
- `max_observed`: each expert its own capacity = its largest per-chunk count (naive-npu: nothing dropped on the
  calibration set), aligned.
Capacities never exceed the chunk aligned up (one token routes to an expert at most once per chunk).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from npumoe_lab.errors import NpuMoeError
from npumoe_lab.planning.choices import CAPACITY_RULES  # noqa: F401 - named apart: the CLI lists it without numpy

ALIGNMENTS = (1, 8, 16, 32, 64)


def align_up(x: float, align: int) -> int:
    return int(math.ceil(x / align) * align) if x > 0 else 0


@dataclass(frozen=True)
class TierAssignment:
    capacity: np.ndarray            # [E] int: static token slots per chunk
    tier: np.ndarray                # [E] int: index into tier_capacities (0 = largest)
    tier_capacities: tuple          # strictly decreasing
    need: np.ndarray                # [E] float: the calibrated load the rule tried to cover
    rule: str = "tiered"
    knobs: dict = field(default_factory=dict)

    def __post_init__(self):
        cap, tier = np.asarray(self.capacity), np.asarray(self.tier)
        if cap.shape != tier.shape or cap.ndim != 1:
            raise NpuMoeError(f"capacity {cap.shape} and tier {tier.shape} must both be [n_experts]")
        tc = tuple(int(c) for c in self.tier_capacities)
        if any(c < 1 for c in tc) or any(a <= b for a, b in zip(tc, tc[1:])):
            raise NpuMoeError(f"tier capacities must be >= 1 and strictly decreasing, got {tc}")
        if len(cap) and (tier.min() < 0 or tier.max() >= len(tc) or not np.array_equal(cap, np.array(tc)[tier])):
            raise NpuMoeError("every expert's capacity must equal its tier's capacity; rebuild with assign_tiers")

    @property
    def n_experts(self) -> int:
        return len(self.capacity)


def percentile_need(counts: np.ndarray, percentile: float) -> np.ndarray:
    """Per expert: the `percentile` of its per-chunk counts (linear interpolation), rounded up."""
    return np.ceil(np.percentile(counts, percentile, axis=1) - 1e-9)


def _check(counts, chunk, top_k, n_experts, percentile, align, min_capacity) -> np.ndarray:
    c = np.asarray(counts)
    if c.ndim != 2 or c.shape[0] != n_experts or c.shape[1] < 1:
        raise NpuMoeError(f"per_chunk_counts must be [n_experts={n_experts}, n_chunks>=1], got {c.shape}; "
                          "use CalibrationProfile.count_matrix(layer)")
    if (c < 0).any() or (c > chunk).any():
        raise NpuMoeError(f"per-chunk counts must lie in [0, chunk={chunk}] (a token routes to an expert at most "
                          f"once), got range [{c.min()}, {c.max()}]; was the profile made with another chunk?")
    if not 0 < percentile <= 100:
        raise NpuMoeError(f"percentile must be in (0, 100], got {percentile}")
    if align not in ALIGNMENTS:
        raise NpuMoeError(f"align must be one of {ALIGNMENTS}, got {align}")
    if not isinstance(min_capacity, (int, np.integer)) or min_capacity < 1:
        raise NpuMoeError(f"min_capacity must be an int >= 1 (a capacity of 0 would drop every token), "
                          f"got {min_capacity!r}")
    if top_k < 1 or top_k > n_experts:
        raise NpuMoeError(f"top_k must be in [1, n_experts={n_experts}], got {top_k}")
    return c.astype(np.int64)


def _buckets(n: int, tiers: int, top_fraction: float) -> list[int]:
    """Sizes of the popularity buckets, hottest first."""
    if tiers == 1:
        return [n]
    top = min(n - (tiers - 1), max(1, round(top_fraction * n)))
    rest, extra = divmod(n - top, tiers - 1)
    return [top] + [rest + (1 if i < extra else 0) for i in range(tiers - 1)]


def _optimal_capacities(needs_desc: list[int], tiers: int) -> list[int]:
    """Segment the descending needs into <= tiers runs minimising sum(run size * run max)."""
    n = len(needs_desc)
    INF = float("inf")
    best = [[INF] * (n + 1) for _ in range(tiers + 1)]
    back = [[0] * (n + 1) for _ in range(tiers + 1)]
    best[0][0] = 0
    for j in range(1, tiers + 1):
        for i in range(1, n + 1):            # the first i experts use j tiers; the last run starts at s
            for s in range(j - 1, i):
                cost = best[j - 1][s] + needs_desc[s] * (i - s)
                if cost < best[j][i]:
                    best[j][i], back[j][i] = cost, s
    j = min(range(1, tiers + 1), key=lambda t: best[t][n])
    caps, i = [], n
    while j > 0:
        s = back[j][i]
        caps.append(needs_desc[s])
        i, j = s, j - 1
    return caps[::-1]


def assign_tiers(per_chunk_counts, chunk: int, top_k: int, n_experts: int, tiers: int = 3,
                 percentile: float = 90, align: int = 8, min_capacity: int = 8, multipliers=None,
                 rule: str = "tiered", uniform_slack: int = 16, top_fraction: float = 0.25,
                 need: np.ndarray | None = None) -> TierAssignment:
    """Static capacity per expert for one layer (see the module docstring for the rules). `need`: the counts'
    `percentile_need` at this percentile where the caller keeps it (plans over tier counts share one)."""
    counts = _check(per_chunk_counts, chunk, top_k, n_experts, percentile, align, min_capacity)
    if rule not in CAPACITY_RULES:
        raise NpuMoeError(f"unknown capacity rule {rule!r}; use one of: {', '.join(CAPACITY_RULES)}")
    if not isinstance(tiers, (int, np.integer)) or not 1 <= tiers <= n_experts:
        raise NpuMoeError(f"tiers must be an int in [1, n_experts={n_experts}], got {tiers!r}")
    ceiling = align_up(chunk, align)

    def fit(x: float) -> int:  # aligned, >= min_capacity, <= chunk
        return min(ceiling, align_up(max(x, min_capacity), align))

    knobs = dict(rule=rule, tiers=int(tiers), percentile=percentile, align=align, min_capacity=min_capacity,
                 multipliers=None if multipliers is None else list(multipliers), uniform_slack=uniform_slack,
                 top_fraction=top_fraction)
    if rule == "uniform":
        need = np.full(n_experts, math.ceil(chunk * top_k / n_experts) + uniform_slack, dtype=float)
        c = fit(need[0])
        return TierAssignment(np.full(n_experts, c), np.zeros(n_experts, dtype=np.int64), (c,), need, rule, knobs)
    if rule == "max_observed":
        need = counts.max(axis=1).astype(float)
        cap = np.array([fit(x) for x in need], dtype=np.int64)
        tc = tuple(sorted(set(cap.tolist()), reverse=True))
        tier = np.array([tc.index(c) for c in cap], dtype=np.int64)
        return TierAssignment(cap, tier, tc, need, rule, knobs)

    need = percentile_need(counts, percentile) if need is None else need
    order = sorted(range(n_experts), key=lambda e: (-need[e], e))
    if rule == "optimal":
        caps = _optimal_capacities([fit(need[e]) for e in order], tiers)
    else:
        sizes, caps, start = _buckets(n_experts, tiers, top_fraction), [], 0
        for size in sizes:
            caps.append(fit(need[order[start]]))   # the bucket's largest need
            start += size
        if multipliers is not None:
            m = [float(x) for x in multipliers]
            if len(m) != tiers or any(x <= 0 for x in m):
                raise NpuMoeError(f"multipliers must be {tiers} numbers > 0 (one per tier, relative to the base "
                                  f"tier; a multiplier <= 0 gives capacity 0), got {list(multipliers)}")
            caps = [fit(caps[-1] * x) for x in m]
    tc = tuple(sorted(set(caps), reverse=True))
    # smallest tier capacity covering the need; above the largest tier -> the largest
    tier = np.array([max([j for j, c in enumerate(tc) if c >= need[e]], default=0) for e in range(n_experts)],
                    dtype=np.int64)
    return TierAssignment(np.array(tc)[tier].astype(np.int64), tier, tc, need, rule, knobs)


def _capacity(assign) -> np.ndarray:
    return np.asarray(assign.capacity if isinstance(assign, TierAssignment) else assign, dtype=np.int64)


def expected_padding(assign, counts) -> float:
    """Padded slots / computed slots over the calibration chunks; every expert's buffer is computed every chunk
    (static graphs)."""
    cap, c = _capacity(assign), np.asarray(counts, dtype=np.int64)
    computed = int(cap.sum()) * c.shape[1]
    kept = int(np.minimum(c, cap[:, None]).sum())
    return (computed - kept) / computed if computed else 0.0


def expected_drop_rate(assign, counts) -> float:
    """Dropped assignments / routed assignments over the calibration chunks."""
    cap, c = _capacity(assign), np.asarray(counts, dtype=np.int64)
    routed = int(c.sum())
    return float(np.clip(c - cap[:, None], 0, None).sum() / routed) if routed else 0.0


def expected_kept_tokens(assign, counts) -> np.ndarray:
    """Mean kept (computed, non-padding) tokens per chunk per expert [E]: the work a residency decision moves."""
    cap, c = _capacity(assign), np.asarray(counts, dtype=np.int64)
    return np.minimum(c, cap[:, None]).mean(axis=1)
