"""Load-aware graph residency (PAPER.md 3.4): which expert groups keep a compiled graph on the NPU.

Modes (`RESIDENCY_MODES`):
- `makespan` (the default of build_plan with a platform): the resident set that minimises the modeled makespan of
  the layer-chunk, NPU and CPU queues overlapping as the timeline schedules them (makespan.py); never slower in the
  model than all resident (npumoe-tg) or none (anemll's expert placement), both of which it evaluates.
- `threshold`: a group is resident when its expected kept tokens per chunk >= `hot_threshold` (the knob the
  ablation sweeps).
- `cost` (the old per-group rule, kept for comparison: bench/residency.py): a group is resident only when one NPU call over its static [G, C, hidden]
  buffer (the platform's estimate: dispatch + sync + compute at the GEMM's shape, weights at the NPU's
  weight_bytes) is strictly faster than the CPU running the same experts at its expected load (the tokens routed
  to it, not the padded capacity; one CPU op call per expert, as the engine's cold path runs them). A group
  expecting no tokens stays on the CPU. Why this never loses to all-resident in the model: the layer's experts
  take max(NPU queue, CPU cold op); moving groups whose CPU time is below their NPU time shortens the NPU queue
  and adds less than it removed to the CPU side (a combined op costs at most the sum of its parts).
- `all`: every group is resident (npumoe-base/-t/-tg, naive-npu).
In every mode the resident set is then fitted into `npu_memory_budget_bytes` (when given) greedily by expected
tokens per weight byte: a group that does not fit is skipped and smaller ones are still tried. A program budget
(plan knob `npu_program_budget`, over all layers) is applied by plan.build_plan (makespan.fit_program_budget).

The program budget by default (`program_budget`): a real ANE keeps about 120 compiled programs per process and
compiles about 119 before compiles fail silently (platform npu.max_resident_programs / max_compiles, sourced, with
their alternatives in the prior). Every resident group is one program and one compile, and so is every attention
graph run on the NPU (one per layer), so a plan may keep min(programs, compiles) - attention graphs groups resident.
Searched rules (makespan, cost, threshold) keep under it; forced all-resident plans (npumoe-base/-t/-tg,
naive-npu) are not moved and their rows say `infeasible` (sim rows: feasible, infeasible_reason); budget "off"
gives the unbounded plan, for comparison.
"""
from __future__ import annotations

import functools
import math

from npumoe_lab.devices.cost import expert_ffn_cost
from npumoe_lab.errors import NpuMoeError
from npumoe_lab.planning.choices import RESIDENCY_MODES  # noqa: F401 - named apart: the CLI lists it without numpy
from npumoe_lab.planning.knobs import PROGRAM_BUDGET_OFF
from npumoe_lab.planning.makespan import LayerCase, choose_resident



def group_times(group, platform, hidden: int, intermediate: int, dtype_bytes: int = 2,
                load: float | None = None) -> tuple[float, float]:
    """(modeled NPU seconds for one call over the padded group, modeled CPU seconds for `load` tokens in all,
    default the group's expected kept tokens)."""
    return _group_times(group, platform, hidden, intermediate, dtype_bytes, load, None)


def _group_times(group, platform, hidden, intermediate, dtype_bytes, load, memo: dict | None):
    """group_times; `memo`: a dict of this caller's device estimates by (role, shape) (a plan's layers ask for the
    same few shapes thousands of times, and each lookup of _ffn_seconds' cache hashes the whole device)."""
    g = len(group.experts)
    npu = _estimate(platform, "npu", g, int(group.capacity), hidden, intermediate, dtype_bytes, 1, memo)
    load = group.expected_tokens if load is None else load
    if load <= 0:
        return npu, 0.0
    # the CPU runs the same weights over `load` rows in all, one op call per expert (the engine's cold path)
    per_expert = max(1, math.ceil(load / g))
    cpu = _estimate(platform, "cpu", g, per_expert, hidden, intermediate, dtype_bytes, g, memo)
    return npu, cpu


def _estimate(platform, role, g, rows, hidden, intermediate, dtype_bytes, calls, memo):
    key = (role, g, rows, hidden, intermediate, dtype_bytes, calls)
    if memo is not None and key in memo:
        return memo[key]
    device = platform.npu if role == "npu" else platform.cpu
    out = _ffn_seconds(device, g, rows, hidden, intermediate, dtype_bytes, getattr(device, "weight_bytes", None),
                       calls)
    if memo is not None:
        memo[key] = out
    return out


@functools.lru_cache(maxsize=65536)
def _ffn_seconds(device, g, capacity, hidden, intermediate, dtype_bytes, weight_bytes, calls) -> float:
    """A device's modeled seconds for expert FFNs of this shape (pure: plans of a sweep ask for the same ones)."""
    return device.estimate(expert_ffn_cost(g, capacity, hidden, intermediate, dtype_bytes, calls=calls,
                                           weight_bytes=weight_bytes))


def npu_limit(platform, key: str) -> float | None:
    """A per-process limit of the platform's NPU (YAML npu.<key>), None where it states none."""
    entry = (getattr(platform, "params", {}) or {}).get("npu", {}).get(key)
    return None if not entry or entry.get("value") is None else float(entry["value"])


def program_budget(given, platform, residency: str, attention_graphs: int) -> tuple[int | None, dict]:
    """(resident expert groups allowed over all layers or None for no budget, the plan's `limits` entry saying
    why). `given`: the knob (None: the platform's default, "off", or a whole number)."""
    if given == PROGRAM_BUDGET_OFF:
        return None, {"npu_program_budget": PROGRAM_BUDGET_OFF, "why": "unbounded plan asked for (budget off)"}
    if given is not None:
        return int(given), {"npu_program_budget": int(given), "why": "given"}
    if platform is None or getattr(platform, "npu_shares_cpu", False) or residency == "all":
        return None, {}
    caps = {k: v for k in ("max_resident_programs", "max_compiles") if (v := npu_limit(platform, k)) is not None}
    if not caps:
        return None, {}
    key = min(caps, key=caps.get)
    budget = max(0, int(caps[key]) - int(attention_graphs))
    return budget, {"npu_program_budget": budget,
                    "why": f"{getattr(platform, 'name', platform)} {key} {caps[key]:g} less {attention_graphs} "
                           "NPU attention graphs"}


def fit_budget(groups, resident: list[bool], budget_bytes: int | None) -> list[bool]:
    """Keep the resident groups with the most expected tokens per byte that fit in budget_bytes."""
    if budget_bytes is None:
        return list(resident)
    if budget_bytes < 0:
        raise NpuMoeError(f"npu_memory_budget_bytes must be >= 0, got {budget_bytes}")
    order = sorted((i for i, r in enumerate(resident) if r),
                   key=lambda i: (-groups[i].expected_tokens / max(groups[i].weight_bytes, 1), groups[i].id))
    out, used = [False] * len(groups), 0
    for i in order:
        if used + groups[i].weight_bytes <= budget_bytes:
            out[i], used = True, used + groups[i].weight_bytes
    return out


def assign_residency(groups, mode: str = "threshold", hot_threshold: float | None = None, platform=None,
                     spec=None, npu_memory_budget_bytes: int | None = None, dtype_bytes: int = 2,
                     loads=None, counts=None, chunk: int | None = None, npu_weight_bytes: int | None = None,
                     makespan_model=None, estimates: dict | None = None) -> list[bool]:
    """One flag per group (True = resident on the NPU, False = runs on the CPU). `loads` (cost mode): expected
    tokens per chunk each group would take on the CPU (the routed load: the CPU path drops nothing); default
    each group's expected kept tokens. `counts` [E, chunks] and `chunk` (makespan mode): the calibration's routed
    counts per expert and chunk, and the chunk length; `makespan_model`: their makespan.LayerMakespan when the
    caller keeps it (build_plan: the program budget search reads the same one). `estimates` (cost mode): a dict
    of the platform's FFN estimates by shape that the caller keeps for this platform's devices (build_plan: across
    layers and plans); default one for this call."""
    if mode not in RESIDENCY_MODES:
        raise NpuMoeError(f"unknown residency mode {mode!r}; use one of: {', '.join(RESIDENCY_MODES)}")
    if mode == "makespan":
        if platform is None or spec is None or counts is None or chunk is None:
            raise NpuMoeError("residency 'makespan' needs a platform, the layer's MoELayerSpec, its calibration "
                              "counts [experts, chunks] and the chunk; use build_plan, or mode='threshold'")
        case = LayerCase([(g.experts, g.capacity) for g in groups], counts, spec.hidden, spec.intermediate,
                         spec.top_k, int(chunk), dtype_bytes, npu_weight_bytes)
        resident = choose_resident(case, platform, model=makespan_model)[0]
    elif mode == "all":
        resident = [True] * len(groups)
    elif mode == "threshold":
        if hot_threshold is None or hot_threshold < 0:
            raise NpuMoeError(f"residency 'threshold' needs hot_threshold >= 0 (expected tokens per chunk of a "
                              f"group), got {hot_threshold!r}")
        resident = [g.expected_tokens >= hot_threshold for g in groups]
    else:
        if platform is None or spec is None:
            raise NpuMoeError("residency 'cost' needs a platform (e.g. get_platform('m2-max')) and the layer's "
                              "MoELayerSpec; pass both or use mode='threshold'")
        if loads is not None and len(loads) != len(groups):
            raise NpuMoeError(f"residency 'cost' got {len(loads)} loads for {len(groups)} groups; pass one per group")
        resident, memo = [], ({} if estimates is None else estimates)
        for i, g in enumerate(groups):
            load = g.expected_tokens if loads is None else float(loads[i])
            npu, cpu = _group_times(g, platform, spec.hidden, spec.intermediate, dtype_bytes, load, memo)
            resident.append(load > 0 and npu < cpu)
    return fit_budget(groups, resident, npu_memory_budget_bytes)
