"""Core ML builders: ct.convert of the static modules to fp16 ML programs (iOS 18 target: multifunction and states),
one multifunction package per group (one function per capacity tier, weights stored once: ANCHORS 3.4) and
per attention layer (one function per chunk length), optional int8 / LUT weight compression (ANCHORS 3.6).
Conversion works on Linux; running needs macOS (backends/coreml.py)."""
from __future__ import annotations

import contextlib
import io
import logging
import shutil
import tempfile
import warnings
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch

from npumoe_lab.errors import NpuMoeError
from npumoe_lab.graphs.modules import LAYOUTS, ChunkAttention, GroupFFN, chunk_inputs
from npumoe_lab.graphs.spec import canonical

COMPRESSIONS = (None, "int8", "lut4", "lut6", "lut8")
COMPUTE_UNITS = ("CPU_AND_NE", "CPU_ONLY", "CPU_AND_GPU", "ALL")


def require_coremltools():
    """Import coremltools quietly, or explain how to get it."""
    logging.getLogger("coremltools").setLevel(logging.ERROR)  # Linux: 'Failed to load _MLModelProxy' x8, expected
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            import coremltools as ct
    except ImportError as exc:
        raise NpuMoeError("coremltools is not installed, so Core ML graphs cannot be built; install it with "
                          "`pip install 'npumoe-lab[coreml]'` (coremltools==9.0) or use --target onnx") from exc
    return ct


@dataclass(frozen=True)
class CoreMLOptions:
    layout: str = "conv"                 # channels-first 1x1 conv (ANE-preferred); "bmm" for batched matmul
    compression: str | None = None       # None | int8 | lut4 | lut6 | lut8
    lut_group_size: int = 16             # per-grouped-channel LUTs; 8-16 keep accuracy and speed (ANCHORS 3.6)
    compute_units: str = "CPU_AND_NE"    # stored as the package default; backends/coreml.py can override at load

    def __post_init__(self):
        if self.layout not in LAYOUTS:
            raise NpuMoeError(f"unknown layout {self.layout!r}; use one of {LAYOUTS}")
        if self.compute_units not in COMPUTE_UNITS:
            raise NpuMoeError(f"unknown compute units {self.compute_units!r}; use one of {COMPUTE_UNITS}")
        if self.compression not in COMPRESSIONS:
            raise NpuMoeError(f"unknown compression {self.compression!r}; use one of {COMPRESSIONS[1:]} or none")

    def key(self) -> dict:
        return asdict(self)


@contextlib.contextmanager
def _quiet():
    """coremltools draws unconditional tqdm bars per conversion pass; keep them out of our own progress output."""
    with warnings.catch_warnings(), contextlib.redirect_stderr(io.StringIO()):
        warnings.simplefilter("ignore")
        yield


def _convert(ct, traced, inputs, outputs, states, options: CoreMLOptions):
    with _quiet():
        ml = ct.convert(traced, inputs=inputs, outputs=outputs, states=states or None, convert_to="mlprogram",
                        compute_precision=ct.precision.FLOAT16, minimum_deployment_target=ct.target.iOS18,
                        compute_units=getattr(ct.ComputeUnit, options.compute_units))
    return _compress(ct, ml, options)


def _compress(ct, ml, options: CoreMLOptions):
    if options.compression is None:
        return ml
    opt = ct.optimize.coreml
    if options.compression == "int8":
        cfg = opt.OpLinearQuantizerConfig(mode="linear_symmetric", dtype="int8", granularity="per_channel",
                                          weight_threshold=2048)
        with _quiet():
            return opt.linear_quantize_weights(ml, config=opt.OptimizationConfig(global_config=cfg))
    nbits = int(options.compression[3:])
    cfg = opt.OpPalettizerConfig(mode="uniform", nbits=nbits, granularity="per_grouped_channel",
                                 group_size=options.lut_group_size, weight_threshold=2048)
    with _quiet():
        return opt.palettize_weights(ml, config=opt.OptimizationConfig(global_config=cfg))


def _tensor(ct, name, shape):
    return ct.TensorType(name=name, shape=tuple(int(s) for s in shape), dtype=np.float16)


def _save_multifunction(ct, models: dict, out: Path, default: str) -> Path:
    """Save {function name: MLModel} as one package; identical weights are stored once."""
    tmp = Path(tempfile.mkdtemp(prefix="npumoe-mf-"))
    try:
        desc = ct.utils.MultiFunctionDescriptor()
        for fname, ml in models.items():
            p = tmp / f"{fname}.mlpackage"
            ml.save(str(p))
            desc.add_function(str(p), src_function_name="main", target_function_name=fname)
        desc.default_function_name = default
        with _quiet():
            ct.utils.save_multifunction(desc, str(out))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def group_function_name(capacity: int) -> str:
    return f"cap{int(capacity)}"


def build_group_package(weights, capacities, out, options: CoreMLOptions = CoreMLOptions()) -> Path:
    """Convert the experts of one group (`weights`: ExpertWeights of those experts) at each capacity into one
    multifunction package at `out` (functions cap<C>, default = the first capacity). I/O: x -> y, fp16,
    in the layout's shape (modules.to_layout)."""
    ct = require_coremltools()
    module = GroupFFN(*canonical(weights), act=weights.act, alpha=weights.alpha, limit=weights.limit,
                      layout=options.layout).eval()
    models = {}
    for cap in capacities:
        x = module.example_input(int(cap))
        with torch.no_grad():
            traced = torch.jit.trace(module, x)
        models[group_function_name(cap)] = _convert(ct, traced, [_tensor(ct, "x", x.shape)],
                                                    [ct.TensorType(name="y", dtype=np.float16)], None, options)
    return _save_multifunction(ct, models, Path(out), group_function_name(capacities[0]))


def attention_function_name(chunk: int) -> str:
    return f"chunk{int(chunk)}"


def build_attention_package(attn: torch.nn.Module, chunks, context: int, out,
                            options: CoreMLOptions = CoreMLOptions(), rope_theta: float = 10000.0) -> Path:
    """Convert the attention sublayer of one layer (an HF attention module) into one package with a function
    per chunk length. Inputs x, cos, sin, mask, write; output y; KV caches are states k_cache, v_cache."""
    ct = require_coremltools()
    module = ChunkAttention(attn, context, kv="state").eval()
    hidden = module.q_proj.in_features
    models = {}
    for s in chunks:
        cos, sin, mask, write = chunk_inputs(range(int(s)), context, module.head_dim, rope_theta)
        ex = (torch.zeros(1, int(s), hidden), cos, sin, mask, write)
        with torch.no_grad():
            traced = torch.jit.trace(module, ex)
        inputs = [_tensor(ct, n, a.shape) for n, a in zip(("x", "cos", "sin", "mask", "write"), ex)]
        states = [ct.StateType(wrapped_type=_tensor(ct, None, module.k_cache.shape), name=n) for n in ("k_cache", "v_cache")]
        models[attention_function_name(s)] = _convert(ct, traced, inputs, [ct.TensorType(name="y", dtype=np.float16)],
                                                      states, options)
    return _save_multifunction(ct, models, Path(out), attention_function_name(chunks[0]))
