"""ONNX Runtime device: the static group graphs run as real ONNX graphs (one InferenceSession per graph and
capacity, cached), timed for real (timing_source="measured"). CPU here; the execution provider is configurable
(e.g. CoreMLExecutionProvider on a Mac, CUDAExecutionProvider elsewhere).

    dev = OnnxRuntimeDevice()
    h = dev.compile(spec, weights)          # spec: graphs.spec.GroupGraphSpec, weights: ExpertWeights of its experts
    y, wall_s = dev.run(h, x)               # x [G, C, H] numpy or torch (C one of spec.capacities)
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from npumoe_lab.errors import NpuMoeError
from npumoe_lab.graphs.cache import GraphCache, artifact_key, weights_digest
from npumoe_lab.graphs.onnx import export_group
from npumoe_lab.graphs.spec import GroupGraphSpec, canonical

TIMING_SOURCE = "measured"


def require_onnxruntime():
    try:
        import onnxruntime
    except ImportError as exc:
        raise NpuMoeError("onnxruntime is not installed; install it with `pip install 'npumoe-lab[onnx]'` "
                          "or run the variant on the torch CPU path") from exc
    return onnxruntime


@dataclass
class OnnxGroupHandle:
    spec: object
    paths: dict                                  # capacity -> .onnx path
    sessions: dict = field(default_factory=dict)  # capacity -> InferenceSession
    cache_hit: bool = False


class OnnxRuntimeDevice:
    name = "onnxruntime"
    timing_source = TIMING_SOURCE

    def __init__(self, providers=("CPUExecutionProvider",), threads: int = 1, cache: GraphCache | None = None):
        ort = require_onnxruntime()
        available = ort.get_available_providers()
        missing = [p for p in providers if p not in available]
        if missing:
            raise NpuMoeError(f"ONNX Runtime execution provider(s) {missing} are not available here; "
                              f"choose from {available}")
        self.providers, self.threads = list(providers), int(threads)
        self.cache = cache or GraphCache()
        self._sessions = {}  # path -> session, shared by handles of identical graphs

    def _session(self, path: Path):
        key = str(path)
        if key not in self._sessions:
            ort = require_onnxruntime()
            opts = ort.SessionOptions()
            opts.intra_op_num_threads = self.threads
            opts.inter_op_num_threads = 1
            opts.log_severity_level = 3
            self._sessions[key] = ort.InferenceSession(key, sess_options=opts, providers=self.providers)
        return self._sessions[key]

    def compile(self, spec, weights) -> OnnxGroupHandle:
        """Export (or fetch from the cache) the group graph at each of spec.capacities and open its sessions."""
        if weights.n_experts != len(spec.experts):
            raise NpuMoeError(f"group {spec.name} has {len(spec.experts)} experts but the weights hold "
                              f"{weights.n_experts}; pass weights.select(spec.experts)")
        digest = weights_digest(*canonical(weights))
        paths, hits = {}, []
        for cap in spec.capacities:
            key = artifact_key("onnx-group", digest, [len(spec.experts), int(cap), spec.hidden, spec.intermediate],
                               {"act": weights.act, "alpha": weights.alpha, "limit": weights.limit})
            path, hit = self.cache.get_or_build(key, lambda p, c=cap: export_group(weights, c, p), ".onnx")
            paths[int(cap)], hits = path, hits + [hit]
        handle = OnnxGroupHandle(spec, paths, cache_hit=all(hits))
        handle.sessions = {c: self._session(p) for c, p in paths.items()}
        return handle

    def compile_group(self, layer: int, group_id: int, capacities, weights) -> OnnxGroupHandle:
        """compile() without building a spec: `weights` are the group's own ExpertWeights (weights.select(experts)),
        capacities an int or the capacities the engine will pack to."""
        caps = (int(capacities),) if isinstance(capacities, int) else tuple(int(c) for c in capacities)
        has_bias = any(b is not None for b in canonical(weights)[3:])
        spec = GroupGraphSpec(int(layer), int(group_id), tuple(range(weights.n_experts)), caps, weights.hidden,
                              weights.intermediate, weights.act, has_bias)
        return self.compile(spec, weights)

    def run(self, handle: OnnxGroupHandle, x):
        """x [G, C, H] -> (y [G, C, H] of the same kind as x, measured wall seconds of the session call)."""
        is_torch = torch.is_tensor(x)
        arr = x.detach().to(torch.float32).cpu().numpy() if is_torch else np.asarray(x, dtype=np.float32)
        spec = handle.spec
        if arr.ndim != 3 or arr.shape[0] != len(spec.experts) or arr.shape[2] != spec.hidden \
                or arr.shape[1] not in handle.sessions:
            raise NpuMoeError(f"group {spec.name} takes x [G={len(spec.experts)}, C in {sorted(handle.sessions)}, "
                              f"H={spec.hidden}], got {list(arr.shape)}; pack to one of the compiled capacities")
        sess = handle.sessions[arr.shape[1]]
        arr = np.ascontiguousarray(arr)
        t0 = time.perf_counter()
        (y,) = sess.run(["y"], {"x": arr})
        wall = time.perf_counter() - t0
        return (torch.from_numpy(y).to(x.dtype) if is_torch else y), wall


class OnnxGroupRunner:
    """One group graph as a callable: `runner(x) -> (y, wall_s)`; what the engine's npumoe-tg/npumoe variants
    call for a resident group when the NPU stand-in is ONNX Runtime."""

    def __init__(self, spec, weights, device: OnnxRuntimeDevice | None = None):
        self.device = device or OnnxRuntimeDevice()
        self.handle = self.device.compile(spec, weights)

    def __call__(self, x):
        return self.device.run(self.handle, x)
