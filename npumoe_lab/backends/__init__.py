"""Executing backends (they depend on `graphs`; the cost model in `devices` does not): what executes a resident group's static graph when it is not torch in this process (the engine's default):
the NPU stand-in of a measured run.

`onnxruntime`: the same group exported to ONNX at its static shape, one cached InferenceSession per graph.
`coreml` (macOS): the group's Core ML package (`cap<C>` function) on the ANE via CPU_AND_NE.
Both take x [G, C, H] and return y [G, C, H]; the engine's clock times the call.
"""
from __future__ import annotations

import tempfile
from pathlib import Path

import torch

from npumoe_lab.errors import NpuMoeError
from npumoe_lab.graphs.coreml import CoreMLOptions, build_group_package, group_function_name

NPU_BACKENDS = ("torch", "onnxruntime", "coreml")


class OnnxBackend:
    name = "onnxruntime"

    def __init__(self, threads: int = 2):
        from npumoe_lab.backends.onnxruntime import OnnxRuntimeDevice  # lazy: onnxruntime is an optional, heavy dependency
        self.device = OnnxRuntimeDevice(threads=threads)

    def compile(self, layer, group_id, capacity, weights):
        return self.device.compile_group(layer, group_id, int(capacity), weights.to(torch.float32).contiguous())

    def run(self, handle, x):
        return self.device.run(handle, x)[0]


class CoreMLBackend:
    name = "coreml"

    def __init__(self, compute_units: str = "CPU_AND_NE", out_dir=None, layout: str = "conv"):
        from npumoe_lab.backends.coreml import CoreMLDevice  # lazy: only on a Mac (coremltools' runtime)
        self.device = CoreMLDevice(compute_units)      # raises a clear NpuMoeError off macOS
        self.options = CoreMLOptions(layout=layout)
        self.out_dir = Path(out_dir or tempfile.mkdtemp(prefix="npumoe-coreml-"))

    def compile(self, layer, group_id, capacity, weights):
        path = build_group_package(weights.to(torch.float32), [int(capacity)],
                                   self.out_dir / f"layer{layer}-group{group_id}.mlpackage", self.options)
        return self.device.load(path, group_function_name(int(capacity)))

    def run(self, handle, x):
        y, _ = self.device.run_group(handle, x.detach().float().numpy(), self.options.layout)
        return torch.from_numpy(y).to(x.dtype)


def get_npu_backend(name: str):
    """An external backend by name ("torch" is the engine's in-process path and needs no object)."""
    if name == "onnxruntime":
        return OnnxBackend()
    if name == "coreml":
        return CoreMLBackend()
    raise NpuMoeError(f"unknown NPU backend {name!r}; valid backends: {', '.join(NPU_BACKENDS)}")
