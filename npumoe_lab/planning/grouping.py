"""Grouped expert execution (PAPER.md 3.3): experts of one capacity tier share one static graph.

A group of G experts with tier capacity C runs as one call over a static buffer [G, C, hidden]; G = 1 is one
graph per expert. The group size asked for is capped, per tier, by:
- the experts in the tier (a tier of 3 experts cannot fill a group of 8; `strict=True` makes that an error),
- the graph byte budget: G * 3 * hidden * intermediate * dtype_bytes <= graph_limit_bytes (the ~1.2 GB graph
  that fell off the ANE, PAPER.md 3.3),
- the packed token axis: G * C <= max_dim,
- the expanded intermediate axis: G * intermediate <= 65536 (ANCHORS.md 3.8).
`group_size_limit` returns the cap and the reasons, which the plan keeps as notes.

Orders: `popularity` cuts the tier's experts, hottest first, into consecutive groups (hot groups stay hot for
residency); `coactivation` grows each group from the hottest unassigned expert by adding the expert most often
co-routed with the members (fewer groups touched per token).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from npumoe_lab.errors import NpuMoeError
from npumoe_lab.planning.choices import ORDERS  # noqa: F401 - named apart: the CLI lists it without numpy

EXPANDED_DIM_LIMIT = 65536


@dataclass(frozen=True)
class Group:
    id: int
    tier: int
    capacity: int                 # token slots per expert per chunk
    experts: tuple                # expert ids, in buffer order
    expected_tokens: float        # expected kept tokens per chunk, summed over the members
    weight_bytes: int             # gate + up + down weights of all members

    def __post_init__(self):
        if self.capacity < 1:
            raise NpuMoeError(f"group {self.id}: capacity must be >= 1, got {self.capacity}")
        if not self.experts or (len(self.experts) > 1 and len(set(self.experts)) != len(self.experts)):
            raise NpuMoeError(f"group {self.id}: experts must be a non-empty tuple of distinct ids, "
                              f"got {self.experts}")

    @property
    def size(self) -> int:
        return len(self.experts)

    def to_dict(self) -> dict:
        return {"id": self.id, "tier": self.tier, "capacity": self.capacity, "experts": list(self.experts),
                "expected_tokens": float(self.expected_tokens), "weight_bytes": self.weight_bytes}


def expert_bytes(hidden: int, intermediate: int, dtype_bytes: int = 2) -> int:
    return 3 * hidden * intermediate * dtype_bytes


def group_size_limit(group_size: int, n_in_tier: int, capacity: int, hidden: int, intermediate: int,
                     dtype_bytes: int = 2, graph_limit_bytes: int | None = None, max_dim: int | None = None,
                     strict: bool = False) -> tuple[int, list[str]]:
    """(the group size used for this tier, the reasons it is smaller than asked)."""
    if not isinstance(group_size, (int, np.integer)) or group_size < 1:
        raise NpuMoeError(f"group_size must be an int >= 1 (1 = one graph per expert), got {group_size!r}")
    one = expert_bytes(hidden, intermediate, dtype_bytes)
    if graph_limit_bytes is not None and one > graph_limit_bytes:
        raise NpuMoeError(f"one expert alone ({one / 2**20:.1f} MiB) exceeds the graph budget of "
                          f"{graph_limit_bytes / 2**20:.1f} MiB; quantize the weights or raise graph_limit_bytes")
    if max_dim is not None and capacity > max_dim:
        raise NpuMoeError(f"capacity {capacity} exceeds the device's max dimension {max_dim}; use a smaller "
                          "chunk or percentile")
    if intermediate > EXPANDED_DIM_LIMIT:
        raise NpuMoeError(f"intermediate size {intermediate} exceeds the expanded-dimension limit "
                          f"{EXPANDED_DIM_LIMIT}; this model's experts need tiling, which the planner does not do")
    g, notes = int(group_size), []
    if g > n_in_tier:
        if strict:
            raise NpuMoeError(f"group_size {g} is larger than the {n_in_tier} experts of this tier; use "
                              f"group_size <= {n_in_tier} or strict=False to cap it")
        g, notes = n_in_tier, [f"group size {group_size} capped to the tier's {n_in_tier} experts"]
    caps = {"graph budget": None if graph_limit_bytes is None else graph_limit_bytes // one,
            f"packed axis {max_dim}": None if max_dim is None else max_dim // capacity,
            f"expanded axis {EXPANDED_DIM_LIMIT}": EXPANDED_DIM_LIMIT // intermediate}
    for why, lim in caps.items():
        if lim is not None and g > lim:
            notes.append(f"group size {g} capped to {lim} by the {why}")
            g = int(lim)
    return g, notes


def _coactivation_order(members: list[int], load: np.ndarray, coact: np.ndarray, g: int) -> list[list[int]]:
    left = sorted(members, key=lambda e: (-load[e], e))
    groups = []
    while left:
        grp = [left.pop(0)]
        while left and len(grp) < g:
            best = max(left, key=lambda e: (sum(coact[e, m] for m in grp), load[e], -e))
            left.remove(best)
            grp.append(best)
        groups.append(grp)
    return groups


def make_groups(tier, capacity, expected_load, group_size: int, order: str = "popularity", coactivation=None, *,
                hidden: int, intermediate: int, dtype_bytes: int = 2, graph_limit_bytes: int | None = None,
                max_dim: int | None = None, strict: bool = False) -> list[Group]:
    """Pack each tier's experts into groups of <= group_size (after `group_size_limit`). Ids run tier 0 first."""
    return make_groups_with_notes(tier, capacity, expected_load, group_size, order, coactivation, hidden=hidden,
                                  intermediate=intermediate, dtype_bytes=dtype_bytes,
                                  graph_limit_bytes=graph_limit_bytes, max_dim=max_dim, strict=strict)[0]


def make_groups_with_notes(tier, capacity, expected_load, group_size, order="popularity", coactivation=None, *,
                           hidden, intermediate, dtype_bytes=2, graph_limit_bytes=None, max_dim=None,
                           strict=False) -> tuple[list[Group], list[str]]:
    tier, capacity = np.asarray(tier, dtype=np.int64), np.asarray(capacity, dtype=np.int64)
    load = np.asarray(expected_load, dtype=np.float64)
    E = len(tier)
    if capacity.shape != (E,) or load.shape != (E,):
        raise NpuMoeError(f"tier {tier.shape}, capacity {capacity.shape} and expected_load {load.shape} must all "
                          "be [n_experts]")
    if order not in ORDERS:
        raise NpuMoeError(f"unknown group order {order!r}; use one of: {', '.join(ORDERS)}")
    if order == "coactivation":
        if coactivation is None:
            raise NpuMoeError("order='coactivation' needs the coactivation matrix [E, E]; pass "
                              "profile.coactivation_matrix(layer) or use order='popularity'")
        coact = np.asarray(coactivation, dtype=np.float64)
        if coact.shape != (E, E):
            raise NpuMoeError(f"coactivation must be [{E}, {E}], got {coact.shape}")
    groups, notes = [], []
    per_expert = expert_bytes(hidden, intermediate, dtype_bytes)
    tiers_, loads_ = tier.tolist(), load.tolist()      # Python scalars: the loops below index them per expert
    for t in sorted(set(tiers_)):
        members = [e for e in range(E) if tiers_[e] == t]
        caps = set(capacity[members].tolist())
        if len(caps) != 1:
            raise NpuMoeError(f"tier {t} mixes capacities {sorted(caps)}; every expert of a tier must share one")
        cap = caps.pop()
        g, why = group_size_limit(group_size, len(members), cap, hidden, intermediate, dtype_bytes,
                                  graph_limit_bytes, max_dim, strict)
        notes += [f"tier {t}: {w}" for w in why]
        if order == "popularity":
            ranked = sorted(members, key=lambda e: (-loads_[e], e))
            parts = [ranked[i:i + g] for i in range(0, len(ranked), g)]
        else:
            parts = _coactivation_order(members, load, coact, g)
        # `part` holds Python ints (members come from range(E)); one expert: its own load (a one-element
        # sum is the element)
        for part in parts:
            groups.append(Group(len(groups), int(t), int(cap), tuple(part),
                                loads_[part[0]] if len(part) == 1 else float(load[part].sum()),
                                per_expert * len(part)))
    return groups, notes
