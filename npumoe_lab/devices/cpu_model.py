"""A fitted cost model of this host's CPU, op kind by op kind: what `fit-device --platform cpu` fits and what
`validate-device --runs` re-prices a measured run with.

The `cpu` platform times its runs for real; its roofline parameters (cpu.yaml + hostprofile.py) are single best-case
rates. To check that a device model can predict a whole prefill from micro-benchmarks, this model prices every op
the engine records (ops.Op: kind, FLOPs, bytes, calls, GEMM shape, shape) with free parameters fitted on the
`measure --device cpu` grid:

    t(op)   = calls * call_s[kind] + max(t_gemm, t_memory) + t_scores
    t_gemm  = gemm_flops / (peak_flops * u),   u = w / (w + work_half_flops) * rows / (rows + rows_half)
    t_memory = bytes / bandwidth_bytes_s
    t_scores = 4 * t * keys * q_dim / attention_flops            (attention only: the [t, keys] score blocks)

w = GEMM FLOPs per call, rows = rows per GEMM (tokens per expert for the expert ops). `other` (the chunk's rest: the
embedding, norms, residual adds and LM head no other op covers) is priced from its shape (T, layers, H, V): a
floor per chunk plus one per layer, the LM head [T, H] x [H, V] and the norms' traffic. Same form as the NPU's
graph-level model (graph_cost.py): per-call cost + work at a utilisation that rises with the work per call.
All parameters are positive; the fit is least squares on log time over log parameters (scipy).
"""
from __future__ import annotations

import json
import math

import numpy as np

from npumoe_lab.errors import NpuMoeError

# engine op kinds (execution/ops.py OP_KINDS) that get their own per-call floor
CALL_KINDS = ("attention", "router", "shared_experts", "experts_hf", "dispatch", "pack", "expert_group",
              "experts_dynamic", "scatter")
RATE_PARAMS = ("peak_flops", "work_half_flops", "rows_half", "bandwidth_bytes_s", "attention_flops",
               "other_chunk_s", "other_layer_s")
PARAMS = tuple(f"call_s_{k}" for k in CALL_KINDS) + RATE_PARAMS
# starting point of a fit (and the prior scale): orders of magnitude of a 2-core x86 VM under torch
START = {**{f"call_s_{k}": 3e-5 for k in CALL_KINDS}, "peak_flops": 3e11, "work_half_flops": 1e7, "rows_half": 8.0,
         "bandwidth_bytes_s": 1e10, "attention_flops": 1e11, "other_chunk_s": 3e-4, "other_layer_s": 5e-5}
UNITS = {"peak_flops": "FLOP/s", "work_half_flops": "FLOP", "rows_half": "rows", "bandwidth_bytes_s": "B/s",
         "attention_flops": "FLOP/s"}
DTYPE_BYTES = 2     # element size the engine's recorded costs use (PrefillConfig.dtype_bytes)


def op_record(kind, flops, nbytes, calls, gemm=None, shape=()) -> dict:
    """The fields of one op this model prices (from an ops.Op, a timeline row or a measurement row's work.cost)."""
    if isinstance(gemm, str):
        gemm = json.loads(gemm)
    if isinstance(shape, str):
        shape = json.loads(shape)
    return dict(kind=str(kind), flops=float(flops), bytes=float(nbytes), calls=int(calls),
                gemm=None if gemm is None else tuple(int(x) for x in gemm), shape=tuple(int(x) for x in shape))


def from_op(op) -> dict:
    return op_record(op.kind, op.cost.flops, op.cost.bytes, op.cost.calls, op.cost.gemm, op.shape)


def _utilisation(w, rows, p) -> float:
    if w <= 0:
        return 1.0
    return w / (w + p["work_half_flops"]) * rows / (rows + p["rows_half"])


def _gemm_memory(flops, nbytes, calls, rows, p) -> float:
    t_gemm = flops / (p["peak_flops"] * _utilisation(flops / max(calls, 1), max(rows, 1), p)) if flops else 0.0
    return max(t_gemm, nbytes / p["bandwidth_bytes_s"])


def price(p: dict, op: dict) -> float:
    """Modeled seconds of one op record under parameters `p` (a dict over PARAMS)."""
    kind, calls, gemm = op["kind"], op["calls"], op["gemm"]
    if kind == "other":
        if len(op["shape"]) != 4:
            raise NpuMoeError(f"an 'other' op needs shape (chunk, layers, hidden, vocab), got {op['shape']!r}; "
                              "re-run with this version (it records the shape)")
        t, layers, h, v = op["shape"]
        flops, nbytes = 2.0 * t * h * v, (v * h + layers * 10 * t * h) * DTYPE_BYTES
        return p["other_chunk_s"] + layers * p["other_layer_s"] + _gemm_memory(flops, nbytes, 1, t, p)
    if kind not in CALL_KINDS:
        raise NpuMoeError(f"op kind {kind!r} has no price in the CPU model; known: {', '.join(CALL_KINDS)}, other")
    base = calls * p[f"call_s_{kind}"]
    rows = 1 if gemm is None else gemm[0]
    if kind in ("experts_dynamic", "experts_hf"):
        rows = rows / max(calls, 1)             # one call per expert at its own load
    flops, scores = op["flops"], 0.0
    if kind == "attention" and gemm is not None and len(op["shape"]) == 2:
        t, past = op["shape"]
        score_flops = 4.0 * t * (past + t) * gemm[1]       # gemm[1] = n_heads * head_dim
        flops = max(flops - score_flops, 0.0)
        scores = score_flops / p["attention_flops"]
    return base + _gemm_memory(flops, op["bytes"], calls, rows, p) + scores


def price_many(p: dict, ops) -> np.ndarray:
    return np.array([price(p, o) for o in ops], dtype=float)


def fit(ops, measured_s, start: dict | None = None, fixed: dict | None = None) -> dict:
    """Least squares on log time: the parameters (all of PARAMS not in `fixed`) that best price `ops` at
    `measured_s`. Returns {"params", "free", "rms_log", "n_rows", "median_abs_err", "worst_abs_err"}.
    Parameters no row informs stay at their start value (their gradient is zero) and are reported as such."""
    from scipy.optimize import least_squares
    ops, y = list(ops), np.asarray(measured_s, dtype=float)
    if len(ops) != len(y) or not np.all(np.isfinite(y)) or np.any(y <= 0):
        raise NpuMoeError("fit needs one positive finite measured time per op")
    fixed = dict(fixed or {})
    start = {**START, **(start or {})}
    free = [k for k in PARAMS if k not in fixed and _informed(k, ops)]
    if len(ops) < len(free):
        raise NpuMoeError(f"a fit of {len(free)} free parameters needs at least as many rows; got {len(ops)}")
    base = {**start, **fixed}

    def params(x):
        return {**base, **{k: math.exp(v) for k, v in zip(free, x)}}

    def resid(x):
        return np.log(price_many(params(x), ops)) - np.log(y)
    x0 = np.array([math.log(base[k]) for k in free])
    sol = least_squares(resid, x0, method="trf", x_scale=1.0, max_nfev=4000)
    p = params(sol.x)
    err = np.abs(price_many(p, ops) / y - 1)
    return {"params": p, "free": free, "rms_log": float(np.sqrt(np.mean(sol.fun ** 2))), "n_rows": len(ops),
            "median_abs_err": float(np.median(err)), "worst_abs_err": float(np.max(err))}


def _informed(name: str, ops) -> bool:
    """Whether any op's price depends on parameter `name` (the others cannot be fitted)."""
    kinds = {o["kind"] for o in ops}
    if name.startswith("call_s_"):
        return name[len("call_s_"):] in kinds
    if name in ("other_chunk_s", "other_layer_s"):
        return "other" in kinds
    if name == "attention_flops":
        return "attention" in kinds
    return True


__all__ = ["PARAMS", "CALL_KINDS", "START", "op_record", "from_op", "price", "price_many", "fit"]
