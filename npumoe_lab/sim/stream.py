"""A prefill's op stream as NumPy columns: what `replay.replay_prefill` records op by op, built in bulk.

For simulation (no numerics) every count the engine derives from routing is a function of the per-(chunk, layer)
expert counts: an expert's kept assignments are min(load, capacity) whatever the saliency rule (saliency picks WHICH
assignments survive, never how many), padding is the static rows left empty, overflow is load - capacity, a cold or
spilled op streams the weights of the experts it touches. So the routing is reduced once to counts [chunks, MoE
layers, experts] (one bincount), and each (plan, routing, prompt, chunk) stream is a set of columns, one row per op,
in the engine's submission order (`replay.replay_prefill`):

    kind (ops.OP_KINDS code), role (0 npu, 1 cpu), layer, chunk, flops, bytes, weight_bytes (stored weight bytes
    read; 0 if none), attn_flops (activation x activation FLOPs of attention), rows (rows per GEMM), calls,
    gemm_m, gemm_n, gemm_k (0 = no GEMM), seq (op index within its chunk), dep (CHAIN / BRANCH / JOIN below),
    group (a static group's id in its layer, else -1), spill (1: the overflow computed on the CPU, else 0)

Dependencies (what the engine's clock records): CHAIN = after the previous op; BRANCH = after the last CHAIN op
(a MoE layer's static groups and cold / spilled experts all start after pack); JOIN = after every BRANCH since
(scatter). `array_replay.py` schedules and prices streams; `replay.py` stays the reference (a test holds both equal).
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field

import numpy as np

from npumoe_lab.devices.cost import OpCost, memory_cost
from npumoe_lab.errors import NpuMoeError
from npumoe_lab.execution.ops import OP_KINDS, ChunkContext

KIND = {k: i for i, k in enumerate(OP_KINDS)}
NPU, CPU = 0, 1
CHAIN, BRANCH, JOIN = 0, 1, 2
COLUMNS = ("kind", "role", "layer", "chunk", "flops", "bytes", "weight_bytes", "attn_flops", "rows", "calls",
           "gemm_m", "gemm_n", "gemm_k", "seq", "dep", "group", "spill")
_FLOAT = ("flops", "bytes", "weight_bytes", "attn_flops")


@dataclass
class StreamExecutor:
    """What `build_stream` reads of a PlanExecutor (its compiled layout, cold-expert mode and spill), without the
    engine's numerics (torch): the array path's executor. A PlanExecutor serves as well (the tests pass one)."""
    layout: object                   # planning.layout.ExecutionLayout
    spill: bool = False
    cold: str = "dynamic"


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

    @classmethod
    def of(cls, layers, every: np.ndarray, real: np.ndarray, chunk: int, prompt_len: int, top_k: int):
        """From per-(chunk, layer, expert) counts of every token (`every`, padding too) and of the real ones."""
        return cls(tuple(layers), real, (every > 0).sum(2), chunk, prompt_len, top_k)


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
    return RoutingCounts.of(layers, touched_all, real, chunk, prompt_len, Kr)


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


def _role(role: str) -> int:
    return NPU if role == "npu" else CPU


def _attention_row(geo, ctx, layer, role) -> dict:
    cost = geo.attention_op(layer, ctx, role).cost
    q, kv, h = geo.n_heads * geo.head_dim, geo.n_kv_heads * geo.head_dim, geo.hidden
    proj = h * q + 2 * h * kv + q * h
    attn = 2 * (2.0 * geo.n_heads * ctx.length * (ctx.past + ctx.length) * geo.head_dim)
    return _cost_row("attention", _role(role), layer, cost, CHAIN, proj * ctx.weight_bytes(role), attn)


def _group_rows(groups, layer, H, I, db, npu_wb) -> np.ndarray:
    """devices.cost.expert_ffn_cost of every static group of a layer at once (same arithmetic, same order), as
    rows of a [n, len(COLUMNS)] block."""
    G = np.array([len(g.experts) for g in groups], dtype=np.int64)
    C = np.array([g.capacity for g in groups], dtype=np.int64)
    npu = np.array([g.resident for g in groups], dtype=bool)
    wb = np.where(npu, npu_wb or db, db)
    block = np.zeros((len(groups), len(COLUMNS)))
    for name, v in dict(kind=KIND["expert_group"], role=np.where(npu, NPU, CPU), layer=layer,
                        flops=6.0 * G * C * H * I, bytes=3.0 * G * H * I * wb + 2.0 * G * C * H * db,
                        weight_bytes=3.0 * G * H * I * wb, rows=C, calls=1, gemm_m=C, gemm_n=I, gemm_k=H,
                        dep=BRANCH, group=np.array([g.id for g in groups])).items():
        block[:, _COL[name]] = v
    return block


_COL = {c: i for i, c in enumerate(COLUMNS)}


def _block(row: dict) -> np.ndarray:
    out = np.zeros((1, len(COLUMNS)))
    out[0, _COL["group"]] = -1
    for k, v in row.items():
        out[0, _COL[k]] = v
    return out


@dataclass
class _Template:
    """One chunk's ops of a (geometry, executor, chunk, attention role, sizes): every row whose cost is the same in
    every chunk, placeholders (`fill`) for the rows that vary, and each MoE layer's static capacities."""
    cols: dict                 # column -> [S] (the rest-of-chunk row last)
    attention: np.ndarray      # row indices of the attention ops
    fill: list                 # (row, "cold" | "spill" | "hf", MoE index, spec)
    per_layer: list            # (MoE index, capacity [E], dynamic cold mask [E], static rows, spill)

    def __post_init__(self):
        # what every stream of this template fills the same way: the rows, their experts' sizes, layers, kinds
        f = self.fill
        self.fill_rows = np.array([x[0] for x in f], dtype=np.int64)
        self.fill_intermediate = np.array([x[3].intermediate for x in f], dtype=np.int64)
        self.fill_layer = np.array([x[3].layer for x in f], dtype=np.int64)
        self.fill_hf = np.array([x[1] == "hf" for x in f], dtype=bool)


def _static_part(executor, layer: int, E: int):
    """(static groups in buffer order, capacity [E], dynamic cold mask [E], static rows) of a layer: what
    `PlanExecutor.static_layout` packs (resident groups, and cold ones in static cold mode; capacity 0 elsewhere)."""
    lay = executor.layout.layer(layer)
    static = [g for g in lay.groups if g.resident or executor.cold == "static"]
    cap, cold = np.zeros(E, np.int64), np.zeros(E, bool)
    if static:
        members = np.fromiter((e for g in static for e in g.experts), dtype=np.int64)
        cap[members] = np.repeat([g.capacity for g in static], [len(g.experts) for g in static])
    if executor.cold == "dynamic":
        off = [e for g in lay.groups if not g.resident for e in g.experts]
        cold[off] = True
    return static, cap, cold, sum(len(g.experts) * g.capacity for g in static)


@functools.lru_cache(maxsize=256)
def _layer_rows(geometry, chunk, attention, db, npu_wb) -> dict:
    """{MoE layer: (router, dispatch, scatter, shared experts or None) rows} of a chunk: the same for every plan of
    the geometry (the templates of a grid's many executors read them; blocks are copied when a template is built)."""
    H = geometry.hidden
    ctx0 = ChunkContext(index=0, past=0, n_real=chunk, length=chunk, clock=None, numerics=False,
                        dtype_bytes=db, npu_weight_bytes=npu_wb)
    out = {}
    for layer, spec in geometry.moe_layers.items():
        shared_row = None
        if spec.n_shared_experts > 0:
            sh = geometry.shared_op(layer, ctx0, attention).cost
            m, k_ = 3 * geometry.shared_intermediate, ctx0.weight_bytes(attention)
            shared_row = _block(_cost_row("shared_experts", _role(attention), layer, sh, CHAIN, H * m * k_))
        router_row = _block(_cost_row("router", CPU, layer, geometry.router_op(layer, ctx0).cost, CHAIN,
                                      H * spec.n_experts * db))
        n_assign = chunk * spec.top_k
        dispatch_row = _block(_cost_row("dispatch", CPU, layer, memory_cost(n_assign * 16, "dispatch"), CHAIN, 0))
        scatter_row = _block(_cost_row("scatter", CPU, layer, memory_cost(2 * n_assign * H * db, "scatter"), JOIN,
                                       0))
        for row in (router_row, dispatch_row, scatter_row, shared_row):
            if row is not None:
                row.flags.writeable = False
        out[layer] = (router_row, dispatch_row, scatter_row, shared_row)
    return out


@functools.lru_cache(maxsize=65536)
def _pack_row(layer: int, nbytes: int) -> np.ndarray:
    row = _block(_cost_row("pack", CPU, layer, memory_cost(nbytes, "pack"), CHAIN, 0))
    row.flags.writeable = False
    return row


def _template(geometry, executor, layers, E, chunk, attention, db, npu_wb) -> _Template:
    moe = geometry.moe_layers
    pos = {layer: j for j, layer in enumerate(layers)}
    H = geometry.hidden
    rows = _layer_rows(geometry, chunk, attention, db, npu_wb)
    blocks, fill, att, per_layer, n = [], [], [], [], 0

    def add(block):
        nonlocal n
        blocks.append(block)
        n += len(block)

    def placeholder(what):
        fill.append((n, *what))
        add(_block({"group": -1, "spill": int(what[0] == "spill")}))

    for layer in range(geometry.n_layers):
        att.append(n)
        add(_block({"kind": KIND["attention"], "layer": layer}))
        spec = moe.get(layer)
        if spec is None:
            continue
        j = pos[layer]
        shared = spec.n_shared_experts > 0
        router_row, dispatch_row, scatter_row, shared_row = rows[layer]
        if shared and geometry.shared_first:
            add(shared_row)
        add(router_row)
        if executor is None:
            placeholder(("hf", j, spec))
        else:
            static, cap, dyn_cold, R = _static_part(executor, layer, E)
            add(dispatch_row)
            add(_pack_row(layer, 2 * R * H * db))
            if static:
                add(_group_rows(static, layer, H, spec.intermediate, db, npu_wb))
            per_layer.append((j, cap, dyn_cold, R, bool(executor.spill)))
            placeholder(("cold", j, spec))
            if executor.spill:
                placeholder(("spill", j, spec))
            add(scatter_row)
        if shared and not geometry.shared_first:
            add(shared_row)
    add(_block({"kind": KIND["other"], "role": CPU, "layer": -1}))     # the rest of the chunk, filled per chunk
    table = np.concatenate(blocks)
    cols = {c: table[:, i].astype(np.float64 if c in _FLOAT else np.int64) for i, c in enumerate(COLUMNS)}
    return _Template(cols, np.array(att, dtype=np.int64), fill, per_layer)


@functools.lru_cache(maxsize=1024)
def _chunk_rows(geometry, chunk: int, attention: str, db: int, npu_wb, C: int, T: int) -> tuple[dict, dict]:
    """({column: [C]} of each chunk's attention row (all but "layer": the template keeps each row's layer), {column:
    [C]} of each chunk's rest-of-chunk row) of a prompt of T tokens in C chunks: the same for every plan of a
    geometry (a grid's hundreds of streams read them), read-only."""
    att, rest = [], []
    for c in range(C):
        n_real = min(chunk, T - c * chunk)
        ctx = ChunkContext(index=c, past=c * chunk, n_real=int(n_real), length=chunk, clock=None,
                           numerics=False, dtype_bytes=db, npu_weight_bytes=npu_wb)
        att.append(_attention_row(geometry, ctx, 0, attention))
        cost = geometry.rest_op(ctx, last=c * chunk + chunk >= T, measured=False).cost
        rest.append(_cost_row("other", CPU, -1, cost, CHAIN, geometry.hidden * geometry.vocab * db if c == C - 1
                              else 0.0))

    def table(rows, skip=()):
        out = {}
        for col in rows[0]:
            if col not in skip:
                out[col] = np.array([r[col] for r in rows], dtype=np.float64 if col in _FLOAT else np.int64)
                out[col].flags.writeable = False
        return out
    return table(att, skip=("layer",)), table(rest)


def build_stream(geometry, executor, counts: RoutingCounts, *, attention: str = "npu", dtype_bytes: int = 2,
                 npu_weight_bytes: int | None = None) -> OpStream:
    """The op stream `replay_prefill(geometry, executor, ...)` records for a prompt routed as `counts`.
    `executor`: a PlanExecutor (its static layouts: groups, capacities, cold experts) or None (HF's experts).
    The static part of a chunk is built once per executor and reused for every prompt."""
    C, chunk, T = counts.n_chunks, counts.chunk, counts.prompt_len
    E, db = counts.real.shape[2], dtype_bytes
    key = (geometry, counts.layers, E, chunk, attention, db, npu_weight_bytes)
    cache = {} if executor is None else executor.__dict__.setdefault("_stream_templates", {})
    tp = cache.get(key)
    if tp is None:
        tp = cache[key] = _template(geometry, executor, counts.layers, E, chunk, attention, db, npu_weight_bytes)
    S = len(tp.cols["kind"])
    cols = {c: np.repeat(v[None, :], C, axis=0) for c, v in tp.cols.items()}
    keep = np.ones((C, S), dtype=bool)
    stream = OpStream({}, n_tokens=T)
    H = geometry.hidden
    # per-(chunk, layer) counts -> the static path's accounting and the dynamic ops' sizes, all layers at once
    dyn = {}
    if tp.per_layer:
        js = [p[0] for p in tp.per_layer]
        cap = np.stack([p[1] for p in tp.per_layer])               # [Lm, E]
        cold = np.stack([p[2] for p in tp.per_layer])
        rows = np.array([p[3] for p in tp.per_layer])
        spill = np.array([p[4] for p in tp.per_layer])
        cnt = counts.real[:, js]                                   # [C, Lm, E]
        load = np.where(cold, 0, cnt)
        kept = np.minimum(load, cap)
        over = load - kept
        n_over, over_exp = over.sum(2), (over > 0).sum(2)
        cold_load, cold_exp = np.where(cold, cnt, 0).sum(2), ((cnt > 0) & cold).sum(2)
        stream.routed = int(cnt.sum())
        stream.slots = int(rows.sum()) * C
        stream.padded = int((rows[None, :] - kept.sum(2)).sum())
        stream.spilled = int((n_over * spill[None, :]).sum())
        stream.dropped = int(n_over.sum()) - stream.spilled
        for i, j in enumerate(js):
            dyn[("cold", j)] = (cold_load[:, i], cold_exp[:, i])
            dyn[("spill", j)] = (n_over[:, i], over_exp[:, i])
    if tp.fill:            # the varying rows (cold, spilled, HF experts) of every layer at once
        loads, n_exp, present = [], [], []
        for s, name, j, spec in tp.fill:
            if name == "hf":
                loads.append(np.full(C, chunk * spec.top_k))
                n_exp.append(counts.touched[:, j])
                present.append(np.ones(C, dtype=bool))
            else:
                ld, n = dyn[(name, j)]
                loads.append(ld)
                n_exp.append(n)
                present.append(ld > 0)
        _dynamic_columns(cols, tp.fill_rows, np.stack(loads, 1), np.maximum(1, np.stack(n_exp, 1)), H,
                         tp.fill_intermediate, db, tp.fill_layer, tp.fill_hf)
        keep[:, tp.fill_rows] &= np.stack(present, 1)
    # attention (its cost depends on the chunk's KV length; the same in every layer) and the rest of the chunk
    att, rest = _chunk_rows(geometry, chunk, attention, dtype_bytes, npu_weight_bytes, C, T)
    for col, v in att.items():
        cols[col][:, tp.attention] = v[:, None]
    for col, v in rest.items():
        cols[col][:, S - 1] = v
    cols["chunk"][:] = np.arange(C)[:, None]
    cols["seq"][:] = np.arange(S)[None, :]
    flat = keep.reshape(-1)
    stream.cols = {c: v.reshape(-1)[flat] for c, v in cols.items()}
    return stream


def stream_from_ops(ops, n_tokens: int) -> OpStream | None:
    """A recorded prefill's ops (a clock's (Op, deps, wall) records: a real run's or a replay's) as an OpStream, so a
    modeled run is priced under parameter draws like a simulation. None when its dependencies are not the
    engine's CHAIN / BRANCH / JOIN pattern (then no interval is claimed)."""
    branch_kinds, rows, fork, branches = ("expert_group", "experts_dynamic"), [], None, []
    for i, (op, deps, _) in enumerate(ops):
        deps = tuple(deps)
        if op.kind in branch_kinds:
            dep, ok = BRANCH, fork is not None and deps == (fork,)
            branches.append(i)
        elif op.kind == "scatter":
            dep, ok = JOIN, deps == (tuple(branches) or (fork,))
            branches = []
        else:
            dep, ok = CHAIN, deps == ((i - 1,) if i else ())
        if not ok:
            return None
        if dep != BRANCH:
            fork = i
        m, n, k = op.cost.gemm or (0, 0, 0)
        c = op.cost
        rows.append((KIND[op.kind], _role(op.role), op.layer, op.chunk, c.flops, c.bytes, c.calls,
                     m, n, k, dep, c.attn_flops, c.weight_bytes or 0.0, c.gemm_rows, c.lut_params))
    # the last four: what the graph-level NPU structure reads besides the roofline's columns (pricing.graph)
    names = ("kind", "role", "layer", "chunk", "flops", "bytes", "calls", "gemm_m", "gemm_n", "gemm_k", "dep",
             "attn_flops", "weight_bytes", "rows", "lut_params")
    table = np.array(rows, dtype=np.float64).reshape(-1, len(names))
    cols = {c: table[:, j].astype(np.float64 if c in _FLOAT + ("lut_params",) else np.int64)
            for j, c in enumerate(names)}
    return OpStream(cols, n_tokens=n_tokens)


def _dynamic_columns(cols, s, loads, n_exp, H, I, db, layer, hf) -> None:
    """engine.dynamic_experts_cost on arrays: experts at their actual loads, one call each, each expert's weights
    streamed once. `s` [F]: the rows to fill; loads, n_exp [C, F]; I, layer, hf (HF's experts, else dynamic) [F]."""
    rows = np.maximum(1, loads).astype(np.float64)
    cols["kind"][:, s] = np.where(hf, KIND["experts_hf"], KIND["experts_dynamic"])
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
    cols["dep"][:, s] = np.where(hf, CHAIN, BRANCH)


__all__ = ["OpStream", "RoutingCounts", "StreamExecutor", "routing_counts", "build_stream", "stream_from_ops", "COLUMNS", "KIND", "NPU", "CPU",
           "CHAIN", "BRANCH", "JOIN"]
