"""ONNX export of the same static modules (one .onnx file per shape: ONNX has no multifunction packages).

Uses the TorchScript exporter (`dynamo=False`): 0.2 s per group graph here vs 3.6 s for the dynamo exporter,
and without dynamic_axes every shape is static. Graphs are fp32 (ONNX Runtime CPU runs fp32 at torch speed,
ENVIRONMENT 4)."""
from __future__ import annotations

import warnings
from collections import Counter
from pathlib import Path

import numpy as np
import torch

from npumoe_lab.errors import NpuMoeError
from npumoe_lab.graphs.modules import ChunkAttention, GroupFFN, chunk_inputs
from npumoe_lab.graphs.spec import canonical
from npumoe_lab.graphs.validate import rel_err, workbench_group_ffn

OPSET = 18
TOLERANCE = 1e-3        # fp32 graphs against the fp32 expert path
HOST_ONLY_OPS = frozenset({"TopK", "Gather", "GatherElements", "GatherND", "Scatter", "ScatterElements", "ScatterND",
                           "NonZero", "OneHot", "CumSum", "ArgMax", "ArgMin", "Loop", "If"})


def require_onnx():
    try:
        import onnx
    except ImportError as exc:
        raise NpuMoeError("onnx is not installed, so ONNX graphs cannot be built; install it with "
                          "`pip install 'npumoe-lab[onnx]'`") from exc
    return onnx


def _export(module, args, out: Path, input_names, output_names) -> Path:
    require_onnx()
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        torch.onnx.export(module, args, str(out), input_names=input_names, output_names=output_names,
                          opset_version=OPSET, dynamo=False, do_constant_folding=True)
    return out


def export_group(weights, capacity: int, out) -> Path:
    """x [G, C, H] -> y [G, C, H] for the experts in `weights` (ExpertWeights of the group) at capacity C."""
    module = GroupFFN(*canonical(weights), act=weights.act, alpha=weights.alpha, limit=weights.limit, layout="bmm")
    return _export(module.eval(), (module.example_input(int(capacity)),), out, ["x"], ["y"])


def export_attention(attn: torch.nn.Module, chunk: int, context: int, out, rope_theta: float = 10000.0) -> Path:
    """ChunkAttention with the KV cache as inputs/outputs (ONNX has no states): inputs x, cos, sin, mask, write,
    k_cache, v_cache; outputs y, k_cache_out, v_cache_out."""
    module = ChunkAttention(attn, context, kv="io").eval()
    cos, sin, mask, write = chunk_inputs(range(int(chunk)), context, module.head_dim, rope_theta)
    cache = torch.zeros(1, module.n_kv, int(context), module.head_dim)
    args = (torch.zeros(1, int(chunk), module.q_proj.in_features), cos, sin, mask, write, cache, cache.clone())
    return _export(module, args, out, ["x", "cos", "sin", "mask", "write", "k_cache", "v_cache"],
                   ["y", "k_cache_out", "v_cache_out"])


def census(path) -> dict:
    """Op counts of an .onnx file, plus the violations of the static-graph rules (host-only ops, symbolic dims)."""
    onnx = require_onnx()
    model = onnx.load(str(path))
    ops = Counter(n.op_type for n in model.graph.node)
    violations = [f"op {op} belongs on the host" for op in sorted(ops) if op in HOST_ONLY_OPS]
    for v in list(model.graph.input) + list(model.graph.output):
        dims = v.type.tensor_type.shape.dim
        if any(not d.HasField("dim_value") for d in dims):
            violations.append(f"{v.name} has a symbolic shape (static shapes only)")
    return {"ops": dict(sorted(ops.items())), "violations": violations}


def rerun_group(path, weights, capacity: int, seed: int = 0) -> dict:
    """Re-execute a group graph in ONNX Runtime on random input against the workbench's expert path: {rel_err,
    violations, warnings} (no onnxruntime: not re-executed, said as a warning)."""
    try:
        import onnxruntime as ort
    except ImportError:
        return {"rel_err": None, "violations": [], "warnings": ["onnxruntime not installed: graph not re-executed"]}
    x = np.random.default_rng(seed).standard_normal((weights.n_experts, int(capacity), weights.hidden)).astype(np.float32)
    (y,) = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(["y"], {"x": x})
    err = rel_err(y, workbench_group_ffn(x, weights))
    bad = [] if np.isfinite(err) and err <= TOLERANCE else [
        f"ONNX Runtime re-execution differs from the expert path: rel err {err:.3g} > {TOLERANCE}"]
    return {"rel_err": err, "violations": bad, "warnings": []}
