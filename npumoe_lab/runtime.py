"""Chunked prefill with the KV cache carried across chunks, every op timed (measured) or costed (modeled).

The `Clock` is handed to the experts executor and to forward hooks on attention, routers and shared experts;
each op becomes a timeline `Event` on a role ("npu" | "cpu"). On a measured platform (this host) durations
come from `time.perf_counter` around the real op; on a modeled platform the op still runs for real (so
accuracy is real) and its duration comes from the platform's cost model. Never both for one number.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from .devices.cost import attention_cost, dense_cost, expert_ffn_cost, memory_cost
from .engine import LayerStats, NullClock
from .errors import NpuMoeError
from .timeline import Event


@dataclass
class Clock:
    platform: object
    measured: bool
    attention_role: str = "cpu"
    dtype_bytes: int = 2                  # bytes per weight/activation element on the modeled device
    chunk: int = 0
    pad_mask: torch.Tensor | None = None
    events: list = field(default_factory=list)
    stats: list = field(default_factory=list)    # (chunk, layer, LayerStats)
    model_dims: dict = field(default_factory=dict)

    @property
    def source(self) -> str:
        return "measured" if self.measured else "modeled"

    def _add(self, name, role, layer, seconds, cost, deps):
        if deps is None:
            deps = (len(self.events) - 1,) if self.events else ()
        deps = tuple(d for d in deps if d is not None)
        self.events.append(Event(name=name, chunk=self.chunk, layer=layer, device=role, duration_s=float(seconds),
                                 flops=float(cost.flops) if cost else 0.0, bytes=float(cost.bytes) if cost else 0.0,
                                 timing_source=self.source, deps=deps, calls=int(cost.calls) if cost else 1))
        return len(self.events) - 1

    def op(self, name, role, layer, spec, fn, *args, deps=None):
        t0 = time.perf_counter()
        result = fn(*args)
        wall = time.perf_counter() - t0
        cost = self.cost(spec)
        seconds = wall if self.measured else self.platform.device(role).estimate(cost)
        return result, self._add(name, role, layer, seconds, cost, deps)

    def record(self, name, role, layer, wall, cost, deps=None):
        """An op timed elsewhere (hooks): measured wall time or the modeled cost."""
        seconds = wall if self.measured else self.platform.device(role).estimate(cost)
        return self._add(name, role, layer, seconds, cost, deps)

    def weight_bytes(self, role) -> int:
        """Stored weight element size on `role` (the platform's npu weight_bytes, e.g. 1 for int8), else dtype."""
        return getattr(self.platform.device(role), "weight_bytes", None) or self.dtype_bytes

    def layer_stats(self, layer, stats: LayerStats):
        self.stats.append((self.chunk, layer, stats))

    # OpCost of an executor op (flops and bytes of what really ran)
    def cost(self, spec):
        kind, b = spec[0], self.dtype_bytes
        H, I = self.model_dims.get("hidden", 0), self.model_dims.get("intermediate", 0)
        if kind == "sort":
            return memory_cost(spec[1] * 16, "dispatch")
        if kind == "pack":
            return memory_cost(2 * spec[1] * spec[2].shape[-1] * b, "pack")
        if kind == "scatter":
            d = spec[1]
            return memory_cost(2 * d.slot.numel() * H * b, "scatter")
        if kind == "ffn":
            gs, w = spec[1], spec[2]
            return expert_ffn_cost(len(gs.experts), gs.capacity, w.hidden, w.intermediate, dtype_bytes=b,
                                   weight_bytes=self.weight_bytes("npu" if gs.resident else "cpu"))
        if kind == "dynamic":
            mask, w = spec[1], spec[2]
            return _dynamic_cost(spec[3], mask, w, b)
        raise NpuMoeError(f"unknown op kind {kind!r}")


def _dynamic_cost(top_k_index, mask, w, b):
    """Experts at their actual loads, one call each (the CPU handles dynamic shapes)."""
    loads = mask.sum().item()
    n_exp = max(1, int(top_k_index[mask].unique().numel()))
    cost = expert_ffn_cost(1, max(1, int(loads)), w.hidden, w.intermediate, dtype_bytes=b, calls=n_exp)
    # weights of every expert touched are streamed once, not once for the whole slab
    return type(cost)(name="experts_dynamic", flops=cost.flops,
                      bytes=cost.bytes + (n_exp - 1) * 3 * w.hidden * w.intermediate * b, calls=n_exp)


class _Hooks:
    """Forward hooks timing attention, routers and shared experts of every decoder layer."""

    def __init__(self, model, clock: Clock, refs, measure_experts: bool):
        self.clock, self.handles, self._t0 = clock, [], {}
        cfg = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
        self.cfg = cfg
        layers = _decoder_layers(model)
        moe = {r.layer: r for r in refs}
        for i, layer in enumerate(layers):
            attn = getattr(layer, "self_attn", None) or getattr(layer, "attention", None)
            if attn is not None:
                self._wrap(attn, "attention", i, clock.attention_role, self._attn_cost)
            ref = moe.get(i)
            if ref is not None:
                self._wrap(ref.router, "router", i, "cpu", self._router_cost(ref))
                for name in ("shared_expert", "shared_experts"):
                    shared = getattr(ref.block, name, None)
                    if shared is not None:
                        self._wrap(shared, "shared_experts", i, clock.attention_role, self._dense_cost(shared))
                if measure_experts:
                    self._wrap(ref.experts, "experts", i, "cpu", self._hf_experts_cost(ref))

    def _wrap(self, module, name, layer, role, cost_fn):
        key = (name, layer)

        def pre(mod, args, kwargs):
            self._t0[key] = (time.perf_counter(), args, kwargs)

        def post(mod, args, kwargs, output):
            t0, a, kw = self._t0.pop(key)
            wall = time.perf_counter() - t0
            self.clock.record(name, role, layer, wall, cost_fn(a, kw))
        self.handles.append(module.register_forward_pre_hook(pre, with_kwargs=True))
        self.handles.append(module.register_forward_hook(post, with_kwargs=True))

    def _attn_cost(self, args, kwargs):
        c = self.cfg
        hidden = args[0] if args else kwargs["hidden_states"]
        T = hidden.shape[-2]
        past = self.clock.model_dims.get("past", 0)
        heads = c.num_attention_heads
        head_dim = getattr(c, "head_dim", None) or c.hidden_size // heads
        return attention_cost(T, past, c.hidden_size, heads, getattr(c, "num_key_value_heads", heads), head_dim,
                              dtype_bytes=self.clock.dtype_bytes,
                              weight_bytes=self.clock.weight_bytes(self.clock.attention_role))

    def _router_cost(self, ref):
        def cost(args, kwargs):
            x = args[0] if args else next(iter(kwargs.values()))
            rows = x.reshape(-1, x.shape[-1]).shape[0]
            n_exp = ref.experts.num_experts
            return dense_cost(rows, x.shape[-1], n_exp, dtype_bytes=self.clock.dtype_bytes)
        return cost

    def _dense_cost(self, module):
        n_params = sum(p.numel() for p in module.parameters())

        def cost(args, kwargs):
            x = args[0] if args else next(iter(kwargs.values()))
            rows = x.reshape(-1, x.shape[-1]).shape[0]
            c = dense_cost(rows, x.shape[-1], max(1, n_params // x.shape[-1]), dtype_bytes=self.clock.dtype_bytes,
                           weight_bytes=self.clock.weight_bytes(self.clock.attention_role))
            return c
        return cost

    def _hf_experts_cost(self, ref):
        from .models.weights import expert_weights
        w = expert_weights(ref.experts)

        def cost(args, kwargs):
            idx = args[1] if len(args) > 1 else kwargs["top_k_index"]
            return _dynamic_cost(idx, torch.ones_like(idx, dtype=torch.bool), w, self.clock.dtype_bytes)
        return cost

    def remove(self):
        for h in self.handles:
            h.remove()


def _decoder_layers(model):
    inner = getattr(model, "model", model)
    layers = getattr(inner, "layers", None)
    if layers is None:
        raise NpuMoeError(f"{type(model).__name__}: cannot find the decoder layers (model.model.layers)")
    return layers


def _record_rest(clock: Clock, model, chunk_wall: float, first_event: int, last: bool):
    """Embeddings, norms, residual adds and the LM head: what no hook saw. Measured: the chunk's wall time
    not covered by events; modeled: the LM head for the last token of the prompt (all TTFT needs)."""
    cfg = model.config
    if clock.measured:
        seen = sum(e.duration_s for e in clock.events[first_event:])
        wall, cost = max(0.0, chunk_wall - seen), None
    else:
        wall = 0.0
        cost = dense_cost(1, cfg.hidden_size, cfg.vocab_size, dtype_bytes=clock.dtype_bytes) if last else \
            memory_cost(2 * cfg.hidden_size * clock.dtype_bytes, "norms")
    clock.record("other", "cpu", -1, wall, cost)


@dataclass
class PrefillResult:
    logits: torch.Tensor          # [1, T, V] real positions only
    past_key_values: object       # HF cache holding exactly the real tokens
    events: list                  # timeline Events (unscheduled)
    stats: list                   # (chunk, layer, LayerStats)
    wall_s: float                 # measured wall time of the whole prefill on this host


@torch.no_grad()
def chunked_prefill(model, input_ids: torch.Tensor, chunk: int, clock: Clock | None = None,
                    measure_hf_experts: bool = False, pad_token_id: int = 0) -> PrefillResult:
    """Prefill `input_ids` [1, T] in static chunks of `chunk` tokens, padding the last chunk.

    Padding tokens sit after every real token (so causal attention keeps real tokens' results exact), are
    masked out of expert capacity by the executor, and are cropped from the KV cache afterwards.
    """
    from transformers import DynamicCache

    from .models import find_moe_blocks
    if input_ids.dim() != 2 or input_ids.shape[0] != 1:
        raise NpuMoeError(f"prefill takes input_ids of shape [1, T]; got {tuple(input_ids.shape)}")
    T = input_ids.shape[1]
    if T == 0:
        raise NpuMoeError("the prompt is empty: give at least one token")
    ctx = getattr(model.config, "max_position_embeddings", None)
    if ctx is not None and T > ctx:
        raise NpuMoeError(f"the prompt has {T} tokens but the model's context is {ctx}; shorten the prompt "
                          "or choose a smaller --prompt-len")
    if chunk < 1:
        raise NpuMoeError(f"chunk must be >= 1; got {chunk}")
    refs = find_moe_blocks(model)
    hooks = _Hooks(model, clock, refs, measure_hf_experts) if clock is not None else None
    if clock is not None and refs:
        w0 = refs[0].experts
        clock.model_dims.update(hidden=model.config.hidden_size,
                                intermediate=getattr(w0, "intermediate_dim", None) or w0.down_proj.shape[-1])
    attachment = getattr(model, "_npumoe", None)
    executor = getattr(attachment, "executor", None) if attachment is not None else None
    previous_clock = getattr(executor, "clock", None)
    cache, logits = DynamicCache(config=model.config), []
    t_start = time.perf_counter()
    try:
        for c, s in enumerate(range(0, T, chunk)):
            ids = input_ids[:, s:s + chunk]
            n_real = ids.shape[1]
            pad = chunk - n_real                         # the static graphs take exactly `chunk` tokens
            if pad:
                ids = torch.cat([ids, ids.new_full((1, pad), pad_token_id)], 1)
            op_clock = clock if clock is not None else NullClock()   # carries chunk index and pad mask
            op_clock.chunk = c
            op_clock.pad_mask = (torch.arange(ids.shape[1]) >= n_real) if pad else None
            if clock is not None:
                clock.model_dims["past"] = s
            if executor is not None and hasattr(executor, "clock"):
                executor.clock = op_clock
            n_events, t_chunk = len(clock.events) if clock else 0, time.perf_counter()
            out = model(input_ids=ids, cache=cache, use_cache=True)
            cache = out.cache
            if clock is not None:
                _record_rest(clock, model, time.perf_counter() - t_chunk, n_events, last=s + chunk >= T)
            logits.append(out.logits[:, :n_real].float())
            if bool(torch.isnan(logits[-1]).any()):
                raise NpuMoeError(f"NaN in the logits of prefill chunk {c}; check the model weights/dtype")
            if pad:
                cache.crop(-pad)
    finally:
        if hooks is not None:
            hooks.remove()
        if executor is not None and hasattr(executor, "clock") and previous_clock is not None:
            executor.clock = previous_clock
    wall = time.perf_counter() - t_start
    return PrefillResult(torch.cat(logits, 1), cache, clock.events if clock else [],
                         clock.stats if clock else [], wall)
