"""Decode steps from routing alone: the per-op replay and the same ops as an array stream (a test holds them equal).

A step is one forward (decode_policy.py): under `pipeline` the prefill chunk's static shapes with one real token, else
one token at the policy's layout. `replay_decode` records each step with the engine (`replay.replay_forward`, the
executor swapped for the policy's as a real decode swaps it); `decode_stream` builds the same ops with
`stream.build_stream` (the steps as chunks of the step length) and then sets what differs from a prefill chunk: the
attention over the grown context (past = prompt + tokens decoded before) and the LM head on every step. A simulation
samples one token per step (`decode_routing`: the routing source drawn with its own seed, so the prompt's routing is
unchanged); the padding rows of a `pipeline` step route as its real token (they take no capacity; HF's own experts
touch the same experts).
"""
from __future__ import annotations

import copy
import dataclasses

import numpy as np

from npumoe_lab.errors import NpuMoeError
from npumoe_lab.execution.decode_policy import check_decode, decode_layout, step_context, step_length
from npumoe_lab.execution.timeline import combined_source, schedule
from npumoe_lab.sim.array_replay import summarize_stream
from npumoe_lab.sim.pricing import INTERVAL
from npumoe_lab.sim.stream import CHAIN, CPU, KIND, RoutingCounts, StreamExecutor, _attention_row, _cost_row, \
    build_stream

DECODE_SEED = 7_000_003          # offset of the decode steps' routing draws from the prompt's


def decode_executor(executor, policy: str):
    """The executor a decode step runs under `policy`, of the same kind as `executor` (StreamExecutor on the array
    path, PlanExecutor on the per-op one; None: HF's experts). Built once per executor and policy."""
    if executor is None:
        return None
    target = decode_layout(executor.layout, policy, 1)
    if target is executor.layout:
        return executor
    cache = executor.__dict__.setdefault("_decode_executors", {})
    if policy not in cache:
        cold = "dynamic" if policy == "cpu" else executor.cold
        if isinstance(executor, StreamExecutor):
            cache[policy] = StreamExecutor(target, spill=executor.spill, cold=cold)
        else:
            from npumoe_lab.execution.engine import PlanExecutor     # lazy: torch, for the per-op replay only
            cache[policy] = PlanExecutor(target, [], spill=executor.spill, cold=cold)
    return cache[policy]


def decode_routing(src, specs, n_tokens: int, seed: int) -> list:
    """[step] -> {layer: (top_k_index [1, K], weights [1, K], norms [1])}: one token per step from the source."""
    if not n_tokens:
        return []
    # kept on the source for its next calls (a sweep's cells reuse one parsed source: the same steps every cell);
    # every caller reads them only (step_counts, replay_decode)
    kept = src.__dict__.setdefault("_decode_steps", {}) if hasattr(src, "__dict__") else {}
    key = (tuple((s.layer, s.n_experts, s.top_k) for s in specs), n_tokens, seed)
    if key not in kept:
        if len(kept) >= 16:
            kept.clear()
        kept[key] = _decode_routing(src, specs, n_tokens, seed)
    return kept[key]


def _decode_routing(src, specs, n_tokens: int, seed: int) -> list:
    if hasattr(src, "_sampled") and hasattr(src, "_gini"):
        # a view of the source with its own memo of draws: the prefill's draws and routing_gini stay as they were
        src = copy.copy(src)
        src._sampled, src._gini = {}, {}
    steps = src.chunks(specs, n_tokens, 1, seed + DECODE_SEED)[:n_tokens]
    return [{layer: tuple(None if x is None else x[:1] for x in r) for layer, r in step.items()} for step in steps]


def _rows(step: dict, layer: int, length: int):
    """A step's routing at the step's static length: recorded rows as they are, sampled ones repeated."""
    idx, w, norms = step[layer]
    if idx.shape[0] >= length:
        return idx, w, norms
    rep = length // idx.shape[0]
    return (np.repeat(np.asarray(idx), rep, 0), np.repeat(np.asarray(w), rep, 0),
            None if norms is None else np.repeat(np.asarray(norms), rep, 0))


def replay_decode(geometry, executor, config, steps: list, prompt_len: int, policy: str, also_on=()) -> list:
    """Per config (config, *also_on): (clock after the steps, decode summary) of len(steps) decode steps."""
    from npumoe_lab.execution.decode import decode_summary      # lazy: torch, for the per-op replay only
    from npumoe_lab.sim.replay import replay_forward         # lazy: torch (replay.py), for the per-op replay only
    check_decode(len(steps), policy)
    dec, clock = decode_executor(executor, policy), config.clock()
    L = step_length(policy, config.chunk)
    for i, step in enumerate(steps):
        ctx = step_context(policy, i, prompt_len, config.chunk, clock, numerics=False,
                           dtype_bytes=config.dtype_bytes, npu_weight_bytes=config.npu_weight_bytes)
        routed = {layer: _rows(step, layer, L) for layer in step}
        replay_forward(geometry, dec, ctx, routed, config.attention, last=True)
    out = []
    for cfg in (config, *also_on):
        c = clock if cfg is config else clock.repriced(cfg.platform)
        events = schedule(c.events, cfg.platform.npu_shares_cpu)
        out.append((c, decode_summary(events, cfg.platform, len(steps), c.stats)))
    return out


def step_counts(steps: list, specs, policy: str, chunk: int) -> RoutingCounts:
    """Per-(step, MoE layer) expert counts: `real` from each step's real token (row 0), `touched` over its rows at
    the step's static length (sampled rows repeated: the same experts)."""
    layers = tuple(s.layer for s in specs)
    E, K, N = max(s.n_experts for s in specs), specs[0].top_k, len(steps)
    L = step_length(policy, chunk)
    idx = np.stack([np.stack([np.asarray(step[layer][0]) for layer in layers]) for step in steps]).astype(np.int64)
    base = (np.arange(N)[:, None] * len(layers) + np.arange(len(layers))[None, :])[:, :, None] * E
    real = np.bincount((idx[:, :, 0] + base).reshape(-1), minlength=N * len(layers) * E).reshape(N, len(layers), E)
    rows = idx[:, :, :L].reshape(N, len(layers), -1) + base
    touched = (np.bincount(rows.reshape(-1), minlength=N * len(layers) * E).reshape(N, len(layers), E) > 0).sum(2)
    return RoutingCounts(layers, real, touched, L, N * L, K)


def decode_stream(geometry, executor, counts: RoutingCounts, prompt_len: int, chunk: int, policy: str, *,
                  attention: str = "npu", dtype_bytes: int = 2, npu_weight_bytes: int | None = None):
    """The op stream `replay_decode` records for steps counted as `counts` (step_counts), as arrays."""
    dec = decode_executor(executor, policy)
    stream = _steps_stream(geometry, dec, counts, attention, dtype_bytes, npu_weight_bytes)
    cols, N = stream.cols, counts.n_chunks
    step = cols["chunk"].copy()
    att, rest = cols["kind"] == KIND["attention"], cols["kind"] == KIND["other"]
    per_step = []
    for i in range(N):          # attention over the grown context: its cost is the same in every layer of a step
        ctx = step_context(policy, i, prompt_len, chunk, None, numerics=False, dtype_bytes=dtype_bytes,
                           npu_weight_bytes=npu_weight_bytes)
        per_step.append(_attention_row(geometry, ctx, 0, attention))
    for col in per_step[0]:
        if col != "layer":
            cols[col][att] = np.array([r[col] for r in per_step], dtype=cols[col].dtype)[step[att]]
    head = geometry.rest_op(ctx, last=True, measured=False).cost
    for col, v in _cost_row("other", CPU, -1, head, CHAIN, geometry.hidden * geometry.vocab * dtype_bytes).items():
        cols[col][rest] = v
    cols["chunk"] = step + -(-prompt_len // chunk)
    stream.n_tokens = N
    return stream


def _steps_stream(geometry, dec, counts, attention, dtype_bytes, npu_weight_bytes):
    """build_stream of the steps, a fresh copy each call (decode_stream then sets what the prompt changes): the
    steps' stream is kept on the decode executor per counts object, so a grid's prompt lengths build it once."""
    build = lambda: build_stream(geometry, dec, counts, attention=attention, dtype_bytes=dtype_bytes,  # noqa: E731
                                 npu_weight_bytes=npu_weight_bytes)
    if dec is None:
        return build()
    kept = dec.__dict__.setdefault("_steps_streams", {})
    key = (id(counts), geometry, attention, dtype_bytes, npu_weight_bytes)
    hit = kept.get(key)
    if hit is None or hit[0] is not counts:          # the entry holds the counts: its id is not reused meanwhile
        if len(kept) >= 8:
            kept.clear()
        hit = kept[key] = (counts, build())
    base = hit[1]
    return dataclasses.replace(base, cols={k: v.copy() for k, v in base.cols.items()}, _cache={})


def stream_decode_summary(stream, platform) -> dict:
    """execution.decode.decode_summary of a decode stream (array path), point parameters."""
    s = summarize_stream(stream, platform)
    return dict(decode_s=s["ttft_s"], decode_energy_j=s["energy_j"], decode_cpu_cycles=s["cpu_cycles"],
                decode_drop_rate=stream.drop_rate, decode_timing_source=s["timing_source"],
                decode_energy_source=s["energy_source"], decode_cycles_source=s["cycles_source"])


def e2e_columns(prefill: dict, decode: dict, n_tokens: int, policy: str, prefill_draws: dict | None = None,
                decode_draws: dict | None = None) -> dict:
    """The end-to-end columns of a row (prefill summary + decode summary), each with its provenance, and with both
    parts' metrics under the same parameter draws their 90 % interval (`_lo` / `_hi`). energy_per_token_mj keeps its
    meaning (prefill energy per prompt token); energy_e2e_mj is the whole request's energy."""
    if not n_tokens:
        raise NpuMoeError("e2e columns need decode_tokens >= 1 (0: the prefill-only row, no decode columns)")
    d_s = decode["decode_s"]
    out = dict(decode_tokens=n_tokens, decode_policy=policy, tpot_s=d_s / n_tokens, e2e_s=prefill["ttft_s"] + d_s,
               energy_e2e_mj=(prefill["energy_j"] + decode["decode_energy_j"]) * 1e3,
               cpu_cycles_e2e=prefill["cpu_cycles"] + decode["decode_cpu_cycles"],
               decode_drop_rate=decode["decode_drop_rate"],
               tpot_source=decode["decode_timing_source"],
               e2e_source=combined_source([prefill["timing_source"], decode["decode_timing_source"]]),
               energy_e2e_source=combined_source([prefill["energy_source"], decode["decode_energy_source"]]),
               cycles_e2e_source=combined_source([prefill["cycles_source"], decode["decode_cycles_source"]]))
    per = e2e_draws(prefill_draws, decode_draws, n_tokens)
    return {**out, **(e2e_interval([per]) if per is not None else {})}


E2E_METRICS = ("tpot_s", "e2e_s", "energy_e2e_mj", "cpu_cycles_e2e")


def e2e_draws(prefill_draws: dict | None, decode_draws: dict | None, n_tokens: int) -> dict | None:
    """{e2e metric: (D,) array}: each draw's prefill plus the same draw's decode (None without both)."""
    if prefill_draws is None or decode_draws is None:
        return None
    return dict(tpot_s=decode_draws["ttft_s"] / n_tokens, e2e_s=prefill_draws["ttft_s"] + decode_draws["ttft_s"],
                energy_e2e_mj=(prefill_draws["energy_j"] + decode_draws["energy_j"]) * 1e3,
                cpu_cycles_e2e=prefill_draws["cpu_cycles"] + decode_draws["cpu_cycles"])


def e2e_interval(per_sample: list) -> dict:
    """`{metric}_lo` / `_hi` of the e2e metrics: the 90 % interval of the samples' mean, draw by draw ({} when a
    sample has no draws)."""
    if not per_sample or any(m is None for m in per_sample):
        return {}
    out = {}
    for k in E2E_METRICS:
        lo, hi = np.percentile(np.mean([m[k] for m in per_sample], axis=0), INTERVAL)
        out[f"{k}_lo"], out[f"{k}_hi"] = float(lo), float(hi)
    return out


__all__ = ["DECODE_SEED", "decode_executor", "decode_routing", "replay_decode", "step_counts", "decode_stream",
           "stream_decode_summary", "e2e_columns", "e2e_draws", "e2e_interval", "E2E_METRICS"]
