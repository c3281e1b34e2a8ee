"""The operating point a comparison is made at (`--operating-point default|paper`).

The paper's plans drop about 10-22 % of the routed assignments (PAPER.md 3.2, 5.4); the workbench's default knobs
(percentile 90) drop 0.5-2.5 % at the paper's setting, so a speedup put beside the paper's at the default knobs is
one at another accuracy point. `paper` solves, per (model, chunk, routing, platform), the tier percentile at which
npumoe's drop rate on the replayed routing (the prompts' sampled chunks, every prompt length of the run pooled)
lands at the band's centre (16 %; `target` to move it) and says what it chose; `default` keeps today's knobs.
The platform is part of the key because npumoe's residency depends on it: only resident groups drop (cold experts
run dropless on the CPU), so the same percentile drops less where fewer groups stay on the NPU.

The solve is cheap: the drop of a percentile with the resident experts held fixed needs the tiers only (no
residency search), so a bisection on that runs inside a few rounds of "build the plan at the percentile found,
take its resident set, bisect again" (`solve_percentile`); each round's plan drop is exact (the op stream's own
accounting, `plan_drop_rate`). The routing is the simulation's own, memoised by sim.run. Where no percentile
reaches the band (even the lowest keeps the drop below 10 %: a plan with few resident groups) the result says so
and what the closest was; simulate then stops with that message (exit 2), paper-check states it in its table.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import numpy as np

from npumoe_lab.errors import NpuMoeError
from npumoe_lab.planning.knobs import PlanKnobs
from npumoe_lab.planning.plan import variant_plan
from npumoe_lab.planning.tiers import assign_tiers

OPERATING_POINTS = ("default", "paper")
PAPER_DROP_BAND = (0.10, 0.22)          # PAPER.md 3.2 / 5.4: "about 10-22 %" of routed assignments dropped
PAPER_DROP_TARGET = 0.16                # the band's centre
LOWEST_PERCENTILE = 0.5
SOLVE_VARIANT = "npumoe"


@dataclass
class OperatingPoint:
    """What `paper` chose for one (model, chunk, routing, platform): the percentile, npumoe's drop there (exact,
    on the replayed routing), and whether it lies in the band."""
    model: str
    chunk: int
    routing: str
    platform: str
    percentile: float
    drop_rate: float
    target: float
    in_band: bool
    plan_builds: int
    note: str

    def as_dict(self) -> dict:
        return asdict(self)


def check_operating_point(name: str, target: float | None = None) -> None:
    if name not in OPERATING_POINTS:
        raise NpuMoeError(f"--operating-point {name!r}: use one of {', '.join(OPERATING_POINTS)}")
    if target is not None and not PAPER_DROP_BAND[0] <= target <= PAPER_DROP_BAND[1]:
        raise NpuMoeError(f"--drop-target {target}: give a drop rate inside the paper's band "
                          f"{PAPER_DROP_BAND[0]:.2f}-{PAPER_DROP_BAND[1]:.2f} (default its centre {PAPER_DROP_TARGET})")


def plan_drop_rate(plan, real: np.ndarray, layers) -> float:
    """Dropped / routed assignments of `plan` on replayed counts `real` [chunks, layers, experts] (the op stream's
    accounting: a resident expert drops what exceeds its capacity, a cold one nothing)."""
    dropped = routed = 0.0
    for j, layer in enumerate(layers):
        lp = plan.layer_plan(layer)
        cnt = real[:, j, :lp["n_experts"]]
        cap = np.asarray(lp["capacity"])[None, :]
        dropped += float((np.maximum(cnt - cap, 0) * plan.resident_mask(layer)[None, :]).sum())
        routed += float(cnt.sum())
    return dropped / routed if routed else 0.0


def _tier_drop(profile, specs, knobs: PlanKnobs, percentile: float, resident: dict, real, layers) -> float:
    """The drop at `percentile` with the resident experts fixed (tiers only: what a bisection step needs)."""
    dropped = routed = 0.0
    for j, (layer, spec) in enumerate(zip(layers, specs)):
        counts = profile.count_matrix(layer)
        counts = np.pad(counts, ((0, spec.n_experts - counts.shape[0]), (0, 0)))
        a = assign_tiers(counts, profile.chunk, spec.top_k, spec.n_experts, tiers=knobs.tiers, percentile=percentile,
                         align=knobs.align, min_capacity=knobs.min_capacity, multipliers=knobs.multipliers,
                         rule=knobs.capacity_rule, uniform_slack=knobs.uniform_slack, top_fraction=knobs.top_fraction)
        cnt = real[:, j, :spec.n_experts]
        dropped += float((np.maximum(cnt - a.capacity[None, :], 0) * resident[layer][None, :]).sum())
        routed += float(cnt.sum())
    return dropped / routed if routed else 0.0


def bisect_percentile(drop_at, target: float, lo: float = LOWEST_PERCENTILE, hi: float = 100.0,
                      steps: int = 24, tol: float = 0.002) -> float:
    """The percentile in [lo, hi] whose drop is closest to `target`, drop_at(p) falling as p rises (capacities are
    steps of `align`: the exact target is seldom reachable; the closest evaluated point is kept)."""
    seen = {}

    def f(p):
        if p not in seen:
            seen[p] = drop_at(p)
        return seen[p]
    if f(lo) <= target:
        return lo
    if f(hi) >= target:
        return hi
    for _ in range(steps):
        mid = 0.5 * (lo + hi)
        d = f(mid)
        if abs(d - target) <= tol or hi - lo < 0.05:
            break
        lo, hi = (mid, hi) if d > target else (lo, mid)
    return min(seen, key=lambda p: (abs(seen[p] - target), -p))


def solve_percentile(profile, specs, platform, real: np.ndarray, knobs: dict | None = None,
                     target: float = PAPER_DROP_TARGET, band: tuple = PAPER_DROP_BAND, rounds: int = 4,
                     labels: dict | None = None) -> OperatingPoint:
    """The paper operating point of one (profile = model, chunk, routing; platform): module docstring. `real`:
    the replayed counts [chunks, MoE layers, experts] of the run's prompts (RoutingCounts.real, pooled)."""
    given = dict(knobs or {})
    if "percentile" in given:
        raise NpuMoeError("--operating-point paper solves the percentile itself; drop --percentile, or use "
                          "--operating-point default")
    k = PlanKnobs.of(given)
    layers = [s.layer for s in specs]
    builds, tried = 0, {}

    def exact(p):
        nonlocal builds
        plan = variant_plan(profile, SOLVE_VARIANT, specs, platform, {**given, "percentile": p})
        builds += 1
        tried[p] = (plan_drop_rate(plan, real, layers), plan)
        return tried[p]

    p = k.percentile
    for _ in range(rounds):
        d, plan = exact(p)
        if abs(d - target) <= 0.01:
            break
        resident = {layer: plan.resident_mask(layer) for layer in layers}
        p_next = bisect_percentile(lambda q: _tier_drop(profile, specs, k, q, resident, real, layers), target)
        if p_next in tried:
            break
        p = p_next
    best = min(tried, key=lambda q: (abs(tried[q][0] - target), -q))
    if tried[best][0] < band[0] and LOWEST_PERCENTILE not in tried:   # is the band out of reach altogether?
        exact(LOWEST_PERCENTILE)
        best = min(tried, key=lambda q: (abs(tried[q][0] - target), -q))
    d = tried[best][0]
    inside = band[0] <= d <= band[1]
    lab = labels or {}
    note = (f"percentile {best:.3g}: npumoe drops {d:.1%} (target {target:.0%})" if inside else
            f"no percentile puts npumoe's drop in {band[0]:.0%}-{band[1]:.0%}: the closest is {d:.1%} at "
            f"percentile {best:.3g} (lowest tried {min(tried):.3g}: {tried[min(tried)][0]:.1%})")
    return OperatingPoint(lab.get("model", "-"), int(profile.chunk), lab.get("routing", "-"),
                          getattr(platform, "label", str(platform)), float(best), float(d), float(target),
                          bool(inside), builds, note)


def operating_columns(point: OperatingPoint | None) -> dict:
    """Result-row columns of the operating point a row was simulated at."""
    if point is None:
        return {"operating_point": "default"}
    return {"operating_point": "paper", "op_percentile": point.percentile, "op_drop_target": point.target,
            "op_drop_rate": point.drop_rate, "op_in_band": point.in_band}


def points_table(points) -> "list[dict]":
    return [p.as_dict() for p in points]


__all__ = ["OPERATING_POINTS", "PAPER_DROP_BAND", "PAPER_DROP_TARGET", "OperatingPoint", "bisect_percentile",
           "check_operating_point", "operating_columns", "plan_drop_rate", "solve_percentile"]
