"""Platform parameters as arrays: an op stream priced on one platform or on many parameter draws at once.

`platform_params(platform)` = the point values the per-op path prices with, keyed `{role}_{parameter}` like the
platform overrides (`npu_dispatch_s`, `cpu_power_per_core_w`, ...). `parameter_draws(platform, n, seed)` = n draws
of the same keys (arrays of shape (n,)): from the platform's `posterior` (fit-device's draws) when it has one, else
from a PRIOR built from the sourced parameters (below; not a posterior: nothing was fitted). `price_stream(params,
stream)` = modeled seconds of every op of a `stream.OpStream` under every draw, (D, N): `DeviceModel.estimate`'s
roofline on arrays, or, on a platform whose NPU runs the graph-level structure (`npu.graph_model` 1: every
fit-device YAML, or the override `npu_graph_model=graph`), that structure: the NPU ops are priced by devices/price.py's
`price` (the one vectorised graph-level formula, also what fit-device and validate-device call; not written twice
here), the CPU ops by the roofline below. `STRUCTURES` names both; `structure_of(params)` picks the platform's.

Graph-level draws: the posterior's columns (fit-device's fitted parameters: graph_peak_flops, work_half_flops,
rows_half, attention_flops, bandwidth, power, CPU rates...) replace their point values; on a sourced platform switched
to the graph structure the prior below also covers its continuous graph parameters (graph_peak_flops,
work_half_flops, rows_half, attention_flops, decompress_params_s); clusters, sram_bytes and spill_factor stay fixed.
Simulated op streams run the Core ML path (no `direct` ops) and carry no palettized weights (lut_params 0: the
simulations' weight formats are fp16 and int8).

Predictive noise (the hook for the model's own error, beyond parameter uncertainty): when the posterior carries a
per-draw log-noise scale under one of NOISE_FIELDS (a list with one sigma per posterior draw, or one number), each
drawn parameter set gets a factor exp(sigma * z), z ~ N(0, 1) seeded, that multiplies the modeled seconds of every
op of that draw (`noise_factor`, applied by price_stream). One factor per draw, not per op: the model's error on a
configuration is systematic (the same structure misprices similar ops alike), and independent per-op noise would
average away over a stream's thousands of ops and understate it. fit-device writes `transfer_sigma_log` (devices/
fit.py: leave-one-group-out cross-validation on fit rows only), the same error validate-device adds to whole-model
rows, so a fitted platform's intervals are predictive by default; without such a field (sourced platforms, older
fits): parameter uncertainty only. fit-device's `sigma_log` (the likelihood's noise on the fit rows, which validate-device adds per
row) is not read by default; `parameter_draws(..., noise="fit")` uses it.

On a fitted platform the parameters fit-device did not fit (the posterior has no column for them: e.g. the Core
ML dispatch_s when only the direct path's was fitted, or the CPU rates of a chip without CPU rows) are drawn from
their prior as on a sourced one (`draws_source` says 'posterior+prior'); holding them at their point would make
the intervals narrower than anything was measured.

The prior: a parameter of confidence H is fixed at its value; one of confidence M or L is log-uniform and CENTRED on
its sourced value (in log): over value x [1/f, f], f the largest factor between the value and any of its positive
`alternatives` (so every alternative is inside), or, with no alternatives, f = 1.25 (M) or 2 (L). Centred so that
the point value (every parameter at its source) sits in the middle of the prior, not at one end, and the point of
a modeled number lies inside its own interval (until 2026-12-03 the range was [min, max] of the value and its
alternatives, which put the sourced value at one end: e.g. the demo's modeled reference bar 6.0 ms below its own
[6.6, 68] ms whisker). A zero value stays zero. A role's `throughput_curve` keeps its shape and scales with the drawn
`throughput_flops` (its level is what the alternatives disagree on). Structural values (cores, weight_bytes, graph
limits) are fixed: they change the plan, not the price of a given stream.
"""
from __future__ import annotations

import math

import numpy as np

from npumoe_lab.devices import price as graph_price
from npumoe_lab.errors import NpuMoeError
from npumoe_lab.sim.stream import NPU, CPU

PRICED = {"npu": ("dispatch_s", "sync_s", "throughput_flops", "bandwidth_bytes_s", "active_power_w",
                  "idle_power_w", "host_cores"),
          "cpu": ("throughput_flops", "bandwidth_bytes_s", "op_overhead_s", "power_per_core_w", "idle_power_w",
                  "freq_hz")}
FIXED = {"cpu": ("cores",)}
SPREAD = {"M": 1.25, "L": 2.0}       # prior half-width (a factor) of an M / L parameter without alternatives
INTERVAL = (5.0, 95.0)               # the 90 % interval's percentiles
GRAPH_DRAWN = ("graph_peak_flops", "work_half_flops", "rows_half", "attention_flops", "decompress_params_s")
# posterior keys of a per-draw predictive log-noise, first found wins; fit-device writes transfer_sigma_log (the
# cross-validated error on work whose kind the fit rows lack: a whole prefill is such work, as validate-device prices
# its model_forward rows)
NOISE_FIELDS = ("predictive_sigma_log", "noise_sigma_log", "transfer_sigma_log")
NOISE_MODES = ("auto", "none", "fit")  # auto: a NOISE_FIELDS entry when present; fit: also fit-device's sigma_log


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
    for k, v in graph_price.platform_params(platform).items():      # the graph-level structure's knobs
        if k not in out and not k.endswith("_throughput_curve"):
            out[k] = float(v[0])
    return out


def _prior_range(entry: dict) -> tuple[float, float] | None:
    v = entry.get("value")
    if not isinstance(v, (int, float)) or isinstance(v, bool) or v <= 0 or entry.get("confidence") == "H":
        return None
    alts = [float(a) for a in (entry.get("alternatives") or {}).values()
            if isinstance(a, (int, float)) and not isinstance(a, bool) and a > 0]
    lo, hi = min([float(v)] + alts), max([float(v)] + alts)
    if hi > lo:     # centred on the sourced value (in log), wide enough for every alternative
        f = max(hi / v, v / lo)
        return v / f, v * f
    f = SPREAD.get(entry.get("confidence"))
    return (v / f, v * f) if f else None


def _prior_keys(platform) -> list[tuple[str, tuple[float, float]]]:
    """(param, (low, high)) of every priced parameter with a prior range (module docstring)."""
    graph = GRAPH_DRAWN if platform.npu.graph_model else ()
    out = []
    for role in ("npu", "cpu"):
        for key in PRICED[role] + (graph if role == "npu" else ()):
            r = _prior_range(platform.params[role].get(key) or {})
            if r is not None:
                out.append((f"{role}_{key}", r))
    return out


def _posterior(platform) -> dict | None:
    post = getattr(platform, "posterior", None)
    return post if isinstance(post, dict) and post.get("draws") else None


def draws_source(platform) -> str:
    """'prior' (the sourced parameters' ranges), 'posterior' (fit-device's draws in the platform file cover every
    uncertain priced parameter) or 'posterior+prior' (the fitted parameters from the posterior, the platform's other
    uncertain parameters from their prior: a parameter nobody fitted is not known better for sitting in a fit)."""
    post = _posterior(platform)
    if post is None:
        return "prior"
    fitted = set(post.get("params") or ())
    return "posterior+prior" if any(k not in fitted for k, _ in _prior_keys(platform)) else "posterior"


def _noise_sigma(post, mode: str, n_rows: int) -> np.ndarray | None:
    """(posterior rows,) predictive log-noise per posterior draw (module docstring), or None."""
    fields = () if mode == "none" else NOISE_FIELDS + (("sigma_log",) if mode == "fit" else ())
    for f in fields:
        v = post.get(f)
        if v is None:
            continue
        sig = np.broadcast_to(np.asarray(v, dtype=float).reshape(-1), (n_rows,)) if np.size(v) in (1, n_rows) \
            else None
        if sig is None or not np.isfinite(sig).all() or (sig < 0).any():
            raise NpuMoeError(f"posterior {f}: expected one sigma >= 0 per draw ({n_rows}) or one number, got "
                              f"{np.size(v)} values; rerun fit-device")
        return sig
    return None


def parameter_draws(platform, n: int, seed: int = 0, noise: str = "auto", rest: str = "prior") -> dict:
    """{param: (n,) array} of every priced parameter (module docstring): posterior draws, else the prior.
    `noise`: the predictive-noise hook (module docstring): auto | none | fit; with noise, `noise_factor` (n,).
    `rest`: on a fitted platform, the parameters it did not fit: "prior" (default) or "fixed" at their point values
    (the fitted parameters' uncertainty alone)."""
    if rest not in ("prior", "fixed"):
        raise NpuMoeError(f"rest {rest!r}: use prior or fixed")
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise NpuMoeError(f"the number of parameter draws must be an integer >= 1, got {n!r}")
    if noise not in NOISE_MODES:
        raise NpuMoeError(f"noise {noise!r}: use one of {', '.join(NOISE_MODES)}")
    rng = np.random.default_rng(seed)
    point = platform_params(platform)
    out = {k: np.full(n, v) for k, v in point.items() if not k.endswith("_throughput_curve")}
    post, fitted, sigma, pick = _posterior(platform), set(), None, None
    if post is not None:
        names, rows = list(post.get("params") or ()), np.asarray(post["draws"], dtype=float)
        if rows.ndim != 2 or rows.shape[1] != len(names):
            raise NpuMoeError(f"platform {platform.name!r}: posterior draws are {rows.shape}, expected one column "
                              f"per parameter of {names}; rerun fit-device")
        pick = rng.choice(len(rows), size=n, replace=len(rows) < n)
        for j, name in enumerate(names):
            if name in out:
                out[name] = rows[pick, j]
        fitted = set(names)
        sigma = _noise_sigma(post, noise, len(rows))
    for key, (lo, hi) in _prior_keys(platform):       # the prior; on a fit, for what it did not fit
        if key not in fitted and (post is None or rest == "prior"):
            out[key] = np.exp(rng.uniform(math.log(lo), math.log(hi), n))
    if sigma is not None:       # drawn last: the same seed gives the same parameter draws with or without noise
        out["noise_factor"] = np.exp(sigma[pick] * rng.standard_normal(n))
    for role in ("npu", "cpu"):
        # a curve keeps its shape and follows a peak rate drawn from the prior (its level is what the
        # alternatives disagree on); a fitted peak rate leaves the curve as the fit priced it (devices/price.py)
        base, key = point[f"{role}_throughput_flops"], f"{role}_throughput_flops"
        out[f"{role}_curve_scale"] = out[key] / base if base and key not in fitted else np.ones(n)
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


ROOFLINE_COLUMNS = ("flops", "bytes", "calls", "gemm_m", "gemm_n", "gemm_k")     # the op columns roofline reads


def roofline(params: dict, role: int, ops: dict) -> np.ndarray:
    """Seconds (D, n) of ops (stream columns) of one role: calls x (dispatch + sync + op overhead) + max(flops /
    rate, bytes / bw)."""
    flops, nbytes, calls = ops["flops"], ops["bytes"], ops["calls"]
    gemm_m, gemm_n, gemm_k = ops["gemm_m"], ops["gemm_n"], ops["gemm_k"]
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


def graph_columns(ops: dict) -> dict:
    """devices/price.py's op columns (op_columns) of stream columns: rows per GEMM (stream `rows`, else the GEMM's M,
    else 1: OpCost.gemm_rows), the effective GEMM size, the dominant GEMM's fp16 weight tile (graph_cost.tile_bytes),
    attention FLOPs and palettized weights (0 where the stream has none), all on the Core ML path."""
    m = np.asarray(ops["gemm_m"], dtype=np.float64)
    n, k = np.asarray(ops["gemm_n"], dtype=np.float64), np.asarray(ops["gemm_k"], dtype=np.float64)
    shaped = m > 0
    zeros = np.zeros(len(m))
    rows = np.asarray(ops["rows"], dtype=np.float64) if "rows" in ops else np.where(shaped, m, 1.0)
    return {"flops": np.asarray(ops["flops"], dtype=np.float64),
            "attn_flops": np.asarray(ops.get("attn_flops", zeros), dtype=np.float64),
            "bytes": np.asarray(ops["bytes"], dtype=np.float64),
            "weight_bytes": np.asarray(ops.get("weight_bytes", zeros), dtype=np.float64),
            "lut_params": np.asarray(ops.get("lut_params", zeros), dtype=np.float64),
            "rows": rows, "calls": np.asarray(ops["calls"], dtype=np.float64),
            "gemm_size": np.where(shaped, (m * n * k) ** (1.0 / 3.0), 0.0),
            "tile_bytes": np.where(shaped, 2.0 * n * k, 0.0),
            "role": np.where(np.asarray(ops["role"]) == NPU, graph_price.ROLE_CODE["npu"],
                             graph_price.ROLE_CODE["cpu"]).astype(np.float64), "direct": zeros}


def graph(params: dict, role: int, ops: dict) -> np.ndarray:
    """Seconds (D, n) of ops of one role on the graph-level structure: NPU ops by devices/price.py's `price` (graph
    cost, graph_cost.py), CPU ops by the roofline (the CPU role has no graph structure)."""
    if role == CPU:
        return roofline(params, role, ops)
    missing = [k for k in graph_price.PARAM_KEYS if k not in params]
    if missing:
        raise NpuMoeError(f"graph-level pricing needs {missing}; start from platform_params(platform)")
    return graph_price.price(params, graph_columns(ops))


STRUCTURES = {"roofline": roofline, "graph": graph}


def structure_of(params: dict) -> str:
    """The cost structure a parameter set selects: graph when its npu_graph_model is on (the same in every draw)."""
    g = np.asarray(params.get("npu_graph_model", 0.0), dtype=float).reshape(-1)
    if len(g) and (g > 0.5).any() and not (g > 0.5).all():
        raise NpuMoeError("npu_graph_model differs between parameter draws; draw one structure at a time")
    return "graph" if len(g) and g[0] > 0.5 else "roofline"


def array_priced(platform) -> bool:
    """Whether price_stream covers this platform's cost model (DeviceModel.estimate): both NPU structures, per-op
    roofline and graph-level (STRUCTURES), are priced on arrays, so every modeled platform is (kept for callers
    that ask; a structure added to DeviceModel without an entry here would answer False)."""
    return not getattr(platform.cpu, "graph_model", False)


def price_stream(params: dict, stream, structure: str | None = None) -> np.ndarray:
    """Modeled seconds (D, N) of every op of `stream` (an OpStream, or a dict of its columns) under each of the D
    draws in `params` (scalars: D = 1). `structure`: None = the parameters' own (structure_of); with a
    `noise_factor` (D,) in params each draw's seconds are multiplied by it (the predictive-noise hook)."""
    structure = structure_of(params) if structure is None else structure
    if structure not in STRUCTURES:
        raise NpuMoeError(f"unknown cost structure {structure!r}; use one of {', '.join(STRUCTURES)}")
    cols = stream.cols if hasattr(stream, "cols") else stream
    cost = STRUCTURES[structure]
    D = max(np.size(v) for k, v in params.items() if not k.endswith("_throughput_curve"))
    out = np.empty((D, len(cols["role"])))
    keys = ROOFLINE_COLUMNS if structure == "roofline" else tuple(cols)     # what the structure reads
    for role in (NPU, CPU):
        sel = cols["role"] == role
        if sel.any():
            out[:, sel] = cost(params, role, {k: np.asarray(cols[k])[sel] for k in keys})
    if "noise_factor" in params:
        out *= _param(params, "noise_factor")
    return out


__all__ = ["array_priced", "platform_params", "parameter_draws", "draws_source", "price_stream", "roofline", "graph",
           "graph_columns", "structure_of", "STRUCTURES", "INTERVAL", "NOISE_FIELDS"]
