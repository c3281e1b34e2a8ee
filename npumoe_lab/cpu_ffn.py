"""Expert FFNs on the CPU with weights pre-packed once, the way a CPU inference runtime holds them.

oneDNN's matmul wants its B operand in a blocked (VNNI) layout. Handed plain weights it re-lays them out on every
call, which at prefill row counts costs a large part of the GEMM. Packing each expert's two matrices once
(`torch.ops.mkldnn._reorder_linear_weight`, what torch.compile's CPU freezing does) lets every later call stream
the packed weights. `bench/gemm_forms.py` measures the forms side by side (bench/RESULTS.md): on the project VM
(Zen 4, 2 threads, 32 experts' weights streamed from DRAM) packed bf16 expert GEMMs run 1.1-1.2x faster than one
bmm over the group at 32-64 rows per expert, and fp32 ones about 2x faster than F.linear.
A row's result does not depend on the values of the other rows, so a caller may compute only the rows it needs;
oneDNN's blocking and thread split do depend on the row count, so two row counts can differ by a rounding.

`PackedExperts.ffn(e, x, out)` is HF's expert math for expert `e` on the rows `x` ([M, H] -> [M, H]); the
gate is the family's own (`ExpertWeights.apply_gate`), SwiGLU done in place. Where oneDNN cannot pack this dtype
(fp16 without AVX512-FP16, a build without mkldnn) or autograd needs a graph, it runs plain F.linear on views of
the model's own weights: same math, no copies.
"""
from __future__ import annotations

import functools

import torch

from .models.weights import ExpertWeights

KERNELS = ("auto", "onednn", "torch")


@functools.lru_cache(maxsize=None)
def onednn_packs(dtype: torch.dtype) -> bool:
    """True when this torch build and CPU run oneDNN linear on pre-packed weights of `dtype` (probed once)."""
    try:
        w, x = torch.ones(16, 32, dtype=dtype), torch.ones(4, 32, dtype=dtype)
        y = torch.ops.mkldnn._linear_pointwise(x, torch.ops.mkldnn._reorder_linear_weight(w, 4), None, "none", [], "")
        return bool((y.float() == 32).all())
    except (RuntimeError, AttributeError, NotImplementedError):
        return False


def resolve_kernel(kernel: str, dtype: torch.dtype) -> str:
    if kernel not in KERNELS:
        from .errors import NpuMoeError
        raise NpuMoeError(f"cpu_kernel={kernel!r} is not a CPU expert kernel; use one of {KERNELS}")
    if kernel == "auto":
        return "onednn" if onednn_packs(dtype) else "torch"
    return kernel


def _is_hf_swiglu(w: ExpertWeights) -> bool:
    from .packing import _is_hf_swiglu as check
    return check(w)


class PackedExperts:
    """Every expert of one layer, each matrix in F.linear orientation ([N, K]), packed for oneDNN when
    `kernel` allows. Memory: one packed copy of the layer's expert weights (none for kernel="torch")."""

    def __init__(self, weights: ExpertWeights, kernel: str = "auto", rows_hint: int = 128):
        self.w = weights
        self.kernel = resolve_kernel(kernel, weights.gate_up.dtype)
        self.swiglu = _is_hf_swiglu(weights)
        # F.linear orientation: gate_up [E, H, 2I] -> per expert [2I, H]; HF's [E, 2I, H] storage makes this a view
        self._gu = weights.gate_up.transpose(1, 2)
        self._dn = weights.down.transpose(1, 2)
        self._packed = None
        if self.kernel == "onednn":
            with torch.no_grad():
                pk = torch.ops.mkldnn._reorder_linear_weight
                self._packed = [(pk(self._gu[e].contiguous(), rows_hint), pk(self._dn[e].contiguous(), rows_hint))
                                for e in range(weights.n_experts)]

    @property
    def n_experts(self) -> int:
        return self.w.n_experts

    def _linear(self, x, e, which):
        bias = (self.w.b_gate_up if which == 0 else self.w.b_down)
        b = None if bias is None else bias[e]
        if self._packed is not None and not (torch.is_grad_enabled() and x.requires_grad):
            return torch.ops.mkldnn._linear_pointwise(x, self._packed[e][which], b, "none", [], "")
        return torch.nn.functional.linear(x, (self._gu if which == 0 else self._dn)[e], b)

    def ffn(self, e: int, x: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        """Expert e on rows x [M, H] (any row stride), written into `out` [M, H] when given."""
        h = self._linear(x, e, 0)
        if self.swiglu and not h.requires_grad:
            i = h.shape[-1] // 2
            a = torch.mul(torch.nn.functional.silu(h[:, :i], inplace=True), h[:, i:])   # HF's act(gate) * up
        else:
            a = self.w.apply_gate(h)
        y = self._linear(a.contiguous(), e, 1)
        return y if out is None else out.copy_(y)

    def ffn_rows(self, packed: torch.Tensor, spans, out: torch.Tensor) -> torch.Tensor:
        """Experts over row spans of a packed buffer: spans = [(expert, first row, n rows)]; rows outside every
        span are left untouched (padding the caller never reads)."""
        for e, start, n in spans:
            if n > 0:
                self.ffn(e, packed[start:start + n], out[start:start + n])
        return out


__all__ = ["PackedExperts", "onednn_packs", "resolve_kernel", "KERNELS"]
