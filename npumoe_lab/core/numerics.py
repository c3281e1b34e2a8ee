"""The NPU's fp16 numerics on a CPU without a native fp16 GEMM: fp32 GEMMs on fp16-rounded operands.

A modeled platform's resident groups compute what the ANE computes: fp16 inputs, weights and outputs. torch runs
an fp16 GEMM natively only where the CPU has AVX512-FP16 / AMX-FP16 (or AArch64 FP16); elsewhere it falls back to a
scalar path at ~1/40-1/60 of fp32 (2-3 GFLOP/s on the AVX2-only EPYC, shared/research/ENVIRONMENT.md). There the
groups run as `emulated_group_ffn`: weights rounded to fp16 once (kept in fp32, on the model: weight_cache.py),
inputs rounded to fp16, each GEMM an fp32 GEMM whose output is rounded to fp16, and the gate/bias ops in fp16 as
the native path runs them (`emulated_split_ffn`: the same on each expert's filled rows only, for groups the
engine splits). Every product of two fp16 values is exact in fp32, so the two differ only in how the
GEMM accumulates before its one rounding to fp16 (docs/DESIGN.md "NPU precision" states the tolerance;
tests/test_numerics.py holds both to a float64 reference).
"""
from __future__ import annotations

from dataclasses import dataclass, fields

import torch

from npumoe_lab.core.cpu_features import native_fp16
from npumoe_lab.models.weights import ExpertWeights
from npumoe_lab.core.weight_cache import prepared

FP16 = torch.float16


@dataclass(frozen=True)
class EmulatedFp16Weights(ExpertWeights):
    """Expert weights holding fp16-rounded values in fp32: the group runs `emulated_group_ffn`."""


def emulates(npu_dtype: torch.dtype | None, flags=None) -> bool:
    """True when groups of `npu_dtype` run emulated here: fp16 on a CPU without a native fp16 GEMM."""
    return npu_dtype == FP16 and not native_fp16(flags)


def round_to(t: torch.Tensor | None, dtype: torch.dtype, keep: torch.dtype = torch.float32):
    """`t` rounded to `dtype`'s values, stored as `keep`."""
    return None if t is None else t.to(dtype).to(keep)


def _stored_transposed(t: torch.Tensor) -> torch.Tensor:
    """[E, K, N] with [E, N, K] memory (HF's F.linear layout): a contiguous expert range is a view, and oneDNN's bmm
    reads that B operand fastest here (engine._bmm_weights)."""
    return t.transpose(1, 2).contiguous().transpose(1, 2)


def npu_layer_weights(module: torch.nn.Module, weights: ExpertWeights, npu_dtype: torch.dtype,
                      flags=None) -> ExpertWeights:
    """Every expert of a layer in the NPU's precision, prepared once per model and weight version: fp16-rounded
    fp32 (EmulatedFp16Weights) where the CPU has no native fp16 GEMM, else a plain cast."""
    emulate = emulates(npu_dtype, flags)

    def build():
        with torch.no_grad():
            conv = (lambda t: round_to(t, FP16)) if emulate else (lambda t: None if t is None else t.to(npu_dtype))
            vals = {f.name: getattr(weights, f.name) for f in fields(ExpertWeights)}
            vals.update(gate_up=_stored_transposed(conv(weights.gate_up)), down=_stored_transposed(conv(weights.down)),
                        b_gate_up=conv(weights.b_gate_up), b_down=conv(weights.b_down))
            return (EmulatedFp16Weights if emulate else ExpertWeights)(**vals)
    return prepared(module, ("npu", npu_dtype, emulate), build)


def select(w: ExpertWeights, experts) -> ExpertWeights:
    """`w.select` keeping the emulated marker (a view for contiguous experts)."""
    s = w.select(experts)
    if isinstance(w, EmulatedFp16Weights):
        s = EmulatedFp16Weights(**{f.name: getattr(s, f.name) for f in fields(ExpertWeights)})
    return s


def _gemm16(a16: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """fp16 [G, M, K] x fp16-valued fp32 [G, K, N] -> fp16: exact products, fp32 sums, one rounding."""
    return torch.bmm(a16.float(), b).to(FP16)


def emulated_group_ffn(x: torch.Tensor, w: EmulatedFp16Weights, out: torch.Tensor | None = None) -> torch.Tensor:
    """packing.group_ffn as an fp16 device computes it, [G, C, H] -> [G, C, H] in x's dtype (into `out`)."""
    h = _gemm16(x.to(FP16), w.gate_up)
    if w.b_gate_up is not None:
        h = h + w.b_gate_up.to(FP16).unsqueeze(1)
    y = _gemm16(w.apply_gate(h), w.down)          # the family's gate, elementwise in fp16 like the native path
    if w.b_down is not None:
        y = y + w.b_down.to(FP16).unsqueeze(1)
    return y.to(x.dtype) if out is None else out.copy_(y)


def _mm_filled(a: torch.Tensor, mats: torch.Tensor, fills) -> torch.Tensor:
    """[G, m, N]: each expert's a[k, :fills[k]] @ mats[k] (one mm per filled expert); rows past a fill are scratch."""
    y = a.new_empty(a.shape[0], a.shape[1], mats.shape[-1])
    for k, f in enumerate(fills):
        if f:
            torch.mm(a[k, :f], mats[k], out=y[k, :f])
    return y


def emulated_split_ffn(x: torch.Tensor, w: EmulatedFp16Weights, out: torch.Tensor, fills) -> torch.Tensor:
    """emulated_group_ffn with each expert's GEMMs over its first fills[k] rows only ([G, C, H] -> rows of `out`).
    The roundings and the gate run once over the group's [G, max fill] rows (elementwise: rows past an expert's
    fill hold scratch that is computed on but never copied out); the GEMMs, the cost, one per filled expert."""
    x16 = x[:, :max(fills)].to(FP16).float()
    h = _mm_filled(x16, w.gate_up, fills).to(FP16)
    if w.b_gate_up is not None:
        h = h + w.b_gate_up.to(FP16).unsqueeze(1)
    y = _mm_filled(w.apply_gate(h).float(), w.down, fills).to(FP16)
    if w.b_down is not None:
        y = y + w.b_down.to(FP16).unsqueeze(1)
    for k, f in enumerate(fills):
        if f:
            out[k, :f].copy_(y[k, :f])
    return out


__all__ = ["EmulatedFp16Weights", "emulates", "round_to", "npu_layer_weights", "select", "emulated_group_ffn",
           "emulated_split_ffn"]
