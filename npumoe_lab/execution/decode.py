"""Greedy decode after a chunked prefill, on the same engine: every step's ops timed (measured) or costed (modeled).

`run_decode(model, prefill, config, n_tokens, policy)` continues a `runtime.chunked_prefill` result: the first token is
the argmax of the prefill's last logits, then `n_tokens` steps each forward the previous token with the KV cache
through the attached plan under the decode policy (decode_policy.py: the executor swapped for the policy's, the step
padded to the prefill chunk under `pipeline`). The same forward hooks as the prefill turn attention, routers and
shared experts into Ops; the executor records its groups and per-step drop accounting. The decode gets its own clock
and timeline, so the prefill's rows stay exactly what they were. `greedy_generate` is the untimed loop (batches with
a left-padded attention mask too), held equal to HF's `generate(do_sample=False)` by the tests.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch
from transformers import DynamicCache

from npumoe_lab.errors import NpuMoeError
from npumoe_lab.execution.decode_policy import check_decode, decode_layout, step_context
from npumoe_lab.execution.experts import set_executor
from npumoe_lab.execution.geometry import ModelGeometry
from npumoe_lab.execution.head import keep_positions
from npumoe_lab.execution.ops import chunk_scope
from npumoe_lab.execution.runtime import (PrefillConfig, _Hooks, _record_rest, attached_layout, check_context,
                                          drop_pad_rates)
from npumoe_lab.execution.timeline import schedule, summarize
from npumoe_lab.models import find_moe_blocks


@dataclass
class DecodeResult:
    tokens: torch.Tensor              # [1, N + 1]: the prefill's token, then one per decode step
    events: list                      # the decode's timeline Events (scheduled)
    stats: list                       # (step index, layer, LayerStats): drop accounting per step
    ops: list                         # the clock's (Op, deps, wall) records
    wall_s: float
    policy: str
    summary: dict = field(default_factory=dict)


def _decode_executor(model, policy: str, rows: int):
    """The executor a decode step runs (None: keep the attached one / HF's experts)."""
    layout = attached_layout(model)
    target = decode_layout(layout, policy, rows)
    if target is None or target is layout:
        return None
    ex = model._npumoe.executor
    return ex.sibling(target, spill=ex.spill, cold="dynamic" if policy == "cpu" else ex.cold, npu_dtype=ex.npu_dtype,
                      npu_backend=ex.npu_backend, cpu_kernel=ex.cpu_kernel, pad_rows=ex.pad_rows, seed=ex.seed,
                      saliency=ex.saliency if policy != "cpu" else None, renormalize=ex.renormalize)


def _step_forward(model, token, cache, length: int, pad_token_id: int):
    """One decode step: `token` [1, 1], padded after to `length` (pads cropped from the cache); logits [1, V]
    of the token alone (the padded rows are never projected: head.py)."""
    pad = length - token.shape[1]
    ids = torch.cat([token, token.new_full((1, pad), pad_token_id)], 1) if pad else token
    out = model(input_ids=ids, cache=cache, use_cache=True, logits_to_keep=keep_positions(1, True, ids.device))
    cache = out.cache
    if pad:
        cache.crop(-pad)
    return out.logits[:, 0].float(), cache


@torch.no_grad()
def run_decode(model, prefill, config: PrefillConfig, n_tokens: int, policy: str = "pipeline",
               measure_hf_experts: bool | None = None) -> DecodeResult:
    """`n_tokens` greedy steps after `prefill` (a PrefillResult with logits and cache) under `policy`, timed on
    `config.platform` with its own clock; the prefill's cache is cropped back to the prompt afterwards; `result.summary`: decode_s (the steps' makespan), energy_j, cpu_cycles,
    drop_rate over the steps' routed assignments, ..."""
    check_decode(n_tokens, policy)
    if prefill.logits is None or prefill.past_key_values is None:
        raise NpuMoeError("decoding needs the prefill's logits and cache: prefill with keep_logits=True")
    T = prefill.logits.shape[1]
    check_context(getattr(model.config, "max_position_embeddings", None), T + n_tokens,
                  "the prompt plus its decode tokens")
    if measure_hf_experts is None:
        measure_hf_experts = getattr(model, "_npumoe", None) is None
    token = prefill.logits[:, -1].argmax(-1, keepdim=True).to(torch.long)
    tokens, cache = [token], prefill.past_key_values
    clock = config.clock()
    geometry = ModelGeometry.from_config(model.config)
    hooks = _Hooks(model, geometry, clock, find_moe_blocks(model), measure_hf_experts, config.attention)
    device = next(model.parameters()).device
    swap = _decode_executor(model, policy, 1)
    previous = set_executor(model, swap) if swap is not None else None
    t_start = time.perf_counter()
    try:
        for i in range(n_tokens):
            ctx = step_context(policy, i, T, config.chunk, clock, dtype_bytes=config.dtype_bytes,
                               npu_weight_bytes=config.npu_weight_bytes)
            hooks.ctx = ctx
            n_events, t0 = len(clock.events), time.perf_counter()
            with chunk_scope(ctx):
                logits, cache = _step_forward(model, token.to(device), cache, ctx.length, config.pad_token_id)
            _record_rest(clock, geometry, ctx, time.perf_counter() - t0, n_events, last=True)
            if bool(torch.isnan(logits).any()):
                raise NpuMoeError(f"NaN in the logits of decode step {i}; check the model weights/dtype")
            token = logits.argmax(-1, keepdim=True).to(torch.long).cpu()
            tokens.append(token)
    finally:
        hooks.remove()
        if previous is not None:
            set_executor(model, previous)
        extra = cache.get_seq_length() - T      # the prefill's cache as it was (scoring reads it after the decode)
        if extra > 0:
            cache.crop(-extra)
    wall = time.perf_counter() - t_start
    res = DecodeResult(torch.cat(tokens, 1), schedule(clock.events, config.platform.npu_shares_cpu), clock.stats,
                       clock.ops, wall, policy)
    res.summary = decode_summary(res.events, config.platform, n_tokens, res.stats, wall)
    return res


def decode_summary(events, platform, n_tokens: int, stats, wall_s: float = 0.0) -> dict:
    """What a decode adds to a row: decode_s, its energy, cycles and sources, drop rate over the steps."""
    if not n_tokens:
        return dict(decode_s=0.0, decode_energy_j=0.0, decode_cpu_cycles=0.0, decode_drop_rate=0.0)
    s = summarize(events, platform, n_tokens=n_tokens)
    drop, _ = drop_pad_rates(stats)
    return dict(decode_s=s["ttft_s"], decode_energy_j=s["energy_j"], decode_cpu_cycles=s["cpu_cycles"],
                decode_drop_rate=drop, decode_timing_source=s["timing_source"],
                decode_energy_source=s["energy_source"], decode_cycles_source=s["cycles_source"],
                decode_host_wall_s=wall_s)


@torch.no_grad()
def greedy_generate(model, input_ids: torch.Tensor, n_new: int, attention_mask: torch.Tensor | None = None):
    """Untimed greedy generation of `n_new` tokens ([B, n_new]) with the KV cache: one full forward of the
    (left-padded) prompt, then one token per step; positions follow the attention mask as HF's generate sets them."""
    check_decode(n_new, "pipeline")
    B, T = input_ids.shape
    mask = torch.ones_like(input_ids) if attention_mask is None else attention_mask.to(input_ids.dtype)
    check_context(getattr(model.config, "max_position_embeddings", None), T + n_new,
                  "the prompt plus its decode tokens")
    cache, ids, out_tokens = DynamicCache(config=model.config), input_ids, []
    for _ in range(n_new):
        pos = (mask.cumsum(-1) - 1).clamp(min=0)[:, -ids.shape[1]:]
        out = model(input_ids=ids, attention_mask=mask, position_ids=pos, cache=cache, use_cache=True)
        cache = out.cache
        token = out.logits[:, -1].float().argmax(-1, keepdim=True)
        out_tokens.append(token)
        ids, mask = token, torch.cat([mask, mask.new_ones((B, 1))], 1)
    return torch.cat(out_tokens, 1) if out_tokens else input_ids.new_zeros((B, 0))




def reprice_decode(ops, stats, config: PrefillConfig, geometry: ModelGeometry, n_tokens: int):
    """(decode_summary, the repriced ops) of a decode's recorded ops priced on `config`'s modeled platform (no forward): the LM head of
    every step costed as a modeled run costs it (a measured run records it as leftover wall time)."""
    clock = config.clock()
    if config.measured:
        raise NpuMoeError("reprice_decode prices ops on a modeled platform; a measured one needs its own forward")
    for op, deps, wall in ops:
        if op.kind == "other":
            ctx = config.chunk_context(op.chunk, config.chunk, clock)
            op = geometry.rest_op(ctx, last=True, measured=False)
        clock.record(op, wall, deps)
    return decode_summary(schedule(clock.events, config.platform.npu_shares_cpu), config.platform, n_tokens, stats), \
        clock.ops


__all__ = ["DecodeResult", "run_decode", "decode_summary", "greedy_generate", "reprice_decode"]
