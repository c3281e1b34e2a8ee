"""A prefill's op stream as NumPy columns: what `replay.replay_prefill` records op by op, built in bulk.

For simulation (no numerics) every count the engine derives from routing is a function of the per-(chunk, layer)
expert counts: an expert's kept assignments are min(load, capacity) whatever the saliency rule (saliency picks WHICH
assignments survive, never how many), padding is the static rows left empty, overflow is load - capacity, a cold or
spilled op streams the weights of the experts it touches. So the routing is reduced once to counts [chunks, MoE
layers, experts] (one bincount), and each (plan, routing, prompt, chunk) stream is a set of columns, one row per op,
in the engine's submission order (`replay.replay_prefill`):

    kind (ops.OP_KINDS code), role (0 npu, 1 cpu), layer, chunk, flops, bytes, weight_bytes (stored weight bytes
    read; 0 if none), attn_flops (activation x activation FLOPs of attention), rows (rows per GEMM), calls,
    gemm_m, gemm_n, gemm_k (0 = no GEMM), seq (op index within its chunk), dep (CHAIN / BRANCH / JOIN below)

Dependencies (what the engine's clock records): CHAIN = after the previous op; BRANCH = after the last CHAIN op
(a MoE layer's static groups and cold / spilled experts all start after pack); JOIN = after every BRANCH since
(scatter). `array_replay.py` schedules and prices streams; `replay.py` stays the reference (a test holds both equal).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from npumoe_lab.devices.cost import OpCost, attention_cost, dense_cost, expert_ffn_cost, memory_cost
from npumoe_lab.errors import NpuMoeError
from npumoe_lab.execution.ops import OP_KINDS, ChunkContext

KIND = {k: i for i, k in enumerate(OP_KINDS)}
NPU, CPU = 0, 1
CHAIN, BRANCH, JOIN = 0, 1, 2
COLUMNS = ("kind", "role", "layer", "chunk", "flops", "bytes", "weight_bytes", "attn_flops", "rows", "calls",
           "gemm_m", "gemm_n", "gemm_k", "seq", "dep")
_FLOAT = ("flops", "bytes", "weight_bytes", "attn_flops")


@dataclass
class RoutingCounts:
    """Per-(chunk, MoE layer) expert counts of a sampled routing: `real` over the chunk's real tokens (what the
    plan executor dispatches), `touched` = experts any token of the chunk (padding included) routes to (HF's own
    experts run on every row of the static chunk)."""
    layers: tuple[int, ...]          # MoE layer ids, in order
    real: np.ndarray                 # [chunks, MoE layers, experts] int64
    touched: np.ndarray              # [chunks, MoE layers] int64
    chunk: int
    prompt_len: int
    top_k: int

    @property
    def n_chunks(self) -> int:
        return self.real.shape[0]


def routing_counts(routed, specs, prompt_len: int, chunk: int) -> RoutingCounts:
    """Counts of a routing source's sampled chunks (`src.chunks(...)`: [chunk] -> {layer: (top_k_index, weights,
    norms)}, or an array [chunks, MoE layers, chunk, K] of expert ids), all layers and chunks in one bincount."""
    n_chunks = math.ceil(prompt_len / chunk)
    layers = tuple(s.layer for s in specs)
    E = max(s.n_experts for s in specs)
    K = specs[0].top_k
    if isinstance(routed, np.ndarray):
        idx = routed
    else:
        if len(routed) < n_chunks:
            raise NpuMoeError(f"the routing covers {len(routed)} chunks but a prompt of {prompt_len} tokens in "
                              f"chunks of {chunk} needs {n_chunks}")
        idx = np.stack([np.stack([np.asarray(routed[c][layer][0]) for layer in layers]) for c in range(n_chunks)])
    idx = idx[:n_chunks].astype(np.int64, copy=False)
    C, L, T, Kr = idx.shape
    if T != chunk:
        raise NpuMoeError(f"the routing has {T} tokens per chunk but the chunk is {chunk}")
    base = (np.arange(C)[:, None] * L + np.arange(L)[None, :])[:, :, None, None] * E
    flat = (idx + base).reshape(-1)
    touched_all = np.bincount(flat, minlength=C * L * E).reshape(C, L, E)
    n_last = prompt_len - (n_chunks - 1) * chunk
    real = touched_all.copy()
    if n_last < chunk:            # padding tokens of the last chunk take no capacity
        pad = np.bincount((idx[-1, :, n_last:] + base[-1]).reshape(-1) - (C - 1) * L * E, minlength=L * E)
        real[-1] -= pad.reshape(L, E)
    return RoutingCounts(layers, real, (touched_all > 0).sum(2), chunk, prompt_len, Kr)


@dataclass
class OpStream:
    """One prefill's ops as columns (module docstring) and its drop / pad accounting."""
    cols: dict
    n_tokens: int
    routed: int = 0
    dropped: int = 0
    spilled: int = 0
    slots: int = 0
    padded: int = 0
    _cache: dict = field(default_factory=dict, repr=False)

    def __len__(self) -> int:
        return len(self.cols["kind"])

    def __getitem__(self, name: str) -> np.ndarray:
        return self.cols[name]

    @property
    def drop_rate(self) -> float:
        return self.dropped / self.routed if self.routed else 0.0

    @property
    def pad_rate(self) -> float:
        return self.padded / self.slots if self.slots else 0.0


def _cost_row(kind: str, role: int, layer: int, cost: OpCost, dep: int, weight_bytes: float,
              attn_flops: float = 0.0) -> dict:
    m, n, k = cost.gemm or (0, 0, 0)
    return dict(kind=KIND[kind], role=role, layer=layer, flops=cost.flops, bytes=cost.bytes,
                weight_bytes=float(weight_bytes), attn_flops=float(attn_flops), rows=m or 1, calls=cost.calls,
                gemm_m=m, gemm_n=n, gemm_k=k, dep=dep)


def _attention_row(geo, ctx, layer, role) -> dict:
    cost = geo.attention_op(layer, ctx, role).cost
    q, kv, h = geo.n_heads * geo.head_dim, geo.n_kv_heads * geo.head_dim, geo.hidden
    proj = h * q + 2 * h * kv + q * h
    attn = 2 * (2.0 * geo.n_heads * ctx.length * (ctx.past + ctx.length) * geo.head_dim)
    return _cost_row("attention", _role(role), layer, cost, CHAIN, proj * ctx.weight_bytes(role), attn)


def _role(role: str) -> int:
    return NPU if role == "npu" else CPU


def _dense_row(kind, role, layer, cost, in_f, out_f, wb) -> dict:
    return _cost_row(kind, _role(role), layer, cost, CHAIN, in_f * out_f * wb)


def build_stream(geometry, executor, counts: RoutingCounts, *, attention: str = "npu", dtype_bytes: int = 2,
                 npu_weight_bytes: int | None = None) -> OpStream:
    """The op stream `replay_prefill(geometry, executor, ...)` records for a prompt routed as `counts`.
    `executor`: a PlanExecutor (its static layouts: groups, capacities, cold experts) or None (HF's experts)."""
    C, chunk, T = counts.n_chunks, counts.chunk, counts.prompt_len
    moe = geometry.moe_layers
    pos = {layer: j for j, layer in enumerate(counts.layers)}
    H = geometry.hidden
    ctx0 = ChunkContext(index=0, past=0, n_real=chunk, length=chunk, clock=None, numerics=False,
                        dtype_bytes=dtype_bytes, npu_weight_bytes=npu_weight_bytes)
    db = dtype_bytes
    n_real = np.minimum(chunk, T - np.arange(C) * chunk)
    stream = OpStream({}, n_tokens=T)
    # one chunk's template: rows whose cost is the same in every chunk; marked rows are filled per chunk below
    tmpl, fill = [], []     # fill: (template row, what): "attention" | ("cold"|"spill", moe index) | ("hf", j)
    per_layer = []          # (moe index, capacity [E], dynamic cold mask [E], total rows, spill) per MoE layer
    for layer in range(geometry.n_layers):
        fill.append((len(tmpl), "attention"))
        tmpl.append(None)
        spec = moe.get(layer)
        if spec is None:
            continue
        j = pos[layer]
        shared = spec.n_shared_experts > 0
        if shared:
            sh = geometry.shared_op(layer, ctx0, attention)
            shared_row = _dense_row("shared_experts", attention, layer, sh.cost, H, 3 * geometry.shared_intermediate,
                                    ctx0.weight_bytes(attention))
        if shared and geometry.shared_first:
            tmpl.append(shared_row)
        r = geometry.router_op(layer, ctx0)
        tmpl.append(_dense_row("router", "cpu", layer, r.cost, H, spec.n_experts, db))
        I, K, E = spec.intermediate, spec.top_k, spec.n_experts
        if executor is None:
            fill.append((len(tmpl), ("hf", j, spec)))
            tmpl.append(None)
        else:
            layout, cold = executor.static_layout(layer)
            n_assign = chunk * K
            tmpl.append(_cost_row("dispatch", CPU, layer, memory_cost(n_assign * 16, "dispatch"), CHAIN, 0))
            R = layout.total_rows
            tmpl.append(_cost_row("pack", CPU, layer, memory_cost(2 * R * H * db, "pack"), CHAIN, 0))
            for gs in layout.groups:
                G, role = len(gs.experts), ("npu" if gs.resident else "cpu")
                wb = ctx0.weight_bytes(role)
                cost = expert_ffn_cost(G, gs.capacity, H, I, dtype_bytes=db, weight_bytes=wb)
                tmpl.append(_cost_row("expert_group", _role(role), layer, cost, BRANCH, 3.0 * G * H * I * wb))
            dyn_cold = cold.numpy() if executor.cold == "dynamic" else np.zeros(E, dtype=bool)
            cap = layout.capacity.numpy().astype(np.int64)
            cap = np.concatenate([cap, np.zeros(max(0, counts.real.shape[2] - len(cap)), np.int64)])
            dyn_cold = np.concatenate([dyn_cold, np.zeros(len(cap) - len(dyn_cold), bool)])
            per_layer.append((j, cap, dyn_cold, R, executor.spill, spec))
            fill.append((len(tmpl), ("cold", j, spec)))
            tmpl.append(None)
            if executor.spill:
                fill.append((len(tmpl), ("spill", j, spec)))
                tmpl.append(None)
            tmpl.append(_cost_row("scatter", CPU, layer, memory_cost(2 * n_assign * H * db, "scatter"), JOIN, 0))
        if shared and not geometry.shared_first:
            tmpl.append(shared_row)
    S = len(tmpl) + 1                                   # + the rest of the chunk
    cols = {c: np.zeros((C, S), dtype=np.float64 if c in _FLOAT else np.int64) for c in COLUMNS}
    keep = np.ones((C, S), dtype=bool)
    for s, row in enumerate(tmpl):
        if row is not None:
            for c, v in row.items():
                cols[c][:, s] = v
    # per-(chunk, layer) counts -> the static path's accounting and the dynamic ops' sizes, all layers at once
    dyn = {}
    if per_layer:
        js = [p[0] for p in per_layer]
        cap = np.stack([p[1] for p in per_layer])               # [Lm, E]
        cold = np.stack([p[2] for p in per_layer])
        rows = np.array([p[3] for p in per_layer])
        cnt = counts.real[:, js]                                # [C, Lm, E]
        load = np.where(cold, 0, cnt)
        kept = np.minimum(load, cap)
        over = load - kept
        n_over, over_exp = over.sum(2), (over > 0).sum(2)
        cold_load, cold_exp = np.where(cold, cnt, 0).sum(2), ((cnt > 0) & cold).sum(2)
        stream.routed = int(cnt.sum())
        stream.slots = int(rows.sum()) * C
        stream.padded = int((rows[None, :] - kept.sum(2)).sum())
        spill = np.array([p[4] for p in per_layer])
        stream.spilled = int((n_over * spill[None, :]).sum())
        stream.dropped = int(n_over.sum()) - stream.spilled
        for i, j in enumerate(js):
            dyn[("cold", j)] = (cold_load[:, i], cold_exp[:, i])
            dyn[("spill", j)] = (n_over[:, i], over_exp[:, i])
    for s, what in fill:
        if what == "attention":
            continue                                    # filled per chunk below
        name, j, spec = what
        I = spec.intermediate
        if name == "hf":
            loads, n_exp = np.full(C, chunk * spec.top_k), counts.touched[:, j]
            present = np.ones(C, dtype=bool)
        else:
            loads, n_exp = dyn[(name, j)]
            present = loads > 0
        _dynamic_columns(cols, s, loads, np.maximum(1, n_exp), H, I, db, spec.layer,
                         "experts_hf" if name == "hf" else "experts_dynamic")
        keep[:, s] &= present
    # attention: its cost depends on the chunk (KV length); same in every layer
    att_slots = [s for s, what in fill if what == "attention"]
    for c in range(C):
        ctx = ChunkContext(index=c, past=c * chunk, n_real=int(n_real[c]), length=chunk, clock=None,
                           numerics=False, dtype_bytes=dtype_bytes, npu_weight_bytes=npu_weight_bytes)
        row = _attention_row(geometry, ctx, 0, attention)
        for col, v in row.items():
            cols[col][c, att_slots] = v
        rest = geometry.rest_op(ctx, last=c * chunk + chunk >= T, measured=False).cost
        wb = geometry.hidden * geometry.vocab * db if c == C - 1 else 0.0
        for col, v in _cost_row("other", CPU, -1, rest, CHAIN, wb).items():
            cols[col][c, S - 1] = v
    cols["layer"][:, att_slots] = np.arange(geometry.n_layers)[None, :]
    cols["chunk"][:] = np.arange(C)[:, None]
    cols["seq"][:] = np.arange(S)[None, :]
    flat = keep.reshape(-1)
    stream.cols = {c: v.reshape(-1)[flat] for c, v in cols.items()}
    return stream


def _dynamic_columns(cols, s, loads, n_exp, H, I, db, layer, kind) -> None:
    """engine.dynamic_experts_cost on arrays: experts at their actual loads, one call each, each expert's weights
    streamed once."""
    rows = np.maximum(1, loads).astype(np.float64)
    cols["kind"][:, s] = KIND[kind]
    cols["role"][:, s] = CPU
    cols["layer"][:, s] = layer
    cols["flops"][:, s] = 6.0 * rows * H * I
    cols["bytes"][:, s] = (3.0 * H * I * db + 2.0 * rows * H * db) + (n_exp - 1) * 3 * H * I * db
    cols["weight_bytes"][:, s] = n_exp * 3.0 * H * I * db
    cols["calls"][:, s] = n_exp
    cols["rows"][:, s] = rows.astype(np.int64)
    cols["gemm_m"][:, s] = rows.astype(np.int64)
    cols["gemm_n"][:, s] = I
    cols["gemm_k"][:, s] = H
    cols["dep"][:, s] = BRANCH if kind == "experts_dynamic" else CHAIN


__all__ = ["OpStream", "RoutingCounts", "routing_counts", "build_stream", "COLUMNS", "KIND", "NPU", "CPU",
           "CHAIN", "BRANCH", "JOIN"]
