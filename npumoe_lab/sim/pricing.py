"""Platform parameters as arrays: an op stream priced on one platform or on many parameter draws at once.

`platform_params(platform)` = the point values the per-op path prices with, keyed `{role}_{parameter}` like the
platform overrides (`npu_dispatch_s`, `cpu_power_per_core_w`, ...). `parameter_draws(platform, n, seed)` = n draws
of the same keys (arrays of shape (n,)): from the platform's `posterior` (fit-device's draws) when it has one, else
from a PRIOR built from the sourced parameters (below; not a posterior: nothing was fitted). `price_stream(params,
stream)` = modeled seconds of every op of a `stream.OpStream` under every draw, (D, N): `DeviceModel.estimate`'s
roofline on arrays. A later cost structure (the graph-level NPU cost) plugs in as another entry of STRUCTURES.

The prior: a parameter of confidence H is fixed at its value; one of confidence M or L is log-uniform over the range
spanned by its value and its positive `alternatives`, or, with no alternatives, over value x [1/1.25, 1.25] (M) or
[1/2, 2] (L). A zero value stays zero. A role's `throughput_curve` keeps its shape and scales with the drawn
`throughput_flops` (its level is what the alternatives disagree on). Structural values (cores, weight_bytes, graph
limits) are fixed: they change the plan, not the price of a given stream.
"""
from __future__ import annotations

import math

import numpy as np

from npumoe_lab.errors import NpuMoeError
from npumoe_lab.sim.stream import NPU, CPU

PRICED = {"npu": ("dispatch_s", "sync_s", "throughput_flops", "bandwidth_bytes_s", "active_power_w",
                  "idle_power_w", "host_cores"),
          "cpu": ("throughput_flops", "bandwidth_bytes_s", "op_overhead_s", "power_per_core_w", "idle_power_w",
                  "freq_hz")}
FIXED = {"cpu": ("cores",)}
SPREAD = {"M": 1.25, "L": 2.0}       # prior half-width (a factor) of an M / L parameter without alternatives
INTERVAL = (5.0, 95.0)               # the 90 % interval's percentiles


def _value(platform, role: str, key: str) -> float:
    entry = platform.params[role].get(key)
    if entry is not None and entry.get("value") is not None:
        return float(entry["value"])
    dev = platform.device(role)
    return float(getattr(dev, key, 0.0) or 0.0)


def platform_params(platform) -> dict:
    """The point values of every priced parameter (scalars) and each role's curve (a tuple or None)."""
    out = {}
    for role in ("npu", "cpu"):
        for key in PRICED[role] + FIXED.get(role, ()):
            out[f"{role}_{key}"] = _value(platform, role, key)
        dev = platform.device(role)
        out[f"{role}_throughput_curve"] = dev.throughput_curve
        out.setdefault(f"{role}_dispatch_s", float(dev.dispatch_s))
        out.setdefault(f"{role}_sync_s", float(dev.sync_s))
        out.setdefault(f"{role}_op_overhead_s", float(dev.op_overhead_s))
    if platform.npu.active_power_w != out["npu_active_power_w"]:      # derived on a shared platform
        out["npu_active_power_w"] = float(platform.npu.active_power_w)
    return out


def _prior_range(entry: dict) -> tuple[float, float] | None:
    v = entry.get("value")
    if not isinstance(v, (int, float)) or isinstance(v, bool) or v <= 0 or entry.get("confidence") == "H":
        return None
    alts = [float(a) for a in (entry.get("alternatives") or {}).values()
            if isinstance(a, (int, float)) and not isinstance(a, bool) and a > 0]
    lo, hi = min([float(v)] + alts), max([float(v)] + alts)
    if hi > lo:
        return lo, hi
    f = SPREAD.get(entry.get("confidence"))
    return (v / f, v * f) if f else None


def draws_source(platform) -> str:
    """'posterior' (fit-device's draws in the platform file) or 'prior' (the sourced parameters' ranges)."""
    post = getattr(platform, "posterior", None)
    return "posterior" if isinstance(post, dict) and post.get("draws") else "prior"


def parameter_draws(platform, n: int, seed: int = 0) -> dict:
    """{param: (n,) array} of every priced parameter (module docstring): posterior draws, else the prior."""
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise NpuMoeError(f"the number of parameter draws must be an integer >= 1, got {n!r}")
    rng = np.random.default_rng(seed)
    point = platform_params(platform)
    out = {k: np.full(n, v) for k, v in point.items() if not k.endswith("_throughput_curve")}
    post = getattr(platform, "posterior", None)
    if draws_source(platform) == "posterior":
        names, rows = list(post.get("params") or ()), np.asarray(post["draws"], dtype=float)
        if rows.ndim != 2 or rows.shape[1] != len(names):
            raise NpuMoeError(f"platform {platform.name!r}: posterior draws are {rows.shape}, expected one column "
                              f"per parameter of {names}; rerun fit-device")
        pick = rng.choice(len(rows), size=n, replace=len(rows) < n)
        for j, name in enumerate(names):
            if name in out:
                out[name] = rows[pick, j]
    else:
        for role in ("npu", "cpu"):
            for key in PRICED[role]:
                rng_ = _prior_range(platform.params[role].get(key) or {})
                if rng_ is not None:
                    lo, hi = rng_
                    out[f"{role}_{key}"] = np.exp(rng.uniform(math.log(lo), math.log(hi), n))
    for role in ("npu", "cpu"):           # a curve keeps its shape and follows the drawn peak rate
        base = point[f"{role}_throughput_flops"]
        out[f"{role}_curve_scale"] = out[f"{role}_throughput_flops"] / base if base else np.ones(n)
        out[f"{role}_throughput_curve"] = point[f"{role}_throughput_curve"]
    return out


def _param(params: dict, key: str) -> np.ndarray:
    """(D, 1) column of a parameter (a scalar is one draw)."""
    return np.asarray(params.get(key, 0.0), dtype=np.float64).reshape(-1, 1)


def _curve_rate(curve, m, n, k) -> np.ndarray:
    """DeviceModel.gemm_rate on arrays: the curve at (M*N*K)**(1/3), log-log between points, clamped."""
    size = (m.astype(np.float64) * n * k) ** (1.0 / 3.0)
    xs = np.log([c[0] for c in curve])
    ys = np.log([c[1] for c in curve])
    return np.exp(np.interp(np.log(size), xs, ys))


def roofline(params: dict, role: int, flops, nbytes, calls, gemm_m, gemm_n, gemm_k) -> np.ndarray:
    """Seconds (D, n) of ops of one role: calls x (dispatch + sync + op overhead) + max(flops / rate, bytes / bw)."""
    name = "npu" if role == NPU else "cpu"
    over = (_param(params, f"{name}_dispatch_s") + _param(params, f"{name}_sync_s")) \
        + _param(params, f"{name}_op_overhead_s")
    rate = np.broadcast_to(_param(params, f"{name}_throughput_flops"), (over.shape[0], len(flops))).copy() \
        if len(flops) else np.zeros((over.shape[0], 0))
    curve = params.get(f"{name}_throughput_curve")
    if curve:
        g = gemm_m > 0
        if g.any():
            scale = _param(params, f"{name}_curve_scale") if f"{name}_curve_scale" in params else 1.0
            rate = np.broadcast_to(rate, (max(rate.shape[0], np.shape(scale)[0] if np.ndim(scale) else 1),
                                          len(flops))).copy()
            rate[:, g] = _curve_rate(curve, gemm_m[g], gemm_n[g], gemm_k[g])[None, :] * scale
    return calls * over + np.maximum(flops / rate, nbytes / _param(params, f"{name}_bandwidth_bytes_s"))


STRUCTURES = {"roofline": roofline}


def array_priced(platform) -> bool:
    """Whether `price_stream`'s roofline is this platform's cost model (DeviceModel.estimate): not for an NPU on the
    graph-level structure (devices/graph_cost.py; devices/price.py prices that one on arrays - to plug in here as
    another STRUCTURES entry). Simulations on such a platform take the per-op engine, without an interval."""
    return not any(getattr(platform.device(r), "graph_model", False) for r in ("npu", "cpu"))


def price_stream(params: dict, stream, structure: str = "roofline") -> np.ndarray:
    """Modeled seconds (D, N) of every op of `stream` (an OpStream, or a dict of its columns) under each of the D
    draws in `params` (scalars: D = 1)."""
    if structure not in STRUCTURES:
        raise NpuMoeError(f"unknown cost structure {structure!r}; use one of {', '.join(STRUCTURES)}")
    cols = stream.cols if hasattr(stream, "cols") else stream
    cost = STRUCTURES[structure]
    D = max(np.size(v) for k, v in params.items() if not k.endswith("_throughput_curve"))
    out = np.empty((D, len(cols["role"])))
    for role in (NPU, CPU):
        sel = cols["role"] == role
        if sel.any():
            out[:, sel] = cost(params, role, cols["flops"][sel], cols["bytes"][sel], cols["calls"][sel],
                               cols["gemm_m"][sel], cols["gemm_n"][sel], cols["gemm_k"][sel])
    return out


__all__ = ["array_priced", "platform_params", "parameter_draws", "draws_source", "price_stream", "roofline",
           "STRUCTURES", "INTERVAL"]
