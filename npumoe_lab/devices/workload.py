"""A measurement row's work as one OpCost: what the device model prices for that row.

Memory-stream rows (`work.stream_bytes`) move that many bytes per call and compute nothing (memory_cost).
GEMM-list rows (`work.gemms`, `work.act_gemms`) describe ONE call: weight-bearing GEMMs [M, N, K, count] (weights
N*K per GEMM, stored in `weight_format`) and activation x activation GEMMs (attention scores / weighted sums, no
stored weights, counted as attn_flops). Activations move once per distinct GEMM shape (in [M, K] and out [M, N]):
the ops of a chain keep their intermediates on chip; `activation_elems` overrides that count (e.g. a conv's input
is B*H*W*C, not its im2col matrix). `calls` calls are timed together: the OpCost covers all of them.

Forward rows (`work.geometry`) are a whole forward of `rows` tokens with `context` past tokens in the KV cache, in
`calls` graph calls: per layer the attention (devices/cost.py attention_cost) and the MLP (a SwiGLU: dense_cost
gate+up and down; `gated_mlp: false` in the geometry: a GELU MLP, up and down; MoE geometries: expert_ffn_cost with every expert at capacity ceil(rows*top_k/E)), plus the LM
head for every row when `lm_head` (default true). `streams` (default 1): the rows are that many independent
sequences (a batched decode step of B streams: rows = B, each stream its own KV cache of `context`, read per
stream; cost.attention_cost). `weight_passes` (default 1): how many times the call moves its weight bytes (e.g. 3
when the runtime copies every weight before using it: read + write of the copy, then the GEMM's read). They are combined into one OpCost: the graph-level structure
prices total work, rows and stored bytes; the per-op roofline rates it at its dominant GEMM, as it rates a
grouped-expert graph.
"""
from __future__ import annotations

import json
import math

from npumoe_lab.errors import NpuMoeError
from npumoe_lab.utils import REPO_ROOT
from npumoe_lab.devices.cost import OpCost, attention_cost, dense_cost, expert_ffn_cost, memory_cost
from npumoe_lab.devices.graph_cost import weight_format

ACT_BYTES = {"fp32": 4}          # activation element size by weight format (else fp16 activations, 2 bytes)
GEOMETRY_DIR = REPO_ROOT / "data" / "geometries"


def _gemm_op(rid: str, work: dict) -> OpCost:
    if "stream_bytes" in work:                      # a bandwidth-bound op (copy, elementwise): bytes only
        calls = int(work.get("calls", 1))
        return memory_cost(calls * float(work["stream_bytes"]), rid, calls)
    wb, lut = weight_format(work["weight_format"])
    ab = ACT_BYTES.get(work["weight_format"], 2)
    calls = int(work.get("calls", 1))
    gemms, acts = work.get("gemms", []), work.get("act_gemms", [])
    mm = sum(2.0 * m * n * k * c for m, n, k, c in gemms)
    attn = sum(2.0 * m * n * k * c for m, n, k, c in acts)
    params = float(sum(n * k * c for m, n, k, c in gemms))
    act = work.get("activation_elems", sum(m * k + m * n for m, n, k, _ in gemms + acts))
    top = max(gemms + acts, key=lambda g: g[0] * g[1] * g[2])
    return OpCost(rid, calls * (mm + attn), calls * (params * wb + act * ab), calls, tuple(top[:3]),
                  weight_bytes=calls * params * wb, rows=top[0], attn_flops=calls * attn,
                  lut_params=calls * params if lut else 0.0)


def _geometry(spec) -> dict:
    if isinstance(spec, dict):
        return spec
    path = GEOMETRY_DIR / f"{spec}.json"
    if not path.is_file():
        names = ", ".join(sorted(p.stem for p in GEOMETRY_DIR.glob("*.json")))
        raise NpuMoeError(f"unknown geometry {spec!r} in a measurement row; give an HF-style mapping or one of {names}")
    return json.loads(path.read_text())


def _get(g: dict, *keys, default=None):
    for k in keys:
        if g.get(k) is not None:
            return g[k]
    if default is None:
        raise NpuMoeError(f"geometry lacks {keys[0]!r}; give an HF-style config (hidden_size, num_hidden_layers, "
                          "num_attention_heads, intermediate_size, vocab_size)")
    return default


def forward_op(rid: str, work: dict) -> OpCost:
    """One forward of `rows` tokens as a combined OpCost (see the module doc)."""
    g = _geometry(work["geometry"])
    wb, lut = weight_format(work["weight_format"])
    ab = ACT_BYTES.get(work["weight_format"], 2)
    rows, past, calls = int(work["rows"]), int(work.get("context", 0)), int(work.get("calls", 1))
    streams, passes = int(work.get("streams", 1)), int(work.get("weight_passes", 1))
    hidden = int(_get(g, "hidden_size"))
    heads = int(_get(g, "num_attention_heads"))
    kv = int(_get(g, "num_key_value_heads", default=heads))
    head_dim = int(_get(g, "head_dim", default=hidden // heads))
    layers = int(work.get("layers", _get(g, "num_hidden_layers")))
    n_exp = _get(g, "num_experts", "num_local_experts", "n_routed_experts", default=0)
    ops = []
    for _ in range(layers):
        ops.append(attention_cost(rows, past, hidden, heads, kv, head_dim, dtype_bytes=ab, weight_bytes=wb,
                                  streams=streams))
        if n_exp:
            inter = int(_get(g, "moe_intermediate_size", "intermediate_size"))
            top_k = int(_get(g, "num_experts_per_tok", "top_k"))
            cap = math.ceil(rows * top_k / n_exp)
            ops.append(expert_ffn_cost(int(n_exp), cap, hidden, inter, dtype_bytes=ab, weight_bytes=wb))
        else:
            inter = int(_get(g, "intermediate_size"))
            gates = 2 if g.get("gated_mlp", True) else 1        # SwiGLU: gate + up; GELU MLP (BERT, Whisper): up
            ops.append(dense_cost(rows, hidden, gates * inter, dtype_bytes=ab, weight_bytes=wb))
            ops.append(dense_cost(rows, inter, hidden, dtype_bytes=ab, weight_bytes=wb))
    if work.get("lm_head", True):
        ops.append(dense_cost(rows, hidden, int(_get(g, "vocab_size")), dtype_bytes=ab, weight_bytes=wb))
    c = OpCost.combine(rid, *ops)
    moved = c.bytes + (passes - 1) * c.weight_bytes      # weight_passes: the weights move that many times
    return OpCost(rid, c.flops, moved, calls, c.gemm, weight_bytes=c.weight_bytes, rows=rows,
                  attn_flops=c.attn_flops, lut_params=c.weight_bytes / wb if lut else 0.0)


def row_op(row) -> OpCost:
    """The OpCost a measurement row (a load_measurements row: mapping or namedtuple) describes."""
    rid, work = (row["id"], row["work"]) if isinstance(row, dict) else (row.id, row.work)
    return forward_op(rid, work) if "geometry" in work else _gemm_op(rid, work)
