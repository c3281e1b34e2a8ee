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
SCAN = (LOWEST_PERCENTILE, 5.0, 15.0, 30.0, 50.0, 70.0, 90.0)    # exact plans where the cheap rounds miss the band


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
    if not band[0] <= tried[best][0] <= band[1]:
        # the plan's resident set moves with the percentile (drop is not monotone in it): scan, then refine
        # between the two scanned points around the target
        for q in SCAN:
            if q not in tried:
                exact(q)
        qs = sorted(tried)
        for a, b in zip(qs, qs[1:]):
            if (tried[a][0] - target) * (tried[b][0] - target) < 0 and not band[0] <= tried[a][0] <= band[1] \
                    and not band[0] <= tried[b][0] <= band[1]:
                for _ in range(6):
                    m = 0.5 * (a + b)
                    dm = exact(m)[0]
                    if band[0] <= dm <= band[1]:
                        break
                    a, b = (m, b) if (tried[a][0] - target) * (dm - target) > 0 else (a, m)
                break
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


SWEEP_PERCENTILES = (0.5, 5, 15, 30, 50, 70, 90, 99)
SWEEP_BASELINES = ("cpu-only", "anemll", "naive-npu")


def percentile_sweep(geometry, routing="synthetic:gini=0.6", platforms="m2-max", percentiles=SWEEP_PERCENTILES,
                     prompt_len=1024, chunk=512, seed: int = 0, baselines=SWEEP_BASELINES, **plan_knobs):
    """Rows for the TTFT-vs-drop figure: npumoe at each tier percentile (`sweep_percentile`) and the baselines once
    (their plans do not follow the percentile but naive-npu's: it takes each expert's largest observed load)."""
    import pandas as pd     # lazy: only the figure's rows need it
    from npumoe_lab.sim.run import simulate      # lazy: sim.run imports this module
    frames = [simulate(geometry, routing, platforms, ",".join(baselines), prompt_len, chunk, seed=seed, draws=0,
                       **plan_knobs).assign(sweep_percentile=float("nan"))] if baselines else []
    for p in percentiles:
        frames.append(simulate(geometry, routing, platforms, SOLVE_VARIANT, prompt_len, chunk, seed=seed, draws=0,
                               **{**plan_knobs, "percentile": float(p)}).assign(sweep_percentile=float(p)))
    return pd.concat(frames, ignore_index=True)


def chosen_percentiles(df):
    """One row per (model, platform, chunk) of simulated rows at the paper point: the percentile chosen, npumoe's
    drop there (the solve's pooled value and per prompt length), and whether it lies in the band."""
    import pandas as pd     # lazy: only reports need it
    if "op_percentile" not in df:
        return pd.DataFrame()
    npu = df[df.variant == SOLVE_VARIANT]
    keys = ["model", "platform", "chunk"]
    out = npu.groupby(keys, as_index=False).agg(percentile=("op_percentile", "first"),
                                                drop_rate=("op_drop_rate", "first"),
                                                in_band=("op_in_band", "first"),
                                                drop_lowest_prompt=("drop_rate", "min"),
                                                drop_highest_prompt=("drop_rate", "max"))
    return out


def both_points_markdown(tables: dict, grids: dict) -> str:
    """The claims' P(holds) and npumoe's drop at each operating point side by side, and the chosen percentiles.
    `tables` / `grids`: {operating point: paper-check table / simulated rows}."""
    names = list(tables)
    lines = ["", "## The claims at both operating points", "",
             f"default = the plan knobs as shipped (percentile 90); paper = the tier percentile solved per (model, "
             f"chunk, platform) for npumoe's drop at {PAPER_DROP_TARGET:.0%} (band {PAPER_DROP_BAND[0]:.0%}-"
             f"{PAPER_DROP_BAND[1]:.0%}). Every value modeled; value = the lowest baseline / npumoe TTFT over the grid "
             "(> 1: the claim holds).", "",
             "| claim | " + " | ".join(f"{n}: value | {n}: P(holds)" for n in names) + " |",
             "|---|" + "---:|---:|" * len(names)]
    per = {n: t[t.kind == "claim"].set_index("quantity") for n, t in tables.items()}
    for q in per[names[0]].index:
        cells = []
        for n in names:
            r = per[n].loc[q] if q in per[n].index else None
            ph = getattr(r, "p_holds", math.nan) if r is not None and "p_holds" in per[n] else math.nan
            cells.append("- | -" if r is None else
                         f"{r.modeled:.3g} | {'-' if ph is None or math.isnan(ph) else f'{ph:.0%}'}")
        lines.append(f"| {q.removeprefix('claim: ')} | " + " | ".join(cells) + " |")
    lines += ["", "npumoe's drop rate over the grid (%):", "", "| operating point | lowest | highest |", "|---|---:|---:|"]
    for n, g in grids.items():
        d = g[g.variant == SOLVE_VARIANT].drop_rate
        lines.append(f"| {n} | {100 * d.min():.1f} | {100 * d.max():.1f} |")
    if "paper" in grids:
        cp = chosen_percentiles(grids["paper"])
        lines += ["", "Chosen percentiles (paper operating point; drop pooled over the grid's prompt lengths, and "
                  "its range per prompt length):", "",
                  "| model | platform | chunk | percentile | npumoe drop | per prompt | in band |",
                  "|---|---|---:|---:|---:|---:|---|"]
        for r in cp.itertuples():
            lines.append(f"| {r.model} | {r.platform} | {r.chunk} | {r.percentile:.3g} | {r.drop_rate:.1%} | "
                         f"{r.drop_lowest_prompt:.1%}-{r.drop_highest_prompt:.1%} | {'yes' if r.in_band else 'NO'} |")
        off = cp[~cp.in_band.astype(bool)]
        if len(off):
            lines += ["", f"No percentile reaches the band for {len(off)} setting(s) above (in band: NO): the "
                      "closest drop is shown; their rows are at that percentile."]
    return "\n".join(lines) + "\n"


__all__ = ["OPERATING_POINTS", "PAPER_DROP_BAND", "PAPER_DROP_TARGET", "OperatingPoint", "bisect_percentile",
           "SWEEP_PERCENTILES", "both_points_markdown", "percentile_sweep", "check_operating_point", "chosen_percentiles", "operating_columns", "plan_drop_rate", "solve_percentile"]
