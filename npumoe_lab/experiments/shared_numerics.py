"""One forward per numerics: a modeled platform's timeline from the op records of a run with the same numerics.

A modeled platform runs the real forward only for its numerics (logits, scores, drop counts); its time comes from
each op's cost (FLOPs, bytes, calls), which every clock records whatever its mode (clock.TimelineClock). So when a
variant computes the same numbers on two platforms - HF's experts and the dynamic dropless path never depend on the
platform; plan variants do when plan, NPU precision and padding mode are the same - the second platform's timeline
is derived from the first run's records (`remodel`) and its scores are reused, instead of a second forward.
A measured platform always runs its own forward (its time is the forward's), but reuses the scores.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from ..devices.cost import OpCost
from ..geometry import ModelGeometry
from ..ops import ChunkContext
from ..runtime import PrefillConfig, PrefillResult, finish


def numerics_key(variant, plan, config: PrefillConfig) -> tuple:
    """What decides a variant's numbers on a platform: equal keys compute equal logits."""
    if variant.experts in ("hf", "dynamic"):          # no NPU precision, no static shapes: platform-independent
        return (variant.name, variant.attention)
    # plan variants: the plan, the NPU's precision, and the padding mode (computed only when measured)
    return (variant.name, getattr(plan, "hash", None), str(config.npu_dtype), config.measured, variant.spill)


@dataclass
class Numerics:
    """What one forward produced, per sample: its op records and its scores (reused by equal-numerics runs)."""
    platform: str         # the platform whose run computed them
    events: list          # scheduled Events of the run
    stats: list           # (chunk, layer, LayerStats)
    wall_s: float
    score: dict
    agreement: dict


def remodel(source: Numerics, config: PrefillConfig, geometry: ModelGeometry, n_tokens: int) -> PrefillResult:
    """The timeline `config`'s modeled platform gives the ops of `source` (no forward): each op's cost through the
    platform's device model; the rest of each chunk (measured as leftover wall time) costed as a modeled run
    costs it (geometry.rest_op). Scheduled and summarised like any prefill (runtime.finish)."""
    last = max((e.chunk for e in source.events), default=0)
    events = []
    for e in source.events:
        if e.name == "other":
            ctx = ChunkContext(index=e.chunk, past=0, n_real=config.chunk, length=config.chunk, clock=None,
                               dtype_bytes=config.dtype_bytes)
            cost = geometry.rest_op(ctx, e.chunk == last, measured=False).cost
        else:
            cost = OpCost(e.name, e.flops, e.bytes, max(1, e.calls))
        seconds = config.platform.device(e.device).estimate(cost)
        events.append(replace(e, duration_s=float(seconds), flops=float(cost.flops), bytes=float(cost.bytes),
                              timing_source="modeled", start_s=None, cpu_s=None))
    res = PrefillResult(logits=None, past_key_values=None, events=events, stats=source.stats, wall_s=source.wall_s)
    return finish(res, config, n_tokens)


__all__ = ["numerics_key", "Numerics", "remodel"]
