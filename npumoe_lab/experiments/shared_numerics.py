"""One forward per numerics: a modeled platform's timeline priced from the op records of a run with the same numerics.

A modeled platform runs the real forward only for its numerics (logits, scores, drop counts); its time comes from
each op's cost, which every TimelineClock records before pricing it (`clock.ops`, `PrefillResult.ops`). So when a
variant computes the same numbers on two platforms - HF's experts and the dynamic dropless path never depend on the
platform; plan variants do when plan, NPU precision and padding mode are the same - the second platform's timeline
is priced from the first run's op records (`remodel`, as `TimelineClock.repriced` does for a simulation) and its
scores are reused, instead of a second forward. A measured platform always runs its own forward (its time is the
forward's), but reuses the scores.
"""
from __future__ import annotations

from dataclasses import dataclass

from npumoe_lab.execution.clock import TimelineClock
from npumoe_lab.execution.geometry import ModelGeometry
from npumoe_lab.execution.engine import as_layout
from npumoe_lab.execution.runtime import PrefillConfig, PrefillResult, finish


def numerics_key(variant, plan, config: PrefillConfig) -> tuple:
    """What decides a variant's numbers (and its ops' costs) on a platform: equal keys, equal logits and ops."""
    costs = (config.dtype_bytes, config.npu_weight_bytes)       # element sizes the recorded op costs used
    if variant.experts == "hf":                       # no NPU precision, no static shapes: platform-independent
        return (variant.name, variant.attention) + costs
    if variant.experts == "dynamic" or all_cold(plan):
        # every expert on the dynamic dropless CPU path (the runner's executors run cold experts dynamically): a
        # plan whose residency kept no group on the NPU has no static group, so no capacity, overflow, saliency or
        # NPU precision takes effect, and it computes and records exactly what the dynamic variant with the same
        # attention placement does (npumoe on a platform whose cost rule keeps every group on the CPU = anemll)
        return ("dynamic", variant.attention) + costs
    # plan variants: the plan, the NPU's precision, and the padding mode (computed only when measured)
    return (variant.name, getattr(plan, "hash", None), str(config.npu_dtype), config.measured, variant.spill) + costs


def all_cold(plan) -> bool:
    """True for a plan (or ExecutionLayout) whose every group of every layer is non-resident (the layout holds each
    expert in exactly one group: layout.LayerLayout checks it)."""
    if plan is None:
        return False
    return all(not g.resident for lay in as_layout(plan).layers for g in lay.groups)


@dataclass
class Numerics:
    """What one forward produced, per sample: its op records and its scores (reused by equal-numerics runs)."""
    platform: str         # the platform whose run computed them
    ops: list             # (Op, deps, wall) as its clock recorded them
    stats: list           # (chunk, layer, LayerStats)
    wall_s: float
    score: dict
    agreement: dict


def remodel(source: Numerics, config: PrefillConfig, geometry: ModelGeometry, n_tokens: int) -> PrefillResult:
    """The timeline `config`'s modeled platform gives the ops of `source` (no forward): each op priced by the
    platform's device model; the rest of each chunk, which a measured run records as leftover wall time, costed as
    a modeled run costs it (geometry.rest_op). Scheduled and summarised like any prefill (runtime.finish)."""
    clock = TimelineClock(config.platform, measured=False, stats=source.stats)
    last = max((op.chunk for op, _, _ in source.ops), default=0)
    for op, deps, wall in source.ops:
        if op.kind == "other":
            ctx = config.chunk_context(op.chunk, config.chunk, clock)
            op = geometry.rest_op(ctx, op.chunk == last, measured=False)
        clock.record(op, wall, deps)
    res = PrefillResult(logits=None, past_key_values=None, events=clock.events, stats=source.stats,
                        wall_s=source.wall_s, ops=clock.ops)
    return finish(res, config, n_tokens)


__all__ = ["numerics_key", "all_cold", "Numerics", "remodel"]
