"""Executes a plan inside HF's forward: routing -> saliency pruning -> pack groups -> NPU/CPU -> scatter.

`PlanExecutor` is what `attach(model, plan)` installs as the experts executor of every MoE layer. It consumes the
plan's `ExecutionLayout` (layout.py), keeps each group's pre-stacked weights (what a compiled static graph holds),
and per call: scores assignments, packs each resident group's [G, C, H] buffer, runs cold experts on the CPU role
(dynamic, dropless by default), optionally spills overflow to the CPU (`npumoe-spill`), and scatters back.
Every op is an `ops.Op` record handed to the chunk's clock (`ChunkContext.clock`). With `ctx.numerics=False`
(simulation) the same records come out of the same code from routing alone: no tensor is computed.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass, field, replace

import torch

from npumoe_lab.execution.clock import NullClock
from npumoe_lab.core.cpu_ffn import PackedExperts, resolve_kernel
from npumoe_lab.devices.cost import expert_ffn_cost, memory_cost
from npumoe_lab.errors import NpuMoeError
from npumoe_lab.planning.layout import ExecutionLayout
from npumoe_lab.core.numerics import EmulatedFp16Weights, emulated_group_ffn, emulated_split_ffn, npu_layer_weights
from npumoe_lab.core.numerics import select as select_npu
from npumoe_lab.execution.ops import BatchChunkContext, ChunkContext, Op, current_chunk
from npumoe_lab.core.packing import (Layout, Workspace, group_ffn, group_ffn_into, pack,
                      plan_dispatch, run_groups, scatter)
from npumoe_lab.core.saliency import check_rule, saliency_scores
from npumoe_lab.core.weight_cache import prepared

COLD_MODES = ("dynamic", "static")
PAD_MODES = ("auto", "compute", "skip")
NORM_RULES = ("activation_norm", "weight_x_norm")     # saliency rules that read the hidden states' norms
# Skipping padding, a bmm group whose trimmed rows (G x its fullest expert's fill) exceed its filled rows by this
# factor or more runs expert by expert on each one's filled rows instead: an expert that overflows fills its whole
# capacity, so one full expert made the group's bmm compute G x C rows (the tiny model's accuracy curve: 2-3x its
# filled rows). A deterministic function of the routing, so a batch and its sequences alone choose alike; 0: never.
PER_EXPERT_SPLIT = 1.6
# ... except groups whose weights are in another dtype than the activations (the NPU's fp16 on a CPU with a native
# fp16 GEMM): one small fp16 `mm` per expert costs more than the rows it saves (docs/PERFORMANCE.md, 2026-12-07).
SPLIT_CAST_GROUPS = False


@dataclass
class LayerStats:
    """Counts for one MoE layer call (one chunk): the drop/pad accounting of the static path."""
    routed: int = 0      # real assignments routed
    dropped: int = 0     # assignments that contributed nothing
    spilled: int = 0     # overflow computed on the CPU instead of dropped
    slots: int = 0       # static slots computed (resident + static cold groups)
    padded: int = 0      # of which zero padding
    npu_calls: int = 0


def as_layout(plan) -> ExecutionLayout:
    """A Plan (compiled here) or an ExecutionLayout; anything else is an error (no plan-shaped dicts)."""
    if isinstance(plan, ExecutionLayout):
        return plan
    if hasattr(plan, "compile"):
        return plan.compile()
    raise NpuMoeError(f"expected a Plan or an ExecutionLayout, got {type(plan).__name__}; build one with "
                      "npumoe_lab.build_plan(...) or ExecutionLayout.dropless(describe(model))")


@dataclass
class PlanExecutor:
    plan: object                         # Plan or ExecutionLayout (compiled once into `self.layout`)
    handles: list                        # experts.LayerHandle per MoE layer (empty for routing-only simulation)
    saliency: str | None = None          # None: the plan's rule
    renormalize: bool | None = None      # None: the plan's setting
    spill: bool = False                  # overflow -> CPU (dropless) instead of dropped
    cold: str = "dynamic"                # cold experts on the CPU at actual load, or at their static capacity
    npu_dtype: torch.dtype | None = None  # e.g. torch.float16 where the modeled NPU computes fp16
    seed: int = 0
    npu_backend: object = None           # resident groups: None/"torch" (in process) | "onnxruntime" | "coreml"
    cpu_kernel: str = "auto"             # in-process experts: "onednn" (pre-packed, per expert) | "torch" (bmm per
                                         # group) | "auto" (onednn for experts of >= cpu_ffn.MIN_PACKED_ELEMS)
    # In-process static groups: "compute" every static slot (the graph's shape), "skip" the zero padding rows
    # (same outputs: rows are independent and padding is never read back), "auto": compute only when the clock
    # measures wall time (a measured static graph costs its padding); untimed and modeled runs skip it (the
    # modeled cost is the static shape's either way).
    pad_rows: str = "auto"
    monitor: object = None               # drift.DriftMonitor: observes each (chunk, layer); may hand a rebuilt plan
    layout: ExecutionLayout = field(init=False)

    def __post_init__(self):
        if self.cold not in COLD_MODES:
            raise NpuMoeError(f"cold={self.cold!r} is not a cold-expert mode; use one of {COLD_MODES}")
        if self.pad_rows not in PAD_MODES:
            raise NpuMoeError(f"pad_rows={self.pad_rows!r} is not a padding mode; use one of {PAD_MODES}")
        self.layout = as_layout(self.plan)
        self.saliency = check_rule(self.saliency or self.layout.saliency)
        if self.renormalize is None:
            self.renormalize = self.layout.renormalize
        for h in self.handles:
            self.layout.layer(h.layer)      # every MoE layer of the model has an entry, else a clear error
        self._static = {}   # layer -> (Layout, cold expert mask)
        self._weights = {}  # layer -> per group: stacked weights, a backend handle, or None (= per expert)
        self._experts = {}  # layer -> PackedExperts (every expert; in-process groups, cold and spilled experts)
        self._split = {}    # (layer, group index) -> that group's weights one expert each (views)
        if self.npu_backend == "torch":
            self.npu_backend = None
        elif isinstance(self.npu_backend, str):   # an external static-graph runtime plays the NPU
            from npumoe_lab.backends import get_npu_backend   # lazy: pulls in the graph builders (onnx, coremltools)
            self.npu_backend = get_npu_backend(self.npu_backend)
        # packed/out/gather buffers reused across calls and layers (no page faults); like the packed weights they
        # belong to the model, so a re-attach reuses them: fresh ones cost ~0.1 s of page faults per prefill at
        # Qwen3-30B-A3B geometry (190 MB of zero-filled pages, bench/RESULTS.md)
        self._work = prepared(self.handles[0].module, ("workspace",), Workspace) if self.handles else Workspace()

    # -- static part, built once per layer: the "compiled graphs" -----------------------------------------
    def static_layout(self, layer: int):
        """(packing Layout over the static groups, [E] bool mask of dynamic cold experts) of one layer."""
        if layer not in self._static:
            lay = self.layout.layer(layer)
            cold = torch.zeros(lay.n_experts, dtype=torch.bool)
            for g in lay.groups:
                if not g.resident:
                    cold[list(g.experts)] = True
            # the layout's own groups, placed as they are; dynamic cold experts get no static slot
            static = [g for g in lay.groups if g.resident or self.cold == "static"]
            self._static[layer] = (Layout.from_groups(lay.n_experts, static), cold)
        return self._static[layer]

    def _compiled(self, handle):
        """(Layout, cold mask, per-group weights) of a layer with real weights."""
        layout, cold = self.static_layout(handle.layer)
        if handle.layer not in self._weights:
            weights, wdtype = [], handle.weights.gate_up.dtype
            for gs in layout.groups:
                # selected only where a group holds its own stacked copy (a non-contiguous selection is a copy)
                if gs.resident and self.npu_backend is not None:
                    w = self.npu_backend.compile(handle.layer, gs.id, gs.capacity,
                                                 handle.weights.select(gs.experts).contiguous())
                elif gs.resident and self.npu_dtype not in (None, wdtype):
                    # the NPU's own precision, one bmm per group on the layer's copy prepared once per model
                    # (numerics.py: fp16 = fp32 GEMMs on fp16-rounded values where the CPU has no fp16 GEMM)
                    w = select_npu(npu_layer_weights(handle.module, handle.weights, self.npu_dtype), gs.experts)
                elif self._per_expert(handle.weights):
                    w = None                              # per expert on the layer's PackedExperts
                else:   # in process: materialised once, bmm-friendly
                    w = _bmm_weights(handle.weights.select(gs.experts))
                weights.append(w)
            self._weights[handle.layer] = weights
        return layout, cold, self._weights[handle.layer]

    def _per_expert(self, weights) -> bool:
        """Expert by expert on pre-packed weights (oneDNN) rather than one bmm per group."""
        return resolve_kernel(self.cpu_kernel, weights.gate_up.dtype, weights.gate_up.device,
                              weights.hidden * weights.intermediate) == "onednn"

    def sibling(self, plan=None, **options) -> "PlanExecutor":
        """A new executor over the same layers (this plan, or `plan`; `options` as for PlanExecutor, not inherited)
        that shares this one's packed expert weights when its kernel is the same: compare settings side by side
        without a second copy of the weights in memory."""
        other = PlanExecutor(self.plan if plan is None else plan, self.handles, **options)
        if other.cpu_kernel == self.cpu_kernel:
            other._experts = self._experts      # per layer, independent of plan and padding options
        return other

    def replan(self, plan) -> None:
        """Run `plan` from the next call on (a recalibration); the packed expert weights are kept."""
        self.plan, self.layout = plan, as_layout(plan)
        self._static.clear()
        self._weights.clear()
        self._split.clear()

    def packed_experts(self, handle) -> PackedExperts:
        if handle.layer not in self._experts:   # packed once per model and weight version (weight_cache.py)
            w = handle.weights
            kernel = resolve_kernel(self.cpu_kernel, w.gate_up.dtype, w.gate_up.device, w.hidden * w.intermediate)
            self._experts[handle.layer] = prepared(handle.module, ("packed", kernel),
                                                   lambda: PackedExperts(w, kernel))
        return self._experts[handle.layer]

    def prepare(self) -> "PlanExecutor":
        """Build every layer's group weights and pack every expert now (attach calls this), not at the first call."""
        for handle in self.handles:
            self._compiled(handle)
            if self._per_expert(handle.weights):
                self.packed_experts(handle).pack_all()
        return self

    def _skip_padding(self, ctx: ChunkContext) -> bool:
        if self.pad_rows == "auto":
            return not ctx.clock.measured
        return self.pad_rows == "skip"

    # -- per call --------------------------------------------------------------------------------------------
    def __call__(self, handle, hidden, top_k_index, top_k_weights):
        """HF's experts forward (through experts.py): the current chunk's context, or an untimed one."""
        ctx = current_chunk()
        if isinstance(ctx, BatchChunkContext):   # B sequences: each one exactly as the unbatched path runs it
            L, y = ctx.length, torch.empty_like(hidden)
            for b, sub in enumerate(ctx.sequences()):
                rows = slice(b * L, (b + 1) * L)
                y[rows] = self.execute(handle.layer, hidden[rows], top_k_index[rows], top_k_weights[rows], sub,
                                       handle=handle)      # copied at once: execute may return a reused buffer
            return y
        if ctx is None:
            T = hidden.shape[0]
            ctx = ChunkContext(index=0, past=0, n_real=T, length=T, clock=NullClock())
        return self.execute(handle.layer, hidden, top_k_index, top_k_weights, ctx, handle=handle)

    def execute(self, layer: int, hidden, top_k_index, top_k_weights, ctx: ChunkContext, handle=None, norms=None):
        """One MoE layer over one chunk. `hidden` [T, H] and `handle` (real weights) when `ctx.numerics`; in a
        routing-only replay both are None and `norms` [T] stands in for the hidden states' norms."""
        clock, K, num = ctx.clock, top_k_index.shape[1], ctx.numerics
        if self.monitor is not None and (rebuilt := self.monitor.pending_plan()) is not None:
            self.replan(rebuilt)           # handed over after a chunk's last layer: adopted at a chunk boundary
        lay = self.layout.layer(layer)
        if num:
            layout, cold, gweights = self._compiled(handle)
            # one reduction pass; the exact (slower) NaN test only when the sum is not finite
            if not bool(torch.isfinite(hidden.sum())) and bool(torch.isnan(hidden).any()):
                raise NpuMoeError(f"NaN in the hidden states entering MoE layer {layer} at prefill chunk "
                                  f"{ctx.index}; check the model weights/dtype (fp16 overflow?) and the input")
        else:
            (layout, cold), gweights = self.static_layout(layer), None
        H, I, b = lay.hidden, lay.intermediate, ctx.dtype_bytes

        def op(name, kind, role, cost, shape=()):
            return Op(name, kind, role, layer, ctx.index, cost, shape)

        active = torch.ones_like(top_k_index, dtype=torch.bool)
        pad_mask = ctx.pad_mask
        if pad_mask is not None:          # padding tokens of the last chunk never take capacity
            active &= ~pad_mask.view(-1, 1)
        cold_assign = cold[top_k_index] & active if self.cold == "dynamic" else torch.zeros_like(active)
        static_assign = active & ~cold_assign
        stats = LayerStats(routed=int(active.sum()))

        def route():
            # an fp32 copy of the hidden states costs a full pass: only the norm-based rules need it
            n = norms
            if n is None and num and self.saliency in NORM_RULES:
                n = hidden.float().norm(dim=-1)
            scores = saliency_scores(self.saliency, top_k_weights, n, seed=self.seed + 7919 * layer)
            return plan_dispatch(top_k_index, _masked(top_k_weights, static_assign), layout, scores=scores,
                                 renormalize=self.renormalize, active=static_assign)[0]
        n_assign = top_k_index.numel()
        # routing decides every count below: it runs in a replay too
        dispatch, ev_pack = clock.run(op("dispatch", "dispatch", "cpu", memory_cost(n_assign * 16, "dispatch"),
                                         (n_assign,)), route)
        R = layout.total_rows
        skip = self._skip_padding(ctx)
        # modeled cost: the static buffer's, padding included; skipping padding, its rows are not zeroed (nothing
        # computed from them is read: a group's bmm may run over some, into outputs that are never scattered)
        packed, ev_pack = clock.run(op("pack", "pack", "cpu", memory_cost(2 * R * H * b, "pack"), (R, H)),
                                    pack if num else None, hidden,
                                    dispatch, self._work.get("packed", (R, H), hidden.dtype, hidden.device)
                                    if num else None, not skip, deps=(ev_pack,))
        out = self._work.get("out", (R, H), hidden.dtype, hidden.device) if num else None
        group_events = []
        fill = torch.minimum(dispatch.load.cpu(), layout.capacity).tolist() if skip else None
        for j, gs in enumerate(layout.groups):
            G = len(gs.experts)
            role = "npu" if gs.resident else "cpu"
            record = op(f"group{gs.id}", "expert_group", role,
                        _group_cost(G, gs.capacity, H, I, b, ctx.weight_bytes(role)), (G, gs.capacity, H, I))
            fn, args = (self._group_call(handle, j, gs, gweights[j], packed, out, fill) if num else (None, ()))
            _, ev = clock.run(record, fn, *args, deps=(ev_pack,))
            group_events.append(ev)
            stats.npu_calls += int(gs.resident)
        stats.slots, stats.padded = layout.total_rows, dispatch.n_padded
        overflow = static_assign & ~dispatch.kept.view(-1, K)
        extra = [(cold_assign, "cold")] + ([(overflow, "spill")] if self.spill else [])
        parts = []
        for mask, name in extra:
            if bool(mask.any()):
                record = op(name, "experts_dynamic", "cpu", dynamic_experts_cost(top_k_index, mask, H, I, b))
                args = ()
                if num:
                    experts = (self.packed_experts(handle) if self._per_expert(handle.weights) else handle.weights)
                    args = (experts, hidden, top_k_index, top_k_weights, mask, self.renormalize)
                y, ev = clock.run(record, _dynamic_experts if num else None, *args, deps=(ev_pack,))
                parts.append(y)
                group_events.append(ev)
        n_over = int(overflow.sum())
        stats.spilled = n_over if self.spill else 0
        stats.dropped = n_over - stats.spilled
        S = dispatch.slot.numel()
        scatter_args = (out, dispatch, parts, self._work.get("gather", (S, H), hidden.dtype, hidden.device)) \
            if num else ()
        y, _ = clock.run(op("scatter", "scatter", "cpu", memory_cost(2 * S * H * b, "scatter"), (S, H)),
                         _combine if num else None, *scatter_args, deps=tuple(group_events) or (ev_pack,))
        clock.layer_stats(ctx.index, layer, stats)
        if self.monitor is not None:
            self.monitor.observe(ctx.index, layer, torch.bincount(top_k_index[active], minlength=lay.n_experts), stats)
        return y.to(hidden.dtype) if num else None

    def _group_call(self, handle, j, gs, w, packed, out, fill):
        """(fn, args) running one static group (the layer's j-th) in place on its rows of the packed buffers."""
        H = packed.shape[1]
        G = len(gs.experts)
        x = packed[gs.start:gs.start + gs.rows].view(G, gs.capacity, H)
        y = out[gs.start:gs.start + gs.rows].view(G, gs.capacity, H)   # each group writes its rows in place
        if gs.resident and self.npu_backend is not None:
            return _run_backend, (self.npu_backend, w, x, y)
        if w is None:       # expert by expert on packed weights: the filled rows (skip) or all gs.capacity
            spans = [(e, gs.start + j * gs.capacity, gs.capacity if fill is None else fill[e])
                     for j, e in enumerate(gs.experts)]
            return self.packed_experts(handle).ffn_rows, (packed, spans, out)
        if fill is not None:   # one bmm per group; skipping padding trims the rows past the group's fullest expert
            fills = [fill[e] for e in gs.experts]
            m = max(fills)
            if PER_EXPERT_SPLIT and G > 1 and G * m >= PER_EXPERT_SPLIT * sum(fills) and \
                    (SPLIT_CAST_GROUPS or isinstance(w, EmulatedFp16Weights) or w.gate_up.dtype == x.dtype):
                if isinstance(w, EmulatedFp16Weights):     # the roundings once per group, the GEMMs per expert
                    return emulated_split_ffn, (x, w, y, fills)
                return _run_split, (x, self._split_weights(handle.layer, j, w), y, fills, self._work)
            x, y = x[:, :m], y[:, :m]
        return _run_group, (x, w, y, self._work)

    def _split_weights(self, layer: int, j: int, w) -> list:
        """Group j's weights as one [1, ...] view per expert (built once per layer and plan)."""
        key = (layer, j)
        if key not in self._split:
            self._split[key] = [select_npu(w, [k]) for k in range(w.n_experts)]
        return self._split[key]


@functools.lru_cache(maxsize=4096)
def _group_cost(G: int, C: int, H: int, I: int, dtype_bytes: int, weight_bytes: int):
    """One static group's cost (a static shape: the same for every call, so computed once)."""
    return expert_ffn_cost(G, C, H, I, dtype_bytes=dtype_bytes, weight_bytes=weight_bytes)


def dynamic_experts_cost(top_k_index, mask, hidden: int, intermediate: int, dtype_bytes: int):
    """Experts at their actual loads, one call each (the CPU handles dynamic shapes); the weights of every expert
    touched are streamed once."""
    loads = int(mask.sum())
    n_exp = max(1, int(top_k_index[mask].unique().numel()))
    cost = expert_ffn_cost(1, max(1, loads), hidden, intermediate, dtype_bytes=dtype_bytes, calls=n_exp)
    return type(cost)(name="experts_dynamic", flops=cost.flops,
                      bytes=cost.bytes + (n_exp - 1) * 3 * hidden * intermediate * dtype_bytes, calls=n_exp)


def _masked(weights, mask):
    return weights * mask.to(weights.dtype)


def _bmm_weights(w, dtype=None):
    """Group weights as a compiled graph holds them: each matrix stored transposed ([G, N, K] memory viewed as
    [G, K, N], HF's own F.linear layout, so a contiguous expert range needs no copy at all); oneDNN's bmm reads
    that B operand faster than row-major on this CPU (bench/RESULTS.md). `dtype`: the NPU's precision."""
    def mat(t):
        return t.transpose(1, 2).to(dtype=dtype or t.dtype, memory_format=torch.contiguous_format).transpose(1, 2)

    def vec(t):
        return None if t is None else t.to(dtype=dtype or t.dtype, memory_format=torch.contiguous_format)
    return replace(w, gate_up=mat(w.gate_up), down=mat(w.down), b_gate_up=vec(w.b_gate_up), b_down=vec(w.b_down))


def _run_group(x, w, out=None, work=None):
    """One static group; with `out` ([G, C, H] slice of the packed output) the result is written in place."""
    if isinstance(w, EmulatedFp16Weights):
        return emulated_group_ffn(x, w, out)
    if w.gate_up.dtype != x.dtype:    # the NPU computes in its own precision (fp16 on the ANE)
        y = group_ffn(x.to(w.gate_up.dtype), w).to(x.dtype)
        return y if out is None else out.copy_(y)
    if out is None:
        return group_ffn(x, w)
    return group_ffn_into(x, w, out, work)


def _run_split(x, ws, out, fills, work=None):
    """A group expert by expert, each on its filled rows only ([1, f, H] slices of x and out)."""
    for k, f in enumerate(fills):
        if f:
            _run_group(x[k:k + 1, :f], ws[k], out[k:k + 1, :f], work)
    return out


def _run_backend(backend, handle, x, out):
    """A resident group on an external static-graph runtime (ONNX Runtime, Core ML)."""
    return out.copy_(backend.run(handle, x))


def _dynamic_experts(weights, hidden, top_k_index, top_k_weights, mask, renormalize):
    """Assignments in `mask`, each expert at its actual load (CPU: dynamic shapes are fine). `weights`: the
    layer's ExpertWeights (one bmm per expert) or its PackedExperts."""
    dispatch, layout = plan_dispatch(top_k_index, _masked(top_k_weights, mask), None, active=mask)
    packed = pack(hidden, dispatch)
    if isinstance(weights, PackedExperts):
        out = weights.ffn_rows(packed, [(g.experts[0], g.start, g.capacity) for g in layout.groups],
                               torch.empty_like(packed))
    else:
        out = run_groups(packed, layout, weights)
    return scatter(out, dispatch)


def _combine(out, dispatch, parts, work=None):
    y = scatter(out, dispatch, work)
    for p in parts:
        y = y + p
    return y


__all__ = ["PlanExecutor", "LayerStats", "as_layout", "dynamic_experts_cost"]
