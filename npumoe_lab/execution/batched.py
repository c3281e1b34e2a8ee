"""B equally long prompts prefilled together, each with exactly the unbatched path's outcome.

`batched_prefill(model, input_ids [B, T], config)` returns one `PrefillResult` per sequence, equal to what
`run_prefill` gives that sequence alone: the same logits, KV cache, drop / pad counts and op stream (so the same
modeled TTFT). The model's dense parts (embeddings, attention, norms, routers, LM head) run once over the batch; the
attached plan executor runs every sequence on its own (`ops.BatchChunkContext`): each sequence's chunk has its own
capacities, drops and padding, dispatched into its own group slots and timed on its own clock, never pooled.
Shared ops (attention, routers, the rest of the chunk) are recorded into every sequence's clock: on a modeled
platform their cost depends only on the chunk's shape, which all B share. A measured platform is refused: one
wall time of a batch is not B sequences' wall times.

Equality holds where the dense kernels give each row of a batch the bits they give it alone (row-wise GEMMs,
per-row norms, per-(batch, head) attention): tests/test_batched_prefill.py holds logits, caches, counts and op
streams equal to the unbatched path on the tiny model.
"""
from __future__ import annotations

import time

import torch
from transformers import DynamicCache

from npumoe_lab.errors import NpuMoeError
from npumoe_lab.execution.clock import NullClock
from npumoe_lab.execution.config import PrefillConfig, check_context
from npumoe_lab.execution.geometry import ModelGeometry
from npumoe_lab.execution.head import FinalHidden, keep_positions
from npumoe_lab.execution.ops import BatchChunkContext, chunk_scope
from npumoe_lab.execution.runtime import PrefillResult, _Hooks, _record_rest, attached_layout, finish
from npumoe_lab.models import find_moe_blocks


class FanoutClock:
    """What the B sequences of a batch share (hook ops, modeled): recorded into each sequence's clock."""
    measured = False

    def __init__(self, clocks):
        self.clocks = list(clocks)

    def record(self, op, wall, deps=None):
        for c in self.clocks:
            c.record(op, wall, deps)

    def run(self, op, fn, *args, deps=None):
        result = fn(*args) if fn is not None else None
        self.record(op, 0.0, deps)
        return result, None

    def layer_stats(self, chunk, layer, stats):
        raise NpuMoeError("a batch's layer counts belong to its sequences: run the experts through a "
                          "BatchChunkContext (the plan executor does)")


def split_cache(cache, model, b: int) -> DynamicCache:
    """Sequence b's own [1, ...] cache out of a batch's (copied: its later crops and appends are its own)."""
    own = DynamicCache(config=model.config)
    for i, layer in enumerate(cache.layers):
        own.update(layer.keys[b:b + 1].clone(), layer.values[b:b + 1].clone(), i)
    return own


@torch.no_grad()
def batched_prefill(model, input_ids: torch.Tensor, config: PrefillConfig, keep_logits: bool = True
                    ) -> list[PrefillResult]:
    """[B, T] prompts (all T real tokens) -> B PrefillResults, each as `run_prefill` gives it (module docstring).
    The model must have a plan executor attached (`attach(model, plan)`): HF's own experts pool a batch's tokens."""
    if not isinstance(config, PrefillConfig):
        config = PrefillConfig.untimed(config)
    if input_ids.dim() != 2 or input_ids.shape[0] < 1 or input_ids.shape[1] < 1:
        raise NpuMoeError(f"batched prefill takes input_ids [B, T] with B, T >= 1; got {tuple(input_ids.shape)}")
    if config.measured:
        raise NpuMoeError(f"platform {config.platform.name} is measured: a batch's wall time is not its sequences' "
                          "times; prefill one prompt at a time (run_prefill) to measure")
    layout = attached_layout(model)
    if layout is None:
        raise NpuMoeError("batched prefill needs a plan executor attached (npumoe_lab.attach(model, plan)); HF's "
                          "own experts pool the batch's tokens per expert, so a sequence would not run as alone")
    if getattr(model._npumoe.executor, "monitor", None) is not None:
        raise NpuMoeError("the attached executor has a drift monitor, which observes one prompt's chunks in order; "
                          "prefill one prompt at a time (run_prefill) to monitor drift")
    layout.check_chunk(config.chunk)
    B, T = input_ids.shape
    chunk = config.chunk
    check_context(getattr(model.config, "max_position_embeddings", None), T)
    timed = config.platform is not None
    clocks = [config.clock() if timed else NullClock() for _ in range(B)]
    fan = FanoutClock(clocks)
    geometry = ModelGeometry.from_config(model.config) if timed else None
    hooks = _Hooks(model, geometry, fan, find_moe_blocks(model), False, config.attention) if timed else None
    device = next(model.parameters()).device
    cache, logits, final = DynamicCache(config=model.config), [], FinalHidden(model)
    t_start = time.perf_counter()
    try:
        for c, s in enumerate(range(0, T, chunk)):
            ids = input_ids[:, s:s + chunk].to(device)
            n_real, last = ids.shape[1], s + chunk >= T
            pad = chunk - n_real                         # the static graphs take exactly `chunk` tokens
            if pad:
                ids = torch.cat([ids, ids.new_full((B, pad), config.pad_token_id)], 1)
            base = config.chunk_context(c, n_real, fan)
            ctx = BatchChunkContext(**{k: getattr(base, k) for k in base.__dataclass_fields__}, clocks=tuple(clocks))
            if hooks is not None:
                hooks.ctx = ctx
            with chunk_scope(ctx):      # as chunked_prefill: the last position's logits only (head.py)
                out = model(input_ids=ids, cache=cache, use_cache=True,
                            logits_to_keep=keep_positions(n_real, last, device))
            cache = out.cache
            if timed:
                for clk, sub in zip(clocks, ctx.sequences()):
                    _record_rest(clk, geometry, sub, 0.0, len(clk.events), last=last)
            scored = final.scoring_logits(model, out, c, n_real, keep_logits)
            if scored is not None:
                logits.append(scored.float())
            if pad:
                cache.crop(-pad)
    finally:
        final.remove()
        if hooks is not None:
            hooks.remove()
    wall = time.perf_counter() - t_start
    full = torch.cat(logits, 1) if keep_logits else None
    results = []
    for b, clk in enumerate(clocks):
        res = PrefillResult(full[b:b + 1] if keep_logits else None, split_cache(cache, model, b),
                            getattr(clk, "events", []), getattr(clk, "stats", []), wall, ops=getattr(clk, "ops", []))
        results.append(finish(res, config, n_tokens=T) if timed else res)
    return results


__all__ = ["batched_prefill", "FanoutClock", "split_cache"]
