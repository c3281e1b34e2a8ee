"""Static validation of built Core ML graphs on Linux: op census against an ANE-friendly allow-list, static fp16
I/O, finite fp16 constants, axis and graph-size limits of the platform profile (ANCHORS 3.8), and a NumPy
re-execution of the stored weights against the workbench's expert path."""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from npumoe_lab.errors import NpuMoeError
from npumoe_lab.core.packing import group_ffn
from npumoe_lab.graphs.milnumpy import load_program, run_function
from npumoe_lab.graphs.modules import from_layout, to_layout
from npumoe_lab.graphs.spec import Limits, canonical

# Ops that map to the ANE in our graphs. Everything else is a violation: topk (RCAS error), gather/scatter
# (CPU only), slice_update, nonzero, int index math stay on the host (ANCHORS 1, 3.8).
ANE_OPS = frozenset({
    "conv", "matmul", "linear", "add", "sub", "mul", "real_div", "pow", "maximum", "minimum", "silu", "sigmoid",
    "clip", "softmax", "rsqrt", "sqrt", "reshape", "transpose", "expand_dims", "squeeze", "concat",
    "slice_by_index", "reduce_mean", "reduce_sum", "layer_norm", "cast", "identity",
    "read_state", "coreml_update_state",
})
# Re-execution tolerance per weight compression. LUT palettization is lossy by design (its accuracy cost is measured
# by the accuracy harness), so its error is reported as a warning, not a failure.
TOLERANCE = {None: 1e-2, "int8": 3e-2}


@dataclass
class GraphReport:
    graph: str
    function: str
    ops: dict = field(default_factory=dict)
    weight_bytes: int = 0
    violations: list = field(default_factory=list)
    warnings: list = field(default_factory=list)
    rel_err: float | None = None

    @property
    def ok(self) -> bool:
        return not self.violations


def _types():
    from coremltools.converters.mil.mil import types
    return types


def check_function(prog, function: str, graph: str, limits: Limits) -> GraphReport:
    """Census and static checks of one function of a MIL program."""
    types = _types()
    fn = prog.functions[function]
    rep = GraphReport(graph, function)
    ops = Counter(op.op_type for op in fn.operations)
    rep.ops = dict(sorted(ops.items()))
    for name, var in fn.inputs.items():
        if types.is_state(var.sym_type):
            continue
        _check_var(rep, f"input {name}", var, limits, types)
    for var in fn.outputs:
        _check_var(rep, f"output {var.name}", var, limits, types)
    for op in fn.operations:
        if op.op_type == "const" or op.op_type.startswith("constexpr_"):
            val = op.outputs[0].val if op.op_type == "const" else None
            if isinstance(val, np.ndarray) and val.size > 1:
                rep.weight_bytes += val.nbytes
            elif op.op_type.startswith("constexpr_"):
                rep.weight_bytes += sum(v.val.nbytes for v in op.inputs.values() if isinstance(v.val, np.ndarray))
            if val is not None and np.asarray(val).dtype.kind == "f" and not np.all(np.isfinite(val)):
                rep.violations.append(f"const {op.name} holds a non-finite fp16 value (use finite bounds, e.g. -1e4)")
            continue
        if op.op_type not in ANE_OPS:
            rep.violations.append(f"op {op.op_type} ({op.name}) is not on the ANE allow-list (keep it on the host)")
        if op.op_type == "slice_by_index" and op.inputs["begin"].val is None:
            rep.violations.append(f"slice_by_index {op.name} has a dynamic begin (copies, CPU only)")
        for out in op.outputs:
            if types.is_int(out.dtype) or types.is_bool(out.dtype):
                rep.violations.append(f"op {op.op_type} ({op.name}) produces {types.builtin_to_string(out.dtype)} "
                                      "(int/bool tensors do not run on the ANE)")
            elif types.is_float(out.dtype) and out.dtype != types.fp16:
                rep.violations.append(f"op {op.op_type} ({op.name}) computes in {types.builtin_to_string(out.dtype)} "
                                      "(the ANE computes fp16; convert with compute_precision FLOAT16)")
            if out.shape is not None:
                _check_shape(rep, f"{op.op_type} {op.name}", out.shape, limits)
    if rep.weight_bytes > limits.graph_limit_bytes:
        rep.violations.append(f"weights {rep.weight_bytes:,} B exceed the graph limit {limits.graph_limit_bytes:,} B "
                              f"by {rep.weight_bytes - limits.graph_limit_bytes:,} B")
    return rep


def _check_var(rep, what, var, limits, types):
    if var.dtype != types.fp16:
        rep.violations.append(f"{what} is {types.builtin_to_string(var.dtype)}, not fp16")
    _check_shape(rep, what, var.shape, limits)
    if var.shape and all(isinstance(s, (int, np.integer)) for s in var.shape) and (var.shape[-1] * 2) % 64:
        rep.warnings.append(f"{what} last axis {var.shape[-1]} x 2 B is not 64-byte aligned (padded on the ANE)")


def _check_shape(rep, what, shape, limits):
    if any(not isinstance(s, (int, np.integer)) for s in shape):
        rep.violations.append(f"{what} has a symbolic shape {shape} (static shapes only)")
        return
    for axis, (s, lim) in enumerate(zip(shape, limits.axis_limits(len(shape)))):
        if s > lim:
            rep.violations.append(f"{what} axis {axis} is {s} > {lim} (NPU axis limit)")


def reference_group_ffn(x, w) -> np.ndarray:
    """The contract's expert math in NumPy fp32: x [G,C,H] -> [G,C,H] (DESIGN.md, model layer)."""
    f = lambda t: None if t is None else np.asarray(t.detach().float().numpy() if hasattr(t, "detach") else t, np.float32)  # noqa: E731
    wg, wu, wd, bg, bu, bd = (f(t) for t in canonical(w))
    x = np.asarray(x, np.float32)
    g, u = x @ wg, x @ wu
    if bg is not None:
        g = g + bg[:, None, :]
    if bu is not None:
        u = u + bu[:, None, :]
    if w.act == "swiglu":
        h = g / (1.0 + np.exp(-g)) * u
    else:
        g, u = np.minimum(g, w.limit), np.clip(u, -w.limit, w.limit)
        h = (u + 1.0) * g / (1.0 + np.exp(-w.alpha * g))
    y = h @ wd
    return y + bd[:, None, :] if bd is not None else y


def workbench_group_ffn(x, w) -> np.ndarray:
    """The workbench's own expert path (packing.group_ffn) when present, else the contract math."""
    if not hasattr(w, "gate_up"):  # not a models.weights.ExpertWeights
        return reference_group_ffn(x, w)
    with torch.no_grad():
        return group_ffn(torch.as_tensor(x), w).float().numpy()


def rel_err(a, b) -> float:
    return float(np.abs(np.asarray(a, np.float32) - b).max() / max(np.abs(b).max(), 1e-12))


def validate_group_package(path, spec, weights, layout: str, limits: Limits | None = None, compression=None,
                           seed: int = 0, prog=None) -> list[GraphReport]:
    """Validate every function (capacity) of a group package; re-executes each in NumPy vs the workbench path."""
    limits = limits or Limits()
    tol = TOLERANCE.get(compression)
    prog = prog or load_program(path)
    reports = []
    for cap in spec.capacities:
        fname = f"cap{int(cap)}"
        if fname not in prog.functions:
            raise NpuMoeError(f"{path} has no function {fname}; rebuild it (functions: {sorted(prog.functions)})")
        rep = check_function(prog, fname, spec.name, limits)
        rng = np.random.default_rng(seed)
        x = rng.standard_normal((len(spec.experts), int(cap), spec.hidden)).astype(np.float16).astype(np.float32)
        out = run_function(prog, fname, {"x": to_layout(x, layout)})["y"]
        rep.rel_err = rel_err(from_layout(out, layout, len(spec.experts)), workbench_group_ffn(x, weights))
        if not np.isfinite(rep.rel_err) or (tol is not None and rep.rel_err > tol):
            rep.violations.append(f"NumPy re-execution differs from the expert path: rel err {rep.rel_err:.3g} > {tol}")
        elif tol is None:
            rep.warnings.append(f"{compression} weights: re-execution rel err {rep.rel_err:.3g} vs fp32 weights")
        reports.append(rep)
    return reports


def raise_on_violations(reports, where: str = "") -> None:
    bad = [f"{r.graph}/{r.function}: {v}" for r in reports for v in r.violations]
    if bad:
        more = f" (+{len(bad) - 5} more)" if len(bad) > 5 else ""
        raise NpuMoeError(f"graph validation failed{' for ' + where if where else ''}: " + "; ".join(bad[:5]) + more
                          + "; fix the builder options or the plan")


def package_size(path) -> int:
    p = Path(path)
    return sum(f.stat().st_size for f in p.rglob("*") if f.is_file()) if p.is_dir() else p.stat().st_size
