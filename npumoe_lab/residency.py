"""Load-aware graph residency (PAPER.md 3.4): which expert groups keep a compiled graph on the NPU.

Modes (`RESIDENCY_MODES`):
- `threshold`: a group is resident when its expected kept tokens per chunk >= `hot_threshold` (the knob the
  ablation sweeps).
- `cost`: a group is resident when one NPU call over its static [G, C, hidden] buffer (the platform's estimate
  includes dispatch + sync per call) is faster than the CPU doing the same experts over the tokens it expects,
  not the padded capacity. A group expecting no tokens stays on the CPU.
- `all`: every group is resident (npumoe-base/-t/-tg, naive-npu).
In every mode the resident set is then fitted into `npu_memory_budget_bytes` (when given) greedily by expected
tokens per weight byte: a group that does not fit is skipped and smaller ones are still tried.
"""
from __future__ import annotations

import math

from .devices.cost import expert_ffn_cost
from .errors import NpuMoeError

RESIDENCY_MODES = ("threshold", "cost", "all")


def group_times(group, platform, hidden: int, intermediate: int, dtype_bytes: int = 2) -> tuple[float, float]:
    """(modeled NPU seconds for one call over the padded group, modeled CPU seconds for its expected tokens)."""
    g = len(group.experts)
    npu = platform.npu.estimate(expert_ffn_cost(g, int(group.capacity), hidden, intermediate, dtype_bytes))
    if group.expected_tokens <= 0:
        return npu, 0.0
    # the CPU runs the same weights over expected_tokens rows in all: G experts x ceil(tokens / G) rows each
    per_expert = max(1, math.ceil(group.expected_tokens / g))
    cpu = platform.cpu.estimate(expert_ffn_cost(g, per_expert, hidden, intermediate, dtype_bytes))
    return npu, cpu


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
                     spec=None, npu_memory_budget_bytes: int | None = None, dtype_bytes: int = 2) -> list[bool]:
    """One flag per group (True = resident on the NPU, False = runs on the CPU)."""
    if mode not in RESIDENCY_MODES:
        raise NpuMoeError(f"unknown residency mode {mode!r}; use one of: {', '.join(RESIDENCY_MODES)}")
    if mode == "all":
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
        resident = []
        for g in groups:
            npu, cpu = group_times(g, platform, spec.hidden, spec.intermediate, dtype_bytes)
            resident.append(g.expected_tokens > 0 and npu < cpu)
    return fit_budget(groups, resident, npu_memory_budget_bytes)
