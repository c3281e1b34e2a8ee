"""Expert FFNs on the CPU with weights pre-packed once, the way a CPU inference runtime holds them.

oneDNN's matmul wants its B operand in a blocked (VNNI) layout. Handed plain weights it re-lays them out on every
call (at 32 rows per expert, bf16, F.linear took 1.28-1.29x the time of the packed form, below). Packing each
expert's two matrices once (`torch.ops.mkldnn._reorder_linear_weight`, what torch.compile's CPU freezing does)
lets every later call stream the packed weights. `bench/gemm_forms.py` measures the forms side by side
(bench/RESULTS.md): on the project VM (Zen 4, 2 threads, 32 experts' weights streamed from DRAM; two runs) packed
bf16 expert GEMMs ran 1.22-1.37x / 1.10-1.11x / 1.03-1.05x / 1.00-1.01x as fast as one bmm over the group at
32 / 64 / 128 / 256 rows per expert, fp32 ones 1.16-1.39x.
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

from npumoe_lab.errors import NpuMoeError
from npumoe_lab.models.weights import ExpertWeights
from npumoe_lab.core.packing import _is_hf_swiglu, _no_autograd, swiglu_

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


# "auto" packs experts with at least this many elements per matrix (hidden x intermediate). Below it the per-expert
# calls cost more than the re-layout they save: a group of 16 experts with H x I = 256 x 128 (the bundled tiny
# model) ran 1.4-2.9x slower packed than as one bmm, 512 x 256 up to 1.6x slower, 1024 x 512 and up 1.01-1.42x
# faster (whole FFN, 16-256 rows per expert, bf16 and fp32; bench/gemm_forms.py, 2 threads, bench/RESULTS.md).
MIN_PACKED_ELEMS = 1024 * 512


def resolve_kernel(kernel: str, dtype: torch.dtype, device="cpu", elems: int | None = None) -> str:
    """The kernel that runs: "auto" -> "onednn" for CPU weights of a dtype oneDNN packs here whose matrices have
    at least MIN_PACKED_ELEMS elements (`elems`; None: no size rule), else "torch"."""
    if kernel not in KERNELS:
        raise NpuMoeError(f"cpu_kernel={kernel!r} is not a CPU expert kernel; use one of {KERNELS}")
    on_cpu = torch.device(device).type == "cpu"
    if kernel == "auto":
        big = elems is None or elems >= MIN_PACKED_ELEMS
        return "onednn" if on_cpu and big and onednn_packs(dtype) else "torch"
    if kernel == "onednn" and not (on_cpu and onednn_packs(dtype)):
        raise NpuMoeError(f"cpu_kernel='onednn' cannot pack {dtype} weights on {device} with this torch build/CPU; "
                          "use cpu_kernel='auto' or 'torch'")
    return kernel


class PackedExperts:
    """The experts of one layer, each matrix in F.linear orientation ([N, K]), packed for oneDNN when `kernel`
    allows: an expert the first time it runs, or all of them with `pack_all` (what `attach` does). Packed weights
    are a snapshot, like a compiled graph's; the engine keeps one per model and weight version on the experts
    module (weight_cache.py), so re-attaching after changing the model's weights packs them again."""

    def __init__(self, weights: ExpertWeights, kernel: str = "auto"):
        self.w = weights
        self.kernel = resolve_kernel(kernel, weights.gate_up.dtype, weights.gate_up.device,
                                     weights.hidden * weights.intermediate)
        self.swiglu = _is_hf_swiglu(weights)
        # F.linear orientation: gate_up [E, H, 2I] -> per expert [2I, H]; HF's [E, 2I, H] storage makes this a view
        self._gu = weights.gate_up.transpose(1, 2)
        self._dn = weights.down.transpose(1, 2)
        self._packed = [None] * weights.n_experts if self.kernel == "onednn" else None

    def _pack(self, e):
        if self._packed[e] is None:   # row-count hint 128: hints 1-1024 timed alike at 17-1280 rows (a probe)
            with torch.no_grad():
                pk = torch.ops.mkldnn._reorder_linear_weight
                self._packed[e] = (pk(self._gu[e].contiguous(), 128), pk(self._dn[e].contiguous(), 128))
        return self._packed[e]

    def pack_all(self) -> None:
        """Pack every expert now (attach does this once per model and weight version)."""
        if self._packed is not None:
            for e in range(self.w.n_experts):
                self._pack(e)

    def _linear(self, x, e, which, packed):
        bias = self.w.b_gate_up if which == 0 else self.w.b_down
        b = None if bias is None else bias[e]
        if packed:
            return torch.ops.mkldnn._linear_pointwise(x, self._pack(e)[which], b, "none", [], "")
        return torch.nn.functional.linear(x, (self._gu if which == 0 else self._dn)[e], b)

    def ffn(self, e: int, x: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        """Expert e on contiguous rows x [M, H], written into `out` [M, H] when given."""
        no_grad = _no_autograd(x, self._gu, self._dn)     # packed weights and in-place ops record no graph
        packed = self._packed is not None and no_grad
        h = self._linear(x, e, 0, packed)
        a = swiglu_(h) if self.swiglu and no_grad else self.w.apply_gate(h)
        y = self._linear(a.contiguous(), e, 1, packed)
        return y if out is None else out.copy_(y)

    def ffn_rows(self, packed: torch.Tensor, spans, out: torch.Tensor) -> torch.Tensor:
        """Experts over row spans of a packed buffer: spans = [(expert, first row, n rows)]; rows outside every
        span are left untouched (padding the caller never reads)."""
        for e, start, n in spans:
            if n > 0:
                self.ffn(e, packed[start:start + n], out[start:start + n])
        return out


__all__ = ["PackedExperts", "onednn_packs", "resolve_kernel", "KERNELS", "MIN_PACKED_ELEMS"]
