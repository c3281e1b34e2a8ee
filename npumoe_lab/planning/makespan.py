"""Residency as scheduling (residency mode `makespan`, build_plan's default): choose the NPU-resident groups of a
layer to minimise the modeled makespan of its layer-chunk, the NPU and CPU queues overlapping as
execution/timeline.py schedules the engine's events.

The layer-chunk the engine emits (engine.PlanExecutor.execute) on the MoE part: router, dispatch and pack on the CPU
in program order, then every resident group's NPU call (one serial NPU queue) beside one dynamic cold-expert op on
the CPU (the non-resident experts at their actual load, one op call per touched expert), then scatter. Everything
but the groups and the cold op is serial, so for a resident set S and calibration chunk c

    makespan_c(S) = router + dispatch + pack(rows(S)) + max(NPU(S), cold_c(S)) + scatter
                    (NPU(S) + cold_c(S) where the NPU role runs on the CPU: npu_shares_cpu)

with NPU(S) = sum of the groups' static-shape calls and cold_c(S) the cold op at chunk c's routed load of the experts
outside S (the calibration counts; 0 when none is routed). The objective is the mean over the calibration chunks.

Search (`choose_resident`): the exact optimum over all 2^n subsets when a layer has at most EXHAUSTIVE_GROUPS
groups; beyond, the exact optimum over a family fixed by the plan alone: groups of one (capacity, size) class cost
the same on the NPU and in the packed buffer, so within a class the most loaded go first, and every combination of
per-class prefix lengths is evaluated (capped at MAX_CANDIDATES by coarsening the largest class's steps). Both
families contain "all resident" (= npumoe-tg's residency) and "none resident" (= anemll's expert placement) and the
best is kept, so the modeled makespan is never above either. Because the family does not depend on the platform,
a faster NPU or CPU (which lowers every candidate's makespan) never raises the chosen one.
"""
from __future__ import annotations

import functools
import itertools
import math
from dataclasses import dataclass

import numpy as np

from npumoe_lab.devices.cost import OpCost, dense_cost, expert_ffn_cost, memory_cost
from npumoe_lab.errors import NpuMoeError

EXHAUSTIVE_GROUPS = 10          # 2^10 subsets x chunks: exact, milliseconds
MAX_CANDIDATES = 4096


def cold_experts_cost(load: int, n_experts: int, hidden: int, intermediate: int, dtype_bytes: int) -> OpCost:
    """The dynamic cold-expert op (engine.dynamic_experts_cost): `load` assignments over `n_experts` touched experts,
    one call each, every touched expert's weights streamed once."""
    n_exp = max(1, int(n_experts))
    cost = expert_ffn_cost(1, max(1, int(load)), hidden, intermediate, dtype_bytes=dtype_bytes, calls=n_exp)
    return OpCost("experts_dynamic", cost.flops, cost.bytes + (n_exp - 1) * 3 * hidden * intermediate * dtype_bytes,
                  n_exp, cost.gemm)


@functools.lru_cache(maxsize=65536)
def _group_call_s(npu, g: int, capacity: int, hidden: int, intermediate: int, dtype_bytes: int,
                  weight_bytes: int) -> float:
    """npu.estimate of one static group call (pure: a grid's plans ask for the same few shapes)."""
    return npu.estimate(expert_ffn_cost(g, capacity, hidden, intermediate, dtype_bytes, weight_bytes=weight_bytes))


_RATES: dict = {}        # (device, N, K) -> [M] c.gemm_rate((m, N, K)) for m = 0, 1, ... (index 0 unused)


def gemm_rates(device, m: np.ndarray, n: int, k: int) -> np.ndarray:
    """device.gemm_rate((int(m), n, k)) elementwise for whole-number m >= 1, read from a table of the device's
    rates per row count (built once per device and shape, grown as larger m come): a plan sweep asks for the same
    few thousand rates millions of times."""
    top = int(m.max()) if m.size else 0
    key = (device, int(n), int(k))
    table = _RATES.get(key)
    if table is None or len(table) <= top:
        have = 0 if table is None else len(table)
        grown = [device.gemm_rate((i, n, k)) for i in range(max(have, 1), max(top + 1, 2 * have))]
        table = np.concatenate([np.zeros(1) if table is None else table, np.array(grown, dtype=np.float64)])
        if len(_RATES) >= 256:
            _RATES.clear()
        _RATES[key] = table
    if m.size and (m != np.floor(m)).any():
        raise NpuMoeError("gemm_rates needs whole-number row counts")
    return table[m.astype(np.int64)]


@dataclass
class LayerCase:
    """What the makespan of one layer-chunk depends on. `counts` [E, chunks]: routed assignments per expert and
    calibration chunk; `groups`: (experts, capacity) per group."""
    groups: list
    counts: np.ndarray
    hidden: int
    intermediate: int
    top_k: int
    chunk: int
    dtype_bytes: int = 2
    npu_weight_bytes: int | None = None


class LayerMakespan:
    """Modeled layer-chunk makespan of resident sets (bool masks over the groups), averaged over the chunks."""

    def __init__(self, case: LayerCase, platform, parts: dict | None = None):
        """`parts`: a dict kept with the case's groups and counts (build_plan keeps one per static layer) where the
        platform-free parts (group loads, touched experts, rows, candidate masks) are kept for the next platform."""
        self.case, self.platform = case, platform
        self.parts = {} if parts is None else parts
        H, I, b = case.hidden, case.intermediate, case.dtype_bytes
        counts = np.asarray(case.counts, dtype=np.float64)
        if counts.ndim != 2 or counts.shape[1] < 1:
            raise NpuMoeError(f"makespan residency needs a count matrix [experts, chunks], got shape {counts.shape}")
        cpu, npu = platform.cpu, platform.npu
        n_assign = case.chunk * case.top_k
        self.shared = bool(platform.npu_shares_cpu)
        self.fixed = (cpu.estimate(dense_cost(case.chunk, H, counts.shape[0], dtype_bytes=b, name="router"))
                      + cpu.estimate(memory_cost(n_assign * 16, "dispatch"))
                      + cpu.estimate(memory_cost(2 * n_assign * H * b, "scatter")))
        wb = case.npu_weight_bytes or b
        self.npu_s = np.array([_group_call_s(npu, len(e), int(c), H, I, b, wb) for e, c in case.groups])
        if "load" not in self.parts:
            self.parts.update(
                rows=np.array([len(e) * int(c) for e, c in case.groups], dtype=np.float64),
                load=np.stack([counts[list(e)].sum(0) for e, _ in case.groups]),             # [n, chunks]
                touched=np.stack([(counts[list(e)] > 0).sum(0) for e, _ in case.groups]))    # [n, chunks]
        self.rows, self.load, self.touched = self.parts["rows"], self.parts["load"], self.parts["touched"]
        self._pack = lambda r: cpu.estimate(memory_cost(2 * r * H * b, "pack"))

    @property
    def n(self) -> int:
        return len(self.npu_s)

    def __call__(self, resident) -> float:
        """Mean over the calibration chunks of the layer-chunk's modeled makespan with `resident` on the NPU."""
        return float(self.many(np.asarray([resident], dtype=bool))[0])

    def cold_seconds(self, load: np.ndarray, touched: np.ndarray) -> np.ndarray:
        """cpu.estimate(cold_experts_cost(load, touched, ...)) elementwise (0 where nothing is routed): the
        roofline of DeviceModel.estimate, the GEMM rate looked up once per distinct load."""
        c, H, I, b = self.platform.cpu, self.case.hidden, self.case.intermediate, self.case.dtype_bytes
        n = np.maximum(touched, 1.0)
        m = np.maximum(load, 1.0)
        rate = gemm_rates(c, m, I, H)
        flops, nbytes = 6.0 * m * H * I, 3.0 * H * I * b * n + 2.0 * m * H * b
        t = n * c.call_overhead_s + np.maximum(flops / rate, nbytes / c.bandwidth_bytes_s)
        return np.where(load > 0, t, 0.0)

    def pack_seconds(self, rows: np.ndarray) -> np.ndarray:
        """cpu.estimate(memory_cost(2 * rows * H * b, "pack")) elementwise: on a roofline CPU the same arithmetic
        as DeviceModel.estimate (one call's overhead + bytes / bandwidth, no FLOPs), else op by op."""
        cpu, H, b = self.platform.cpu, self.case.hidden, self.case.dtype_bytes
        if getattr(cpu, "graph_model", None):
            return np.array([self._pack(r) for r in rows])
        return 1 * cpu.call_overhead_s + np.maximum(0.0, 2 * rows * H * b / cpu.bandwidth_bytes_s)

    def many(self, masks: np.ndarray) -> np.ndarray:
        """[candidates] mean makespans of [candidates, n] resident masks."""
        masks = np.asarray(masks, dtype=bool)
        npu = masks @ self.npu_s
        pack = self.pack_seconds(masks @ self.rows)
        cold = ~masks
        load, touched = cold.astype(float) @ self.load, cold.astype(float) @ self.touched   # [cand, chunks]
        cold_s = self.cold_seconds(np.rint(load), np.rint(touched))
        both = npu[:, None] + cold_s if self.shared else np.maximum(npu[:, None], cold_s)
        return self.fixed + pack + both.mean(1)


def candidate_masks(case: LayerCase, exhaustive: int = EXHAUSTIVE_GROUPS,
                    max_candidates: int = MAX_CANDIDATES) -> np.ndarray:
    """The resident sets searched ([candidates, n] bool): every subset for n <= exhaustive, else per (capacity,
    size) class the most loaded first, every combination of prefix lengths. Row 0 is none, row 1 all resident."""
    n = len(case.groups)
    if n <= exhaustive:
        # itertools.product((False, True), repeat=n) as bits (the first group varies slowest), in its order
        every = (np.arange(2 ** n)[:, None] >> np.arange(n - 1, -1, -1)[None, :]) & 1 == 1
        k = every.sum(1)
        return np.concatenate([np.zeros((1, n), bool), np.ones((1, n), bool), every[(k > 0) & (k < n)]])
    counts = np.asarray(case.counts, dtype=np.float64)
    load = [float(counts[list(e)].sum()) for e, _ in case.groups]
    classes: dict = {}
    for i, (e, c) in enumerate(case.groups):
        classes.setdefault((int(c), len(e)), []).append(i)
    members = [sorted(ix, key=lambda i: (-load[i], i)) for ix in classes.values()]
    steps = [list(range(len(m) + 1)) for m in members]
    while math.prod(len(s) for s in steps) > max_candidates:      # coarsen the class with the most steps
        j = max(range(len(steps)), key=lambda k: len(steps[k]))
        s = steps[j]
        steps[j] = sorted(set(s[::2]) | {s[-1]})
        if len(steps[j]) == len(s):
            break
    lengths = np.array(list(itertools.product(*steps)), dtype=np.int64).reshape(-1, len(steps))
    rows = np.zeros((len(lengths), n), dtype=bool)
    for j, ix in enumerate(members):          # class j's first lengths[:, j] members (most loaded first) resident
        rows[:, ix] = np.arange(len(ix))[None, :] < lengths[:, j, None]
    some, every = rows.any(1), rows.all(1)
    order = np.argsort(2 * some + every, kind="stable")       # none first, then the mixed sets, all last
    rows = rows[order]
    mid = rows[some[order] & ~every[order]]
    return np.concatenate([rows[:1], rows[-1:], mid]).reshape(-1, n)


def choose_resident(case: LayerCase, platform, exhaustive: int = EXHAUSTIVE_GROUPS,
                    model: LayerMakespan | None = None) -> tuple[list[bool], float]:
    """(resident flag per group, its modeled mean makespan in seconds): the best candidate (ties: fewer NPU
    groups, then the earlier candidate). `model`: the case's LayerMakespan when the caller has it already."""
    if not case.groups:
        return [], 0.0
    model = model or LayerMakespan(case, platform)
    key = ("candidates", exhaustive)
    if key not in model.parts:           # the family depends on the case alone: kept for the next platform
        model.parts[key] = candidate_masks(case, exhaustive)
    masks = model.parts[key]
    spans = model.many(masks)
    # the tie rule on the few candidates within rounding of the minimum (round is monotone: no other can tie)
    near = np.flatnonzero(spans <= spans.min() + 1e-14 + 1e-15 * abs(spans.min()))
    best = min(near.tolist(), key=lambda i: (round(spans[i], 15), int(masks[i].sum()), i))
    return [bool(x) for x in masks[best]], float(spans[best])


def fit_program_budget(layers: list, budget: int) -> list[list[bool]]:
    """[(LayerMakespan, resident flags)] per layer -> flags with at most `budget` resident groups over all layers:
    while over it, the resident group whose move to the CPU lengthens its layer-chunk least is moved (greedy on
    the exact marginal makespan; the ANE keeps ~120 programs per process, platform max_resident_programs)."""
    if isinstance(budget, bool) or not isinstance(budget, int) or budget < 0:
        raise NpuMoeError(f"npu_program_budget must be an integer >= 0 (resident expert groups), got {budget!r}")
    masks = [np.asarray(f, dtype=bool).copy() for _, f in layers]
    spans = [float(m(mask)) if mask.size else 0.0 for (m, _), mask in zip(layers, masks)]
    total = int(sum(m.sum() for m in masks))

    def best_move(li):
        """(makespan added, group, new makespan) of layer li's cheapest single move to the CPU (None: none left).
        Only the layer that moved changes its candidates, so each layer's best move is kept between steps."""
        mask = masks[li]
        on = np.flatnonzero(mask)
        if not on.size:
            return None
        cand = np.repeat(mask[None], len(on), 0)
        cand[np.arange(len(on)), on] = False
        new = layers[li][0].many(cand)
        j = int(np.argmin(new))
        return float(new[j]) - spans[li], int(on[j]), float(new[j])

    moves = [best_move(li) for li in range(len(layers))] if total > budget else []
    while total > budget:
        li = min((i for i, mv in enumerate(moves) if mv is not None), key=lambda i: (moves[i][0], i))
        _, gi, span = moves[li]
        masks[li][gi], spans[li] = False, span
        moves[li] = best_move(li)
        total -= 1
    return [m.tolist() for m in masks]


__all__ = ["LayerCase", "LayerMakespan", "candidate_masks", "choose_resident", "cold_experts_cost",
           "fit_program_budget"]
