"""Routing drift: how far live routing strays from the calibration a plan was built on, and recalibration.

A `DriftMonitor` is handed, per (chunk, MoE layer), the experts' observed assignment counts and the executor's
LayerStats (`attach(model, plan, monitor=m)` or `PlanExecutor(..., monitor=m)`; a routing replay calls the same
executor, so simulations are monitored too). Per record it computes (all measured on the run's routing):
  - drop rate and padding rate beside the plan's expected ones (plan layer `expected_drop_rate/_padding`),
  - the Jensen-Shannon distance (base 2, in [0, 1]) of the observed load vs the calibrated popularity,
  - the hot set's overlap: share of the calibrated top-k experts among the observed top-k.
A limit crossed (DriftLimits) flags the record and warns once per (layer, measure). With
`recalibrate="rebuild"`, drift that persists for `persist` consecutive chunks rebuilds the plan from a running
profile (the last `window` chunks' live counts) with the plan's own knobs; the executor adopts it at the next
chunk boundary (`pending_plan`). Each rebuild reports its measured build time on this host and the static graphs
a real NPU would recompile: only the groups whose (experts, capacity) shape is new.
"""
from __future__ import annotations

import time
import warnings
from collections import deque
from dataclasses import asdict, dataclass, field

import numpy as np
import pandas as pd

from npumoe_lab.planning.profile import CalibrationProfile
from npumoe_lab.errors import NpuMoeError
from npumoe_lab.planning.plan import Plan, build_plan

POLICIES = ("off", "warn", "rebuild")
MEASURES = ("drop_excess", "pad_excess", "js", "hot_overlap")


class DriftWarning(UserWarning):
    """Live routing crossed a drift limit."""


@dataclass(frozen=True)
class DriftLimits:
    """A record is flagged when any limit is crossed. Defaults sit above the per-chunk noise of 128-token chunks
    of the calibration domain itself, measured on the bundled model (plan on scripture, lm-heldout scripture, 16
    chunks x 4 layers: max JS 0.25, min overlap 0.5, max drop excess 0.025, max pad excess 0.012) and below what
    scripture -> code gives (JS >= 0.33, drop excess >= 0.10 before any rebuild); docs/DESIGN.md "Drift"."""
    drop_excess: float = 0.05     # observed - expected drop rate (absolute)
    pad_excess: float = 0.05      # observed - expected padding share of the static slots (absolute)
    js: float = 0.3               # Jensen-Shannon distance, base 2
    hot_overlap: float = 0.5      # flagged below this share of the calibrated hot set
    hot_k: int | None = None      # hot-set size; None: a quarter of the experts (the top tier's bucket)

    def __post_init__(self):
        for name in ("drop_excess", "pad_excess", "js", "hot_overlap"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 <= v <= 1:
                raise NpuMoeError(f"drift limit {name}={v!r} must be a number in [0, 1]")
        if self.hot_k is not None and (isinstance(self.hot_k, bool) or not isinstance(self.hot_k, int)
                                       or self.hot_k < 1):
            raise NpuMoeError(f"drift limit hot_k={self.hot_k!r} must be an integer >= 1 (or None)")


def as_limits(limits) -> DriftLimits:
    if limits is None:
        return DriftLimits()
    if isinstance(limits, DriftLimits):
        return limits
    if isinstance(limits, dict):
        unknown = sorted(set(limits) - set(DriftLimits.__dataclass_fields__))
        if unknown:
            raise NpuMoeError(f"unknown drift limit(s) {unknown}; valid: {', '.join(DriftLimits.__dataclass_fields__)}")
        return DriftLimits(**limits)
    raise NpuMoeError(f"limits must be a DriftLimits or a dict, got {type(limits).__name__}")


def hot_set(counts: np.ndarray, k: int) -> set[int]:
    """The k experts with the largest counts (ties: lower id first)."""
    order = sorted(range(len(counts)), key=lambda e: (-counts[e], e))
    return set(order[:k])


def jensen_shannon(p, q) -> float:
    """Jensen-Shannon distance base 2 (sqrt of the divergence, in [0, 1]) of two distributions (normalised here);
    scipy.spatial.distance.jensenshannon(p, q, base=2) without scipy (not a dependency of the workbench)."""
    p, q = np.asarray(p, dtype=float), np.asarray(q, dtype=float)
    p, q = p / p.sum(), q / q.sum()
    m = (p + q) / 2

    def kl(a):
        nz = a > 0
        return float((a[nz] * np.log2(a[nz] / m[nz])).sum())
    return float(np.sqrt(max(0.0, (kl(p) + kl(q)) / 2)))


def measures(counts, reference_share, k: int) -> tuple[float, float]:
    """(Jensen-Shannon distance base 2, hot-set overlap) of observed counts [E] vs a reference share [E]."""
    counts = np.asarray(counts, dtype=float)
    if counts.sum() == 0:
        return 0.0, 1.0
    js = jensen_shannon(counts, reference_share)
    return js, len(hot_set(counts, k) & hot_set(reference_share, k)) / k


@dataclass
class Rebuild:
    """One recalibration: when, what it cost, what changed."""
    chunk: int                    # the plan is adopted from chunk + 1 on
    build_s: float                # measured wall time of build_plan on this host
    graphs_total: int             # NPU graphs (resident groups) of the new plan
    graphs_recompiled: list       # (layer, experts, capacity) of the new plan's groups not in the old plan
    plan: Plan = field(repr=False)

    def row(self) -> dict:
        return {"rebuild_chunk": self.chunk, "rebuild_build_s_measured": self.build_s,
                "graphs_total": self.graphs_total, "graphs_recompiled": len(self.graphs_recompiled)}


def npu_graphs(plan: Plan) -> list[tuple]:
    """(layer, experts, capacity) of every resident group: one compiled static graph each on the NPU."""
    return [(lp["layer"], tuple(g["experts"]), g["capacity"]) for lp in plan.layers for g in lp["groups"]
            if g["resident"]]


def changed_graphs(old: Plan, new: Plan) -> list[tuple]:
    """NPU graphs of `new` that `old` does not have: a resident group whose experts and capacity are unchanged
    keeps its compiled graph; cold groups run dynamically on the CPU and compile nothing."""
    have = set(npu_graphs(old))
    return [g for g in npu_graphs(new) if g not in have]


class DriftMonitor:
    """Per (chunk, layer) drift of live routing vs `plan`'s calibration `profile` (see the module docstring).
    `specs`: layer specs for a rebuild (None: the profile's stored ones)."""

    def __init__(self, plan: Plan, profile: CalibrationProfile, limits=None, recalibrate: str = "off",
                 persist: int = 2, window: int = 8, specs=None):
        if not isinstance(plan, Plan):
            raise NpuMoeError(f"DriftMonitor needs a Plan (its expected drop/padding rates), got {type(plan).__name__}")
        if not isinstance(profile, CalibrationProfile):
            raise NpuMoeError(f"DriftMonitor needs the plan's CalibrationProfile, got {type(profile).__name__}")
        plan.check_model(profile.meta["model_fingerprint"])   # a profile of another model is an error
        if recalibrate not in POLICIES:
            raise NpuMoeError(f"recalibrate={recalibrate!r}: use one of {POLICIES}")
        for name, v in (("persist", persist), ("window", window)):
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise NpuMoeError(f"{name}={v!r} must be an integer >= 1")
        if window < persist:
            raise NpuMoeError(f"window={window} must be >= persist={persist}: a rebuild uses the persisting chunks")
        self.limits, self.policy, self.persist, self.window = as_limits(limits), recalibrate, persist, window
        self.profile, self.specs = profile, specs
        self.records: list[dict] = []
        self.rebuilds: list[Rebuild] = []
        self._warned: set = set()
        self._live = {lp["layer"]: deque(maxlen=window) for lp in plan.layers}   # layer -> recent [E] counts
        self._chunk_flags: set = set()      # (layer, measure) flagged in the current chunk
        self._streak = 0                    # consecutive drifting chunks
        self._pending: Plan | None = None
        self._adopt(plan, {lp["layer"]: _share(profile.count_matrix(lp["layer"]).sum(1), lp["n_experts"])
                           for lp in plan.layers})

    def _adopt(self, plan: Plan, reference: dict):
        self.plan, self.reference = plan, reference
        self._layers = {lp["layer"]: lp for lp in plan.layers}
        self._last_layer = max(self._layers)

    # -- what the executor calls ------------------------------------------------------------------------
    def observe(self, chunk: int, layer: int, counts, stats) -> None:
        """One (chunk, layer): `counts` [E] real assignments per expert, `stats` the executor's LayerStats."""
        lp = self._layers.get(layer)
        if lp is None:
            raise NpuMoeError(f"layer {layer} is not in the monitored plan (layers {sorted(self._layers)})")
        counts = np.asarray(counts, dtype=np.int64).reshape(-1)
        k = self.limits.hot_k or max(1, lp["n_experts"] // 4)
        js, overlap = measures(counts, self.reference[layer], k)
        drop = stats.dropped / stats.routed if stats.routed else 0.0
        pad = stats.padded / stats.slots if stats.slots else 0.0
        rec = {"chunk": chunk, "layer": layer, "plan_version": len(self.rebuilds), "routed": stats.routed,
               "drop_rate": drop, "expected_drop_rate": lp["expected_drop_rate"],
               "drop_excess": drop - lp["expected_drop_rate"], "pad_rate": pad,
               "expected_padding": lp["expected_padding"], "pad_excess": pad - lp["expected_padding"],
               "js": js, "hot_overlap": overlap}
        crossed = [m for m in MEASURES if (rec[m] < self.limits.hot_overlap if m == "hot_overlap"
                                           else rec[m] > getattr(self.limits, m))]
        rec["flagged"] = ",".join(crossed)   # the measures whose limit is crossed
        self.records.append(rec)
        self._live[layer].append(counts)
        for m in crossed:
            self._chunk_flags.add((layer, m))
            if (layer, m) not in self._warned:
                self._warned.add((layer, m))
                limit = getattr(self.limits, m)
                warnings.warn(f"routing drift at MoE layer {layer}, chunk {chunk}: {m}={rec[m]:.3f} "
                              f"{'<' if m == 'hot_overlap' else '>'} limit {limit}", DriftWarning, stacklevel=2)
        if layer == self._last_layer:
            self._end_chunk(chunk)

    def pending_plan(self) -> Plan | None:
        """A rebuilt plan not yet adopted by the executor (taken once), else None."""
        plan, self._pending = self._pending, None
        return plan

    # -- recalibration ----------------------------------------------------------------------------------
    def _end_chunk(self, chunk: int):
        self._streak = self._streak + 1 if self._chunk_flags else 0
        self._chunk_flags = set()
        if self._streak < self.persist or self.policy == "off":
            return
        if self.policy == "warn":
            if "rebuild" not in self._warned:
                self._warned.add("rebuild")
                warnings.warn(f"routing drift persisted {self._streak} chunks (to chunk {chunk}); "
                              "recalibrate='rebuild' would rebuild the plan", DriftWarning, stacklevel=3)
            return
        self._rebuild(chunk)

    def running_profile(self) -> CalibrationProfile:
        """A profile of the live window: every (layer, expert, chunk) count of the last `window` chunks."""
        rows = []
        for layer, q in self._live.items():
            m = np.stack(list(q), axis=1)                         # [E, chunks]
            E, n = m.shape
            rows.append(pd.DataFrame({"layer": layer, "expert": np.repeat(np.arange(E), n),
                                      "chunk_id": np.tile(np.arange(n), E), "count": m.reshape(-1)}))
        counts = pd.concat(rows, ignore_index=True)
        stats = counts.groupby(["layer", "expert"], as_index=False)["count"].sum()
        stats = stats.assign(weight_sum=0.0, weight_sq_sum=0.0, norm_sum=0.0)
        n = len(next(iter(self._live.values())))
        meta = dict(self.profile.meta, workload=f"live window ({n} chunks)", n_chunks=n,
                    n_tokens=n * self.profile.chunk)
        return CalibrationProfile(counts, stats, meta, None)

    def _rebuild(self, chunk: int):
        t0 = time.perf_counter()
        live = self.running_profile()
        new = build_plan(live, self.specs, **self.plan.build_kwargs())     # the plan's own knobs and platform
        build_s = time.perf_counter() - t0
        recompiled = changed_graphs(self.plan, new)
        self.rebuilds.append(Rebuild(chunk, build_s, len(npu_graphs(new)), recompiled, new))
        self._adopt(new, {layer: _share(live.count_matrix(layer).sum(1), self._layers[layer]["n_experts"])
                          for layer in self._layers})
        self._pending, self._streak = new, 0

    # -- results ----------------------------------------------------------------------------------------
    def frame(self) -> pd.DataFrame:
        """One `drift` record per (chunk, layer) (measured on the run's routing)."""
        return pd.DataFrame(self.records)

    def summary(self) -> dict:
        """Result-row columns: the worst drift seen and the layers flagged."""
        df = self.frame()
        if df.empty:
            return {}
        flagged = sorted({int(r.layer) for r in df.itertuples() if r.flagged})
        return {"drift_js_max": float(df["js"].max()), "drift_hot_overlap_min": float(df["hot_overlap"].min()),
                "drift_drop_excess_max": float(df["drop_excess"].max()),
                "drift_flagged_layers": ",".join(map(str, flagged)), "drift_rebuilds": len(self.rebuilds),
                "drift_policy": self.policy, **{f"drift_limit_{k}": v for k, v in asdict(self.limits).items()}}


def _share(counts, n_experts: int) -> np.ndarray:
    c = np.pad(np.asarray(counts, dtype=float), (0, n_experts - len(counts))) + 1e-9   # never-routed: tiny share
    return c / c.sum()


__all__ = ["DriftMonitor", "DriftLimits", "DriftWarning", "Rebuild", "POLICIES", "as_limits", "changed_graphs",
           "npu_graphs", "measures", "jensen_shannon", "hot_set"]
