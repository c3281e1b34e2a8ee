"""Chunked prefill with the KV cache carried across chunks, every op timed (measured) or costed (modeled).

One path: `run_prefill(model, input_ids, PrefillConfig)` = clock -> `chunked_prefill` -> schedule -> summarise; the
API (`npumoe_lab.prefill`), the runner, the notebooks and bench all go through it. Forward hooks on attention,
routers and shared experts turn those modules into `ops.Op` records (costs from `geometry.ModelGeometry`, the same
code a routing-only simulation uses); the experts executor emits its own through the chunk's `ChunkContext`. On a
measured platform (this host) durations come from `time.perf_counter` around the real op; on a modeled one the op
still runs for real (so accuracy is real) and its duration comes from the platform's cost model. Never both for one
number.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch
from transformers import DynamicCache

from npumoe_lab.core.host_memory import keep_freed_memory
from npumoe_lab.execution.clock import NullClock
# the checks and PrefillConfig live in config.py (no torch: a simulation imports them); named here as before
from npumoe_lab.execution.config import (ATTENTION_ROLES, PrefillConfig, check_chunk, check_context,  # noqa: F401
                                         check_lengths)
from npumoe_lab.execution.engine import dynamic_experts_cost
from npumoe_lab.errors import NpuMoeError
from npumoe_lab.execution.geometry import ModelGeometry
from npumoe_lab.execution.head import FinalHidden, keep_positions
from npumoe_lab.models import find_moe_blocks
from npumoe_lab.execution.ops import ChunkContext, Op, chunk_scope
from npumoe_lab.execution.timeline import schedule, summarize

class _Hooks:
    """Forward hooks turning attention, routers and shared experts of every decoder layer into Ops."""

    def __init__(self, model, geometry: ModelGeometry, clock, refs, measure_experts: bool, attention_role: str):
        self.clock, self.geometry, self.role, self.handles, self._t0 = clock, geometry, attention_role, [], {}
        self.ctx: ChunkContext | None = None
        moe = {r.layer: r for r in refs}
        for i, layer in enumerate(_decoder_layers(model)):
            attn = getattr(layer, "self_attn", None) or getattr(layer, "attention", None)
            if attn is not None:
                self._wrap(attn, i, lambda i=i: geometry.attention_op(i, self.ctx, self.role))
            ref = moe.get(i)
            if ref is None:
                continue
            self._wrap(ref.router, i, lambda i=i: geometry.router_op(i, self.ctx))
            for name in ("shared_expert", "shared_experts"):
                if getattr(ref.block, name, None) is not None:
                    self._wrap(getattr(ref.block, name), i, lambda i=i: geometry.shared_op(i, self.ctx, self.role))
            if measure_experts:
                self._wrap(ref.experts, i, self._hf_experts_op(i), with_args=True)

    def _wrap(self, module, layer, make_op, with_args=False):
        key = id(module)

        def pre(mod, args, kwargs):
            self._t0[key] = (time.perf_counter(), args, kwargs)

        def post(mod, args, kwargs, output):
            t0, a, kw = self._t0.pop(key)
            wall = time.perf_counter() - t0
            self.clock.record(make_op(a, kw) if with_args else make_op(), wall)
        self.handles.append(module.register_forward_pre_hook(pre, with_kwargs=True))
        self.handles.append(module.register_forward_hook(post, with_kwargs=True))

    def _hf_experts_op(self, layer):
        """HF's own experts (the reference variant): every assignment at its expert's actual load, on the CPU."""
        spec = self.geometry.moe_layers[layer]

        def make(args, kwargs):
            idx = args[1] if len(args) > 1 else kwargs["top_k_index"]
            cost = dynamic_experts_cost(idx, torch.ones_like(idx, dtype=torch.bool), spec.hidden, spec.intermediate,
                                        self.ctx.dtype_bytes)
            return Op("experts", "experts_hf", "cpu", layer, self.ctx.index, cost)
        return make

    def remove(self):
        for h in self.handles:
            h.remove()


def _decoder_layers(model):
    inner = getattr(model, "model", model)
    layers = getattr(inner, "layers", None)
    if layers is None:
        raise NpuMoeError(f"{type(model).__name__}: cannot find the decoder layers (model.model.layers)")
    return layers


@dataclass
class PrefillResult:
    logits: torch.Tensor | None   # [1, T, V] real positions only, computed untimed (None with keep_logits=False)
    past_key_values: object       # HF cache holding exactly the real tokens
    events: list                  # timeline Events (scheduled by run_prefill)
    stats: list                   # (chunk, layer, LayerStats)
    wall_s: float                 # measured wall time of the whole prefill on this host (scoring logits excluded)
    summary: dict = field(default_factory=dict)
    ops: list = field(default_factory=list)   # the clock's (Op, deps, wall) records: the timeline before pricing


def drop_pad_rates(stats) -> tuple[float, float]:
    """(dropped / routed assignments, padded / computed static slots) over a prefill's LayerStats."""
    routed = sum(s.routed for _, _, s in stats)
    dropped = sum(s.dropped for _, _, s in stats)
    slots = sum(s.slots for _, _, s in stats)
    padded = sum(s.padded for _, _, s in stats)
    return (dropped / routed if routed else 0.0), (padded / slots if slots else 0.0)


def attached_layout(model):
    """The ExecutionLayout of the attached plan executor, or None (dropless / HF experts)."""
    executor = getattr(getattr(model, "_npumoe", None), "executor", None)
    return getattr(executor, "layout", None)


@torch.no_grad()
def chunked_prefill(model, input_ids: torch.Tensor, config: PrefillConfig | int, clock=None,
                    measure_hf_experts: bool = False, on_chunk=None, keep_logits: bool = True) -> PrefillResult:
    """Prefill `input_ids` [1, T] in static chunks of `config.chunk` tokens, padding the last chunk (with
    `config.pad_token_id`); `config` an int: an untimed prefill in chunks of that size (PrefillConfig.untimed).

    Padding tokens sit after every real token (so causal attention keeps real tokens' results exact), are
    masked out of expert capacity by the executor, and are cropped from the KV cache afterwards. `clock`: a
    TimelineClock (None: untimed). `on_chunk(index)` runs after each chunk (calibration reads its routing there).
    The timed forward projects the prompt's last position only (what the first token needs); `keep_logits`
    computes every position's logits after each chunk's time is taken (execution/head.py).
    """
    if not isinstance(config, PrefillConfig):
        config = PrefillConfig.untimed(config)
    chunk = config.chunk
    if input_ids.dim() != 2 or input_ids.shape[0] != 1:
        raise NpuMoeError(f"prefill takes input_ids of shape [1, T]; got {tuple(input_ids.shape)}")
    T = input_ids.shape[1]
    if T == 0:
        raise NpuMoeError("the prompt is empty: give at least one token")
    check_context(getattr(model.config, "max_position_embeddings", None), T)
    layout = attached_layout(model)
    if layout is not None:
        layout.check_chunk(chunk)
    timed = clock is not None
    keep_freed_memory()             # no page faults for freed blocks, timed or not (core/host_memory.py)
    clock = clock if timed else NullClock()
    geometry = ModelGeometry.from_config(model.config) if timed else None
    hooks = _Hooks(model, geometry, clock, find_moe_blocks(model), measure_hf_experts, config.attention) \
        if timed else None
    device = next(model.parameters()).device
    cache, logits, final = DynamicCache(config=model.config), None, FinalHidden(model)
    t_start, untimed = time.perf_counter(), 0.0
    try:
        for c, s in enumerate(range(0, T, chunk)):
            ids = input_ids[:, s:s + chunk].to(device)
            n_real, last = ids.shape[1], s + chunk >= T
            pad = chunk - n_real                         # the static graphs take exactly `chunk` tokens
            if pad:
                ids = torch.cat([ids, ids.new_full((1, pad), config.pad_token_id)], 1)
            ctx = config.chunk_context(c, n_real, clock)
            if hooks is not None:
                hooks.ctx = ctx
            n_events, t_chunk = len(getattr(clock, "events", ())), time.perf_counter()
            with chunk_scope(ctx):      # the first token needs the last position's logits only (head.py)
                out = model(input_ids=ids, cache=cache, use_cache=True,
                            logits_to_keep=keep_positions(n_real, last, device))
            cache = out.cache
            if timed:
                _record_rest(clock, geometry, ctx, time.perf_counter() - t_chunk, n_events, last=last)
            t_untimed = time.perf_counter()
            scored = final.scoring_logits(model, out, c, n_real, keep_logits)
            if scored is not None:  # written into one [1, T, V] tensor: a list and its cat would hold the logits twice
                if logits is None:
                    logits = scored.new_empty((1, T, scored.shape[-1]), dtype=torch.float32)
                logits[:, s:s + n_real] = scored
            untimed += time.perf_counter() - t_untimed
            if pad:
                cache.crop(-pad)
            if on_chunk is not None:
                on_chunk(c)
    finally:
        final.remove()
        if hooks is not None:
            hooks.remove()
    wall = time.perf_counter() - t_start - untimed      # the scoring logits are not part of the prefill's time
    return PrefillResult(logits, cache, getattr(clock, "events", []),
                         getattr(clock, "stats", []), wall, ops=getattr(clock, "ops", []))


def _record_rest(clock, geometry: ModelGeometry, ctx: ChunkContext, chunk_wall: float, first_event: int,
                 last: bool):
    """The rest of the chunk (geometry.rest_op): measured = the chunk's wall time not covered by events."""
    wall = max(0.0, chunk_wall - sum(e.duration_s for e in clock.events[first_event:])) if clock.measured else 0.0
    clock.record(geometry.rest_op(ctx, last, clock.measured), wall)


def finish(result: PrefillResult, config: PrefillConfig, n_tokens: int) -> PrefillResult:
    """Schedule the events on the platform and summarise them (TTFT, energy, cycles, drop and pad rates)."""
    result.events = schedule(result.events, npu_shares_cpu=config.platform.npu_shares_cpu)
    drop, pad = drop_pad_rates(result.stats)
    result.summary = dict(summarize(result.events, config.platform, n_tokens=n_tokens), drop_rate=drop,
                          pad_rate=pad, host_wall_s=result.wall_s)
    return result


def run_prefill(model, input_ids, config: PrefillConfig, measure_hf_experts: bool | None = None) -> PrefillResult:
    """The single timed prefill path: clock -> chunked prefill -> schedule -> summary (`result.summary`).
    `measure_hf_experts` (default: when the model is not attached) records HF's own experts as one op per layer."""
    ids = torch.as_tensor(input_ids).reshape(1, -1)
    if measure_hf_experts is None:
        measure_hf_experts = getattr(model, "_npumoe", None) is None
    res = chunked_prefill(model, ids, config, config.clock(), measure_hf_experts=measure_hf_experts)
    return finish(res, config, n_tokens=ids.shape[1])


__all__ = ["PrefillConfig", "PrefillResult", "run_prefill", "chunked_prefill", "finish", "check_context", "check_chunk",
           "drop_pad_rates", "attached_layout"]
