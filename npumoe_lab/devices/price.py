"""Vectorised pricing: many ops under many parameter draws at once, with NumPy.

`price(params, ops) -> (D, N)` seconds gives the same numbers as `DeviceModel.estimate` op by op (a test holds
them equal), for D parameter draws and N ops, both cost structures (per-op roofline and graph-level, selected per
draw by `npu_graph_model`). It is what fit-device's sampler and interval pricing of whole simulations call:
price an op stream once per draw matrix instead of once per draw.

- `op_columns([(role, OpCost), ...])` -> columns (N,): flops, attn_flops, bytes, weight_bytes, lut_params, rows,
  calls, gemm_size ((M*N*K)**(1/3), 0 = no shape), role (0 npu, 1 cpu).
- `platform_params(platform)` -> {knob: array (1,)} for every knob in PARAM_KEYS (role_key, as the override knobs),
  plus the fixed rate curves (`npu_throughput_curve`, `cpu_throughput_curve`: tuples of (size, FLOP/s) or None).
- `with_draws(base, names, draws)` -> base with the named knobs replaced by the columns of draws (D, P).
- Predictive noise (the model's own error on top of the parameter draws), from a fit-device posterior:
  `predictive_sigma(posterior, groups)` -> (D, N) log-noise sigma per draw and op: the fitted noise for ops whose
  device/kind group the fit rows contain, max(that, `posterior.transfer_sigma_log`) for every other (whole
  forwards, simulated runs: fit.py estimates it by leave-one-group-out cross-validation on fit rows only);
  `transfer_sigma(posterior)` -> that scalar or None; `with_noise(seconds, sigma, seed)` -> seconds x exp(sigma z).
  For a whole run (a sum over many ops) draw ONE z per parameter draw and run (the error of a kind of work is
  systematic across its ops): `with_noise(ttft (D,), sigma (D,), seed)`, not one per op.
"""
from __future__ import annotations

import numpy as np

from npumoe_lab.errors import NpuMoeError
from npumoe_lab.devices.graph_cost import tile_bytes

ROLE_CODE = {"npu": 0, "cpu": 1}
COLUMNS = ("flops", "attn_flops", "bytes", "weight_bytes", "lut_params", "rows", "calls", "gemm_size", "tile_bytes",
           "role", "direct")
DEVICE_KEYS = ("dispatch_s", "sync_s", "op_overhead_s", "throughput_flops", "bandwidth_bytes_s", "active_power_w")
GRAPH_KEYS = ("graph_model", "graph_peak_flops", "work_half_flops", "rows_half", "attention_flops",
              "decompress_params_s", "clusters", "sram_bytes", "spill_factor")
PATH_KEYS = ("direct_dispatch_s", "direct_bandwidth_bytes_s", "direct_rows_half")    # NaN: the path uses the Core ML values
POWER_KEYS = ("floor_power_w",)                                  # NaN: constant active_power_w
PARAM_KEYS = tuple(f"{r}_{k}" for r in ROLE_CODE for k in DEVICE_KEYS) + tuple(f"npu_{k}" for k in GRAPH_KEYS) \
    + tuple(f"npu_{k}" for k in PATH_KEYS + POWER_KEYS)
CURVES = ("npu_throughput_curve", "cpu_throughput_curve")
_UNSET = 1.0    # graph parameters of a platform without the graph structure (never used: graph_model is 0)


def op_columns(ops, paths=None) -> dict[str, np.ndarray]:
    """Columns (N,) of [(role, OpCost), ...]; `paths` (N,) = each op's software path (None: all coreml)."""
    ops = list(ops)
    if not ops:
        raise NpuMoeError("op_columns got no ops; pass [(role, OpCost), ...]")
    bad = [r for r, _ in ops if r not in ROLE_CODE]
    if bad:
        raise NpuMoeError(f"op role {bad[0]!r} is unknown; use npu or cpu")
    col = {
        "flops": [o.flops for _, o in ops], "attn_flops": [o.attn_flops for _, o in ops],
        "bytes": [o.bytes for _, o in ops], "weight_bytes": [o.weight_bytes or 0.0 for _, o in ops],
        "lut_params": [o.lut_params for _, o in ops], "rows": [o.gemm_rows for _, o in ops],
        "calls": [o.calls for _, o in ops],
        "gemm_size": [(float(o.gemm[0]) * o.gemm[1] * o.gemm[2]) ** (1 / 3) if o.gemm else 0.0 for _, o in ops],
        "tile_bytes": [tile_bytes(o) for _, o in ops], "role": [ROLE_CODE[r] for r, _ in ops],
        "direct": [p == "direct" for p in (paths if paths is not None else [None] * len(ops))]}
    return {k: np.asarray(v, dtype=float) for k, v in col.items()}


def platform_params(platform) -> dict:
    """The platform's values of every knob price() reads, as arrays of one draw."""
    out = {}
    for role in ROLE_CODE:
        dev = platform.device(role)
        for k in DEVICE_KEYS:
            out[f"{role}_{k}"] = np.array([float(getattr(dev, k))])
        out[f"{role}_throughput_curve"] = dev.throughput_curve
    npu = platform.npu
    for k in GRAPH_KEYS:
        v = getattr(npu, k)
        out[f"npu_{k}"] = np.array([float(_UNSET if v is None else v)])
    for k in PATH_KEYS + POWER_KEYS:
        v = getattr(npu, k)
        out[f"npu_{k}"] = np.array([np.nan if v is None else float(v)])
    return out


def with_draws(base: dict, names, draws) -> dict:
    """`base` (platform_params) with knobs `names` set to the columns of `draws` (D, len(names))."""
    draws = np.atleast_2d(np.asarray(draws, dtype=float))
    names = list(names)
    if draws.shape[1] != len(names):
        raise NpuMoeError(f"draws have {draws.shape[1]} columns for {len(names)} parameters {names}")
    unknown = [n for n in names if n not in PARAM_KEYS]
    if unknown:
        raise NpuMoeError(f"cannot draw {unknown}; price() reads {', '.join(PARAM_KEYS)}")
    return {**base, **{n: draws[:, i] for i, n in enumerate(names)}}


def transfer_sigma(posterior) -> float | None:
    """The cross-validated log-noise sigma of work the fit rows do not contain (fit.py), or None."""
    v = (posterior or {}).get("transfer_sigma_log")
    return None if v is None else float(v)


def predictive_sigma(posterior: dict, groups) -> np.ndarray:
    """(D, N) log-noise sigma: the posterior's fitted noise draws for ops of a fitted device/kind group, at least
    the transfer sigma for the others (module doc). `groups`: N strings like "npu/gemm" (fit.row_group)."""
    sig = np.asarray(posterior["sigma_log"], dtype=float).reshape(-1, 1)
    groups = list(groups)
    t = transfer_sigma(posterior)
    if t is None:
        return np.broadcast_to(sig, (sig.shape[0], len(groups))).copy()
    unfitted = np.array([g not in set(posterior.get("fitted_groups") or ()) for g in groups])
    return np.where(unfitted[None, :], np.maximum(sig, t), sig)


def with_noise(seconds: np.ndarray, sigma: np.ndarray, seed: int = 0) -> np.ndarray:
    """Posterior predictive draws: each modeled value times exp(sigma x z), z standard normal (seeded)."""
    seconds = np.asarray(seconds, dtype=float)
    z = np.random.default_rng(seed).standard_normal(seconds.shape)
    return seconds * np.exp(np.asarray(sigma, dtype=float) * z)


def _curve_rate(curve, size: np.ndarray) -> np.ndarray:
    """Log-log interpolation of a (size, FLOP/s) curve, clamped at its ends (DeviceModel.gemm_rate)."""
    s, r = (np.log(np.asarray([p[i] for p in curve])) for i in (0, 1))
    return np.exp(np.interp(np.log(np.maximum(size, 1e-300)), s, r))


def _col(params: dict, key: str) -> np.ndarray:
    if key not in params:
        raise NpuMoeError(f"price() needs parameter {key!r}; start from platform_params(platform)")
    return np.asarray(params[key], dtype=float).reshape(-1, 1)      # (D, 1)


def _call_and_bw(params: dict, role: str, ops: dict):
    """Per-call cost and bandwidth (D, N): the direct path's own where an op ran through it and they are given."""
    call = _col(params, f"{role}_dispatch_s") + _col(params, f"{role}_sync_s") + _col(params, f"{role}_op_overhead_s")
    bw = _col(params, f"{role}_bandwidth_bytes_s")
    if role == "npu":
        direct = ops["direct"] > 0.5
        d_call, d_bw = _col(params, "npu_direct_dispatch_s"), _col(params, "npu_direct_bandwidth_bytes_s")
        call = np.where(direct & ~np.isnan(d_call), d_call, call)
        bw = np.where(direct & ~np.isnan(d_bw), d_bw, bw)
    return call, bw


def _roofline(params: dict, role: str, ops: dict) -> np.ndarray:
    call, bw = _call_and_bw(params, role, ops)
    rate = np.broadcast_to(_col(params, f"{role}_throughput_flops"), (call.shape[0], ops["flops"].size))
    curve = params.get(f"{role}_throughput_curve")
    if curve:
        shaped = ops["gemm_size"] > 0
        rate = np.where(shaped, _curve_rate(curve, ops["gemm_size"]), rate)
    return ops["calls"] * call + np.maximum(ops["flops"] / rate, ops["bytes"] / bw)


def _graph(params: dict, ops: dict) -> np.ndarray:
    g = {k: _col(params, f"npu_{k}") for k in GRAPH_KEYS}
    call, bw = _call_and_bw(params, "npu", ops)
    d_rows = _col(params, "npu_direct_rows_half")
    rows_half = np.where((ops["direct"] > 0.5) & ~np.isnan(d_rows), d_rows, g["rows_half"])
    mm = np.maximum(ops["flops"] - ops["attn_flops"], 0.0)
    x4 = (ops["tile_bytes"] / g["sram_bytes"]) ** 4
    slow = 1.0 + (1.0 / g["spill_factor"] - 1.0) * x4 / (1.0 + x4)
    # graph_cost.compute_flops_equiv: row-tile floor (spilled) + per-call fill (0 without matmul work)
    equiv = np.where(mm > 0, mm * np.maximum(1.0, rows_half / ops["rows"]) * slow
                     + ops["calls"] * g["work_half_flops"], 0.0)
    compute = equiv / (g["clusters"] * g["graph_peak_flops"]) + ops["attn_flops"] / (g["clusters"] *
                                                                                   g["attention_flops"])
    memory = ops["bytes"] / (g["clusters"] * bw)
    decompress = ops["lut_params"] / (g["clusters"] * g["decompress_params_s"])
    return ops["calls"] * call + np.maximum(np.maximum(compute, memory), decompress)


def price(params: dict, ops: dict) -> np.ndarray:
    """Seconds (D, N) of N ops (op_columns) under D parameter draws (arrays (D,) or (1,) per knob)."""
    npu = np.where(_col(params, "npu_graph_model") > 0.5, _graph(params, ops), _roofline(params, "npu", ops))
    return np.where(ops["role"] == 0, npu, _roofline(params, "cpu", ops))


def npu_energy(params: dict, flops: np.ndarray, seconds: np.ndarray) -> np.ndarray:
    """Joules (D, N) of NPU ops of `flops` (N,) busy `seconds` (D, N): floor x t + (active - floor) x min(t,
    flops / peak), i.e. power() x seconds (graph_cost.npu_energy_j); without a floor, active x t."""
    seconds = np.asarray(seconds, dtype=float)
    graph = _col(params, "npu_graph_model") > 0.5
    peak = np.where(graph, _col(params, "npu_clusters") * _col(params, "npu_graph_peak_flops"),
                    _col(params, "npu_throughput_flops"))
    act, floor = _col(params, "npu_active_power_w"), _col(params, "npu_floor_power_w")
    full = np.minimum(seconds, np.asarray(flops, dtype=float) / peak)
    return np.where(np.isnan(floor), act * seconds, floor * seconds + (act - floor) * full)


def power(params: dict, ops: dict, seconds: np.ndarray) -> np.ndarray:
    """Modeled watts (D, N) of ops running `seconds` (price()): floor + (active - floor) x achieved/peak rate
    (graph_cost.call_power); the cpu role and a missing floor give constant active power."""
    graph = _col(params, "npu_graph_model") > 0.5
    peak = np.where(graph, _col(params, "npu_clusters") * _col(params, "npu_graph_peak_flops"),
                    _col(params, "npu_throughput_flops"))
    util = np.minimum(1.0, ops["flops"] / (seconds * peak))
    act = _col(params, "npu_active_power_w")
    floor = _col(params, "npu_floor_power_w")
    npu = np.where(np.isnan(floor), act, floor + (act - floor) * util)
    return np.where(ops["role"] == 0, npu, _col(params, "cpu_active_power_w"))
