"""NPU fp16 numerics without a native fp16 GEMM (npumoe_lab/core/numerics.py) and the CPU dtype policy (cpu_features.py).

Reference: a NumPy float64 computation of the same expert FFN on fp16-rounded operands, rounded to fp16 at the
points an fp16 device rounds (each GEMM output, the SiLU, the gate product): independent of this CPU's kernels."""
import numpy as np
import pytest
import torch

from npumoe_lab.core import cpu_features
from npumoe_lab.execution.engine import PlanExecutor
from npumoe_lab.errors import NpuMoeError
from npumoe_lab.execution.experts import LayerHandle
from npumoe_lab.models.weights import expert_weights
from npumoe_lab.core.numerics import EmulatedFp16Weights, emulated_group_ffn, emulates, npu_layer_weights
from npumoe_lab.core.packing import group_ffn
from tests.core.test_fastpath import E, H, T, experts_module, plan, routing

torch.set_num_threads(1)
TOL = 2 ** -10        # docs/DESIGN.md "NPU precision": max |error| <= 2^-10 x max |reference| per group output
AVX2 = frozenset({"avx2", "fma", "f16c"})                     # the AVX2-only EPYC (no native bf16/fp16)


def r16(a):
    return a.astype(np.float16).astype(np.float64)


def reference_fp16_ffn(m, x):
    """[G, C, H] through experts 0..G-1 of a Qwen3 experts module, float64 on fp16 values, fp16 roundings."""
    G = x.shape[0]
    gu = r16(m.gate_up_proj[:G].detach().double().numpy().transpose(0, 2, 1))   # [G, H, 2I]
    dn = r16(m.down_proj[:G].detach().double().numpy().transpose(0, 2, 1))      # [G, I, H]
    h = r16(np.einsum("gch,ghn->gcn", r16(x.double().numpy()), gu))
    i = h.shape[-1] // 2
    g, u = h[..., :i], h[..., i:]
    a = r16(r16(g / (1 + np.exp(-g))) * u)
    return r16(np.einsum("gci,gih->gch", a, dn))


def rel_err(y, ref):
    return float(np.abs(y.detach().double().numpy() - ref).max() / np.abs(ref).max())


@pytest.mark.parametrize("x_dtype", [torch.float32, torch.bfloat16])
@torch.no_grad()
def test_emulated_fp16_within_tolerance_of_float64_and_of_native_fp16(x_dtype):
    m = experts_module(seed=1)
    x = torch.randn(E, 24, H, generator=torch.Generator().manual_seed(0)).to(x_dtype)
    w = npu_layer_weights(m, expert_weights(m), torch.float16, flags=AVX2)
    assert isinstance(w, EmulatedFp16Weights) and w.gate_up.dtype == torch.float32
    emu = emulated_group_ffn(x, w)
    assert emu.dtype == x_dtype
    ref = reference_fp16_ffn(m, x.float())
    native = group_ffn(x.half(), expert_weights(m).to(torch.float16))     # torch's own fp16 GEMMs
    assert rel_err(native.float(), ref) <= TOL     # the reference models native fp16 too
    if x_dtype == torch.float32:
        assert rel_err(emu, ref) <= TOL
        assert float((emu - native.float()).abs().max()) <= TOL * float(np.abs(ref).max())
    else:                                          # outputs rounded once more, to bf16 (8 bits)
        assert rel_err(emu, ref) <= 2 ** -8


def test_emulation_only_where_fp16_is_not_native():
    assert emulates(torch.float16, AVX2)
    assert not emulates(torch.float16, AVX2 | {"avx512_fp16"}) and not emulates(torch.float16, {"amx_fp16"})
    assert not emulates(torch.bfloat16, AVX2) and not emulates(None, AVX2)


@torch.no_grad()
def test_executor_emulates_fp16_groups_by_the_cpu_flags(monkeypatch):
    m = experts_module(seed=2)
    h = LayerHandle(0, m)
    hidden = torch.randn(T, H, generator=torch.Generator().manual_seed(3))
    idx, w = routing(5)
    monkeypatch.setenv(cpu_features.ENV_FLAGS, "avx2,fma")               # no native fp16: emulated groups
    emu_exec = PlanExecutor(plan((T, T)), [h], npu_dtype=torch.float16).prepare()
    assert all(isinstance(g, EmulatedFp16Weights) for g in emu_exec._weights[0])
    y_emu = emu_exec(h, hidden, idx, w)
    monkeypatch.setenv(cpu_features.ENV_FLAGS, "avx2,avx512_fp16")       # native fp16: torch's fp16 GEMMs
    nat_exec = PlanExecutor(plan((T, T)), [h], npu_dtype=torch.float16).prepare()
    assert all(g.gate_up.dtype == torch.float16 for g in nat_exec._weights[0])
    y_nat = nat_exec(h, hidden, idx, w)
    scale = float(y_nat.abs().max())
    assert float((y_emu - y_nat).abs().max()) <= 4 * TOL * scale          # scatter sums K=2 fp16-rounded rows
    m.config._experts_implementation = "eager"
    assert float((y_emu - m(hidden, idx, w)).abs().max()) <= 0.01 * scale  # fp32 HF eager: close, not equal


def test_fast_dtype_by_flags_and_override(monkeypatch):
    assert cpu_features.fast_dtype(AVX2) == torch.float32
    assert cpu_features.fast_dtype(AVX2 | {"avx512f", "avx512_bf16"}) == torch.bfloat16
    assert cpu_features.fast_dtype({"amx_tile", "amx_bf16"}) == torch.bfloat16
    monkeypatch.setenv(cpu_features.ENV_FLAGS, "avx2, fma")
    assert cpu_features.cpu_flags() == {"avx2", "fma"} and cpu_features.resolve_dtype() == torch.float32
    fields = cpu_features.row_fields(torch.float32)
    assert fields["dtype"] == "fp32" and fields["cpu_flags"] == "avx2,fma+override"
    assert cpu_features.resolve_dtype("bf16") == torch.bfloat16            # the user's choice wins
    assert cpu_features.resolve_dtype(torch.float16) == torch.float16
    with pytest.raises(NpuMoeError, match="fast dtype"):
        cpu_features.resolve_dtype("int8")


def test_onednn_isa_limit_hides_avx512_and_amx(monkeypatch):
    """ONEDNN_MAX_CPU_ISA=AVX2 makes bf16 GEMMs as slow as on an AVX2-only CPU (1.3 vs 912 GFLOP/s measured), so
    the dtype rule must see that CPU: on any host, with the detected flags of an AVX-512 + AMX machine."""
    if cpu_features.platform.machine().lower() not in ("x86_64", "amd64"):
        pytest.skip("the oneDNN ISA limit is an x86 knob")
    monkeypatch.delenv(cpu_features.ENV_FLAGS, raising=False)
    monkeypatch.setattr(cpu_features, "_detected", lambda: ("Xeon", frozenset(AVX2 | {"avx512f", "amx_bf16"})))
    monkeypatch.delenv("ONEDNN_MAX_CPU_ISA", raising=False)
    assert cpu_features.isa_limit() is None and cpu_features.fast_dtype() == torch.bfloat16
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "avx2")
    assert cpu_features.isa_limit() == "AVX2" and cpu_features.fast_dtype() == torch.float32
    assert cpu_features.row_fields(torch.float32)["cpu_flags"].endswith("+isa=AVX2")
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX512_CORE_AMX")                # a limit that keeps AMX: no change
    assert cpu_features.isa_limit() is None and cpu_features.fast_dtype() == torch.bfloat16
