"""A prefill replayed from routing alone: the same engine, no tensors.

For each chunk and decoder layer the replay emits what a real forward's hooks and experts executor emit, in the same
order: attention, [shared experts first where the family runs them first], router, the experts (HF's own as one op,
or the plan executor's dispatch / pack / group calls / cold / spill / scatter from `PlanExecutor.execute` with
`numerics=False`), [shared experts], then the rest of the chunk. Costs come from the same `ModelGeometry` and engine
code as a real run, so a replay of a real run's recorded routing gives its modeled timeline exactly (a test).
"""
from __future__ import annotations

import math

import torch

from npumoe_lab.execution.engine import PlanExecutor, dynamic_experts_cost
from npumoe_lab.errors import NpuMoeError
from npumoe_lab.execution.geometry import ModelGeometry
from npumoe_lab.execution.ops import Op
from npumoe_lab.execution.runtime import PrefillConfig, PrefillResult, finish


def replay_prefill(geometry: ModelGeometry, executor: PlanExecutor | None, config: PrefillConfig, routing: list,
                   prompt_len: int, also_on=()) -> list[PrefillResult]:
    """Timeline + summary of a prefill of `prompt_len` tokens whose chunk c routes as `routing[c]` ({layer:
    (top_k_index, top_k_weights, norms)}). `executor=None`: HF's own experts (the reference variant). `also_on`:
    more configs (other modeled platforms, same plan and NPU weight size) pricing the same op stream. One result
    per config."""
    if config.measured:
        raise NpuMoeError(f"platform {config.platform.name!r} is measured: a simulation has no numerics to time; "
                          "use a modeled platform (see `npumoe-lab platforms`)")
    n_chunks = math.ceil(prompt_len / config.chunk)
    if len(routing) < n_chunks:
        raise NpuMoeError(f"the routing covers {len(routing)} chunks but a prompt of {prompt_len} tokens in chunks "
                          f"of {config.chunk} needs {n_chunks}")
    clock = config.clock()
    for c in range(n_chunks):
        s = c * config.chunk
        ctx = config.chunk_context(c, min(config.chunk, prompt_len - s), clock, numerics=False)
        replay_forward(geometry, executor, ctx, routing[c], config.attention, last=s + config.chunk >= prompt_len)
    out = []
    for cfg in (config, *also_on):
        c = clock if cfg is config else clock.repriced(cfg.platform)
        out.append(finish(PrefillResult(None, None, c.events, c.stats, 0.0, ops=c.ops), cfg, n_tokens=prompt_len))
    return out


def replay_forward(geometry: ModelGeometry, executor, ctx, routed: dict, role: str, last: bool) -> None:
    """The ops of one forward (a prefill chunk or a decode step) routed as `routed` ({layer: (top_k_index,
    top_k_weights, norms)}), recorded on `ctx.clock` in the order a real forward's hooks and executor record them."""
    clock, moe, c = ctx.clock, geometry.moe_layers, ctx.index
    for layer in range(geometry.n_layers):
        clock.record(geometry.attention_op(layer, ctx, role), 0.0)
        spec = moe.get(layer)
        if spec is None:
            continue
        shared = spec.n_shared_experts > 0
        if shared and geometry.shared_first:
            clock.record(geometry.shared_op(layer, ctx, role), 0.0)
        clock.record(geometry.router_op(layer, ctx), 0.0)
        # the engine's numerics take tensors; sampled routing is NumPy (as_tensor shares its memory)
        idx, w, norms = (None if x is None else torch.as_tensor(x) for x in routed[layer])
        if executor is None:
            cost = dynamic_experts_cost(idx, torch.ones_like(idx, dtype=torch.bool), spec.hidden,
                                        spec.intermediate, ctx.dtype_bytes)
            clock.record(Op("experts", "experts_hf", "cpu", layer, c, cost), 0.0)
        else:
            executor.execute(layer, None, idx, w, ctx, norms=norms)
        if shared and not geometry.shared_first:
            clock.record(geometry.shared_op(layer, ctx, role), 0.0)
    clock.record(geometry.rest_op(ctx, last=last, measured=False), 0.0)
