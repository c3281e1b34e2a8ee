"""Re-execute a saved Core ML program in NumPy from its stored weights (Core ML cannot run on Linux; ENVIRONMENT 2).

`load_program(path)` reads an .mlpackage back through coremltools' MIL proto loader (weights from the package's
weight blob), `run_function(prog, name, inputs, states)` interprets its ops one by one with NumPy. Arithmetic is
fp32 with each op's result rounded to its stored dtype (fp16), which mimics an fp16 device closely enough for
rel 1e-2 checks. Only the ops our graphs contain are implemented; any other op raises, so a silent mismatch
cannot hide behind a missing op."""
from __future__ import annotations

import numpy as np

from npumoe_lab.errors import NpuMoeError
from npumoe_lab.graphs.coreml import require_coremltools


def load_program(path):
    """The MIL program stored in an .mlpackage (all functions of a multifunction package)."""
    ct = require_coremltools()
    from coremltools.converters.mil.frontend.milproto.load import load
    model = ct.models.MLModel(str(path), skip_model_load=True)
    spec = model.get_spec()
    return load(spec, specification_version=spec.specificationVersion, file_weights_dir=model.weights_dir)


def _conv(x, weight, bias=None, strides=(1, 1), pad_type="valid", pad=(0, 0, 0, 0), dilations=(1, 1), groups=1):
    if weight.shape[2:] != (1, 1) or tuple(strides) != (1, 1) or any(pad):
        raise NpuMoeError(f"NumPy re-execution handles 1x1 stride-1 unpadded conv only, got weight {weight.shape}")
    n, cin, h, w = x.shape
    g = int(groups)
    wt = weight.reshape(g, weight.shape[0] // g, cin // g)                    # [G, out/G, in/G]
    xs = x.reshape(n, g, cin // g, h * w)                                      # [N, G, in/G, HW]
    y = np.einsum("goi,ngip->ngop", wt, xs).reshape(n, weight.shape[0], h, w)
    return y if bias is None else y + bias.reshape(1, -1, 1, 1)


def _softmax(x, axis=-1):
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


def _slice(x, begin, end, stride=None, begin_mask=None, end_mask=None, squeeze_mask=None, **_):
    idx = []
    for d in range(x.ndim):
        b = None if begin_mask is not None and begin_mask[d] else int(begin[d])
        e = None if end_mask is not None and end_mask[d] else int(end[d])
        idx.append(slice(b, e, int(stride[d]) if stride is not None else 1))
    y = x[tuple(idx)]
    if squeeze_mask is not None and any(squeeze_mask):
        y = y.squeeze(tuple(i for i, s in enumerate(squeeze_mask) if s))
    return y


def _reduce(fn):
    def op(x, axes=None, keep_dims=False):
        return fn(x, axis=None if axes is None else tuple(int(a) for a in np.atleast_1d(axes)), keepdims=bool(keep_dims))
    return op


def _matmul(x, y, transpose_x=False, transpose_y=False):
    return np.matmul(np.swapaxes(x, -1, -2) if transpose_x else x, np.swapaxes(y, -1, -2) if transpose_y else y)


OPS = {
    "conv": _conv,
    "matmul": _matmul,
    "linear": lambda x, weight, bias=None: x @ weight.T + (0 if bias is None else bias),
    "add": lambda x, y: x + y, "sub": lambda x, y: x - y, "mul": lambda x, y: x * y,
    "real_div": lambda x, y: x / y, "pow": lambda x, y: np.power(x, y),
    "maximum": lambda x, y: np.maximum(x, y), "minimum": lambda x, y: np.minimum(x, y),
    "silu": lambda x: x / (1.0 + np.exp(-x)), "sigmoid": lambda x: 1.0 / (1.0 + np.exp(-x)),
    "rsqrt": lambda x, epsilon=1e-12: 1.0 / np.sqrt(x + epsilon), "sqrt": lambda x: np.sqrt(x),
    "clip": lambda x, alpha, beta: np.clip(x, alpha, beta),
    "softmax": _softmax,
    "reshape": lambda x, shape: x.reshape(tuple(int(s) for s in shape)),
    "transpose": lambda x, perm: np.transpose(x, tuple(int(p) for p in perm)),
    "expand_dims": lambda x, axes: np.expand_dims(x, tuple(int(a) for a in axes)),
    "squeeze": lambda x, axes=None: np.squeeze(x, None if axes is None else tuple(int(a) for a in axes)),
    "concat": lambda values, axis, interleave=False: np.concatenate(values, axis=int(axis)),
    "slice_by_index": _slice,
    "reduce_mean": _reduce(np.mean), "reduce_sum": _reduce(np.sum),
    "cast": lambda x, dtype: x.astype({"fp16": np.float16, "fp32": np.float32}.get(str(dtype), np.float32)),
    "identity": lambda x: x,
}


def _val(var, env):
    if isinstance(var, (list, tuple)):
        return [_val(v, env) for v in var]
    if var.name in env:
        return env[var.name]
    if var.val is not None:
        return var.val
    raise NpuMoeError(f"NumPy re-execution: value {var.name!r} is neither computed nor constant")


def _store_dtype(var):
    from coremltools.converters.mil.mil import types
    t = var.dtype
    return np.float16 if t == types.fp16 else np.float32 if t == types.fp32 else None


def run_function(prog, function: str, inputs: dict, states: dict | None = None) -> dict:
    """Interpret `function` of `prog` on NumPy `inputs` (by input name). `states` (name -> array) is updated in
    place by the graph's state writes. Returns {output name: float32 array}."""
    if function not in prog.functions:
        raise NpuMoeError(f"function {function!r} not in the program; it has {sorted(prog.functions)}")
    fn = prog.functions[function]
    env = {}
    states = states if states is not None else {}
    for name, var in fn.inputs.items():
        if name in inputs:
            env[name] = np.asarray(inputs[name], dtype=np.float16).astype(np.float32)
        elif name in states:
            env[name] = states[name]  # a state handle: resolved by read_state / coreml_update_state
        else:
            raise NpuMoeError(f"function {function!r} needs input {name!r}; got {sorted(inputs)}")
    for op in fn.operations:
        out = op.outputs[0] if op.outputs else None
        if op.op_type == "const" or op.op_type.startswith("constexpr_"):
            # stored (possibly compressed) weights: coremltools' own decompression of the stored blob
            val = op.outputs[0].val if op.op_type == "const" else op.materialized_val_inference()
            env[out.name] = np.asarray(val)
            continue
        args = {k: _val(v, env) for k, v in op.inputs.items()}
        if op.op_type == "read_state":
            res = np.asarray(states[op.inputs["input"].name], np.float32)
        elif op.op_type == "coreml_update_state":
            states[op.inputs["state"].name] = np.asarray(args["value"], np.float16).astype(np.float32)
            res = args["value"]
        elif op.op_type in OPS:
            args = {k: (np.asarray(v, np.float32) if isinstance(v, np.ndarray) and v.dtype.kind == "f" else v)
                    for k, v in args.items()}
            res = OPS[op.op_type](**args)
        else:
            raise NpuMoeError(f"NumPy re-execution has no implementation of MIL op {op.op_type!r} ({op.name}); "
                              "add it to graphs/milnumpy.py OPS")
        dt = _store_dtype(out)
        res = np.asarray(res)
        env[out.name] = res.astype(dt).astype(np.float32) if dt is not None else res
    return {o.name: np.asarray(env[o.name], np.float32) for o in fn.outputs}
