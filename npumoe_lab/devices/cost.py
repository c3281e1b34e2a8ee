"""What an operation costs a device: FLOPs, bytes moved from memory, and device dispatches.

Pure arithmetic, no device knowledge: a DeviceModel (platform.py) turns an OpCost into seconds. FLOPs count
2 per multiply-accumulate (the convention of the ANE/CPU throughput sources in ANE_PARAMETERS.md).
Byte sizes: `dtype_bytes` is the activation (and default weight) element size; `weight_bytes` (None = dtype_bytes)
is the stored weight element size, e.g. 1 for int8 weights dequantized on the NPU (only weights shrink then).
`gemm` = (M, N, K) of the op's dominant GEMM, [M, K] x [K, N]: a device whose GEMM rate depends on the shape
(the ANE's throughput_curve) rates the whole op at that GEMM's shape.
Graph-level fields (read by the graph-level NPU structure, devices/graph_cost.py; the per-op roofline ignores them):
`weight_bytes` = stored weight bytes the op streams (part of `bytes`), `rows` = rows (tokens) per GEMM of one call,
`attn_flops` = the part of `flops` in activation x activation GEMMs (attention scores and weighted sums, which
grow with context and run at their own rate), `lut_params` = weight elements stored palettized (LUT4/LUT6...),
which the engine expands on the fly (the decompression floor). Fractional `weight_bytes` element sizes
(0.5 = LUT4, 0.75 = LUT6) are allowed in the builders.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from npumoe_lab.errors import NpuMoeError


def _check_count(what: str, value, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise NpuMoeError(f"{what} must be an integer >= {minimum}, got {value!r}; pass a whole number")
    return value


def _counts(**named) -> list[int]:
    """Each named argument checked as a whole number >= 1, in the order given."""
    return [_check_count(what, value) for what, value in named.items()]


def _check_amount(what: str, value) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        raise NpuMoeError(f"{what} must be a finite number >= 0, got {value!r}; pass a non-negative number")
    return float(value)


def _check_gemm(name: str, gemm):
    if gemm is None:
        return None
    if not isinstance(gemm, (tuple, list)) or len(gemm) != 3:
        raise NpuMoeError(f"OpCost {name!r} gemm must be (M, N, K) of its largest GEMM or None, got {gemm!r}")
    return tuple(_check_count(f"OpCost {name!r} gemm {d}", v) for d, v in zip("MNK", gemm))


@dataclass(frozen=True)
class OpCost:
    """One operation as a device sees it. `calls` = device dispatches (graph calls) the op needs;
    `gemm` = (M, N, K) of its dominant GEMM (None: no GEMM, or shape unknown -> the device's flat rate)."""
    name: str
    flops: float
    bytes: float
    calls: int = 1
    gemm: tuple[int, int, int] | None = None
    weight_bytes: float | None = None   # stored weight bytes inside `bytes` (None: unknown / all activations)
    rows: int | None = None             # rows per GEMM of one call (None: the gemm's M, else 1)
    attn_flops: float = 0.0             # FLOPs of activation x activation GEMMs (attention), part of flops
    lut_params: float = 0.0             # palettized weight elements expanded on the engine

    def __post_init__(self):
        if not isinstance(self.name, str) or not self.name:
            raise NpuMoeError(f"OpCost name must be a non-empty string, got {self.name!r}; name the op (e.g. 'router')")
        object.__setattr__(self, "flops", _check_amount(f"OpCost {self.name!r} flops", self.flops))
        object.__setattr__(self, "bytes", _check_amount(f"OpCost {self.name!r} bytes", self.bytes))
        _check_count(f"OpCost {self.name!r} calls", self.calls)
        object.__setattr__(self, "gemm", _check_gemm(self.name, self.gemm))
        if self.weight_bytes is not None:
            object.__setattr__(self, "weight_bytes", _check_amount(f"OpCost {self.name!r} weight_bytes",
                                                                   self.weight_bytes))
        if self.rows is not None:
            _check_count(f"OpCost {self.name!r} rows", self.rows)
        object.__setattr__(self, "attn_flops", _check_amount(f"OpCost {self.name!r} attn_flops", self.attn_flops))
        object.__setattr__(self, "lut_params", _check_amount(f"OpCost {self.name!r} lut_params", self.lut_params))
        if self.attn_flops > self.flops * (1 + 1e-12):
            raise NpuMoeError(f"OpCost {self.name!r}: attn_flops {self.attn_flops:g} exceeds flops {self.flops:g}; "
                              "attention FLOPs are part of the op's FLOPs")

    @property
    def gemm_rows(self) -> int:
        """Rows per GEMM of one call: `rows`, else the dominant GEMM's M, else 1."""
        return self.rows if self.rows is not None else (self.gemm[0] if self.gemm else 1)

    @property
    def intensity(self) -> float:
        """FLOP per byte (arithmetic intensity); inf for a byte-free op."""
        return self.flops / self.bytes if self.bytes else math.inf

    @staticmethod
    def combine(name: str, *ops: "OpCost") -> "OpCost":
        """Several ops run as one: FLOPs, bytes and calls add up; the GEMM shape is the largest op's."""
        if not ops:
            raise NpuMoeError(f"OpCost.combine({name!r}) got no ops; pass at least one OpCost")
        top = max(ops, key=lambda o: o.flops)
        wb = None if any(o.weight_bytes is None for o in ops) else sum(o.weight_bytes for o in ops)
        return OpCost(name, sum(o.flops for o in ops), sum(o.bytes for o in ops), sum(o.calls for o in ops),
                      top.gemm, weight_bytes=wb, rows=top.rows, attn_flops=sum(o.attn_flops for o in ops),
                      lut_params=sum(o.lut_params for o in ops))


def _weight_size(weight_bytes, dtype_bytes: int) -> float:
    """Stored bytes per weight element: the activation size, or a positive size (fractional for LUT formats)."""
    if weight_bytes is None:
        return dtype_bytes
    if isinstance(weight_bytes, bool) or not isinstance(weight_bytes, (int, float)) or not weight_bytes > 0 \
            or not math.isfinite(weight_bytes):
        raise NpuMoeError(f"weight_bytes must be a positive number of bytes per weight (2 fp16, 1 int8, 0.5 LUT4), "
                          f"got {weight_bytes!r}")
    return weight_bytes


def expert_ffn_cost(n_experts_in_graph: int, capacity: int, hidden: int, intermediate: int,
                    dtype_bytes: int = 2, calls: int = 1, name: str = "expert_group",
                    weight_bytes: int | None = None) -> OpCost:
    """SwiGLU experts over a packed [G, C, H] buffer (gate, up: H->I; down: I->H).

    flops = 3 GEMMs x 2*G*C*H*I = 6*G*C*H*I (elementwise SiLU/mul are O(G*C*I), ignored).
    bytes = weights 3*G*H*I x weight_bytes + activations in [G,C,H] and out [G,C,H] x dtype_bytes. The [G,C,I]
    intermediates are assumed to stay on chip inside one graph (they are not streamed from memory).
    gemm = (C, I, H): one expert's [C, H] x [H, I]. The G experts of a group share no operand, so the engine runs
    G separate GEMMs of that shape (batched in one graph), not one G-times larger GEMM.
    """
    g, c, h, i, db = _counts(n_experts_in_graph=n_experts_in_graph, capacity=capacity, hidden=hidden,
                             intermediate=intermediate, dtype_bytes=dtype_bytes)
    wb = _weight_size(weight_bytes, db)
    flops = 6.0 * g * c * h * i
    nbytes = 3.0 * g * h * i * wb + 2.0 * g * c * h * db
    return OpCost(name, flops, nbytes, calls, (c, i, h), weight_bytes=3.0 * g * h * i * wb, rows=c)


def attention_cost(chunk: int, past: int, hidden: int, n_heads: int, n_kv_heads: int, head_dim: int,
                   dtype_bytes: int = 2, name: str = "attention", weight_bytes: int | None = None,
                   streams: int = 1) -> OpCost:
    """One attention layer over a chunk of new tokens attending to past+chunk keys (GQA).

    A static-shape graph computes the full [chunk, past+chunk] score block (causal masking does not skip work),
    so scores and the weighted sum are counted in full. Softmax, RoPE and norms are ignored (O(chunk*keys)).
    bytes = projection weights (x weight_bytes) + x in/out + KV cache read (past+chunk keys) + KV write of the
    chunk (x dtype_bytes). gemm = the Q projection [chunk, hidden] x [hidden, n_heads*head_dim], the largest single
    GEMM (the per-head score GEMMs are head_dim deep).
    `streams` > 1: the chunk is that many independent sequences (a batched decode step), each with chunk/streams
    new tokens and its OWN KV cache of `past` keys: scores per stream over past + chunk/streams keys, and every
    stream's cache is read (projections are shared; streams=1 is the single sequence above).
    """
    p = _check_count("past", past, minimum=0)
    t, h, nh, nkv, hd, db, ns = _counts(chunk=chunk, hidden=hidden, n_heads=n_heads, n_kv_heads=n_kv_heads,
                                        head_dim=head_dim, dtype_bytes=dtype_bytes, streams=streams)
    if t % ns:
        raise NpuMoeError(f"chunk={t} is not a multiple of streams={ns}; each stream gets chunk/streams tokens")
    wb = _weight_size(weight_bytes, db)
    if nh % nkv:
        raise NpuMoeError(f"n_heads={nh} is not a multiple of n_kv_heads={nkv}; pass the model's GQA head counts")
    q_dim, kv_dim, keys = nh * hd, nkv * hd, p + t // ns       # keys per stream
    proj_weights = h * q_dim + 2 * h * kv_dim + q_dim * h
    attn = 2 * (2.0 * nh * t * keys * hd)
    flops = 2.0 * t * proj_weights + attn
    nbytes = proj_weights * float(wb) + (2 * t * h + ns * 2 * keys * kv_dim + 2 * t * kv_dim) * float(db)
    return OpCost(name, flops, nbytes, 1, (t, q_dim, h), weight_bytes=proj_weights * float(wb), rows=t,
                  attn_flops=attn)


def dense_cost(rows: int, in_features: int, out_features: int, dtype_bytes: int = 2,
               name: str = "dense", weight_bytes: int | None = None) -> OpCost:
    """y[rows, out] = x[rows, in] @ W[in, out] (router, shared experts, lm head); gemm = (rows, out, in)."""
    r, k, n, db = _counts(rows=rows, in_features=in_features, out_features=out_features, dtype_bytes=dtype_bytes)
    wb = _weight_size(weight_bytes, db)
    return OpCost(name, 2.0 * r * k * n, k * n * float(wb) + (r * k + r * n) * float(db), 1, (r, n, k),
                  weight_bytes=k * n * float(wb), rows=r)


def memory_cost(nbytes: float, name: str, calls: int = 1) -> OpCost:
    """A bandwidth-bound op (pack, scatter, gather): no arithmetic, `nbytes` moved."""
    return OpCost(name, 0.0, nbytes, calls, weight_bytes=0.0)
