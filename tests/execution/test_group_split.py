"""Skipping padding, a group whose fullest expert makes its trimmed bmm compute >= PER_EXPERT_SPLIT x its filled
rows runs expert by expert on the filled rows only. References: the trimmed bmm of the same plan (the path before
the split; equal up to fp32 summation order) and a float64 NumPy SwiGLU per expert for the rows computed."""
import numpy as np
import pytest
import torch

import npumoe_lab.execution.engine as engine
from npumoe_lab.core.numerics import (EmulatedFp16Weights, emulated_group_ffn, emulated_split_ffn, npu_layer_weights,
                                     select as select_npu)
from npumoe_lab.execution.engine import PlanExecutor
from npumoe_lab.execution.experts import LayerHandle
from tests.core.test_cpu_ffn import numpy_expert
from tests.core.test_fastpath import E, H, T, experts_module, plan, routing


def _spy(monkeypatch):
    """(fills of every split group, shapes of every whole-group bmm) the executor runs."""
    split, whole = [], []
    run_group, run_split, emulated = engine._run_group, engine._run_split, engine.emulated_split_ffn
    monkeypatch.setattr(engine, "_run_group", lambda x, w, out=None, work=None:
                        whole.append(tuple(x.shape[:2])) or run_group(x, w, out, work))
    monkeypatch.setattr(engine, "_run_split", lambda x, ws, out, fills, work=None:
                        split.append(list(fills)) or run_split(x, ws, out, fills, work))
    monkeypatch.setattr(engine, "emulated_split_ffn", lambda x, w, out, fills:
                        split.append(list(fills)) or emulated(x, w, out, fills))
    return split, whole


@pytest.mark.parametrize("npu_dtype,flags", [(None, None), (torch.float16, "avx2,fma"),
                                              (torch.float16, "avx2,fma,avx512_fp16")])
@torch.no_grad()
def test_split_groups_compute_only_filled_rows_and_keep_the_outputs(monkeypatch, npu_dtype, flags):
    """Plain weights and emulated fp16 (a CPU without an fp16 GEMM) split; fp16 weights on a CPU with a native fp16
    GEMM do not (SPLIT_CAST_GROUPS: one small fp16 mm per expert costs more than the rows it saves) unless asked."""
    if flags:
        monkeypatch.setenv("NPUMOE_CPU_FLAGS", flags)
    native = flags is not None and "avx512_fp16" in flags
    m = experts_module()
    h = LayerHandle(0, m)
    hidden = torch.randn(T, H, generator=torch.Generator().manual_seed(7))
    idx, w = routing(1)                                     # expert 0 hottest: it overflows, its group is full
    load = torch.bincount(idx.reshape(-1), minlength=E)
    cap = (12, 8)
    fill = torch.minimum(load, torch.tensor([cap[0]] * 4 + [cap[1]] * 4))
    groups = [fill[:4].tolist(), fill[4:].tolist()]
    ratio = engine.PER_EXPERT_SPLIT
    want_split = [g for g in groups if 4 * max(g) >= ratio * sum(g)]
    assert want_split, "the routing must make at least one group worth splitting"
    split, whole = _spy(monkeypatch)
    kw = dict(cpu_kernel="torch", pad_rows="skip", npu_dtype=npu_dtype)
    y_split = PlanExecutor(plan(cap), [h], **kw)(h, hidden, idx, w)
    if native:
        assert split == [] and sorted(whole) == sorted((4, max(g)) for g in groups)
        split.clear()
        whole.clear()
        monkeypatch.setattr(engine, "SPLIT_CAST_GROUPS", True)     # asked for: the per-expert path
        y_split = PlanExecutor(plan(cap), [h], **kw)(h, hidden, idx, w)
    assert split == want_split
    if npu_dtype is None or native:          # the generic split: one [1, f] bmm per filled expert
        assert sorted(whole) == sorted([(1, f) for g in want_split for f in g if f]
                                       + [(4, max(g)) for g in groups if g not in want_split])
    split.clear()
    whole.clear()
    monkeypatch.setattr(engine, "PER_EXPERT_SPLIT", 0)     # the trimmed bmm per group
    y_trim = PlanExecutor(plan(cap), [h], **kw)(h, hidden, idx, w)
    assert split == [] and sorted(whole) == sorted((4, max(g)) for g in groups)
    atol = 1e-6 if npu_dtype is None else 2e-3                # fp16 outputs: one rounding of a different sum
    torch.testing.assert_close(y_split, y_trim, rtol=0, atol=atol)


@torch.no_grad()
def test_split_rows_equal_a_float64_expert():
    """Both splits' per-expert rows against NumPy's float64 SwiGLU of that expert (the emulated fp16 one within
    fp16 rounding, and equal in fill rows to the whole-group emulation up to fp32 summation order)."""
    m = experts_module()
    h = LayerHandle(0, m)
    fills = [12, 0, 5, 1]
    x = torch.randn(4, 12, H, generator=torch.Generator().manual_seed(3))
    for npu_dtype in (None, torch.float16):
        ex = PlanExecutor(plan((12, 8)), [h], cpu_kernel="torch", pad_rows="skip", npu_dtype=npu_dtype)
        _, _, gweights = ex._compiled(h)
        out = torch.full_like(x, float("nan"))
        if npu_dtype is None:
            engine._run_split(x, ex._split_weights(0, 0, gweights[0]), out, fills, ex._work)
            tol = dict(rtol=1e-4, atol=1e-5)
        else:
            # the emulation itself, also where this CPU multiplies fp16 natively (the engine would not emulate)
            experts = ex.static_layout(0)[0].groups[0].experts
            emu = select_npu(npu_layer_weights(m, h.weights, torch.float16, flags=("avx2",)), experts)
            assert isinstance(emu, EmulatedFp16Weights)
            emulated_split_ffn(x, emu, out, fills)
            whole = emulated_group_ffn(x, emu)
            for k, f in enumerate(fills):
                torch.testing.assert_close(out[k, :f], whole[k, :f], rtol=0, atol=2e-3)
            tol = dict(rtol=2e-2, atol=2e-3)
            if not isinstance(gweights[0], EmulatedFp16Weights):    # native fp16: the engine's own split
                native = torch.full_like(x, float("nan"))
                engine._run_split(x, ex._split_weights(0, 0, gweights[0]), native, fills, ex._work)
                for k, f in enumerate(fills):
                    np.testing.assert_allclose(native[k, :f].numpy(), numpy_expert(m, k, x[k, :f]), **tol)
                    assert bool(torch.isnan(native[k, f:]).all())
        for k, f in enumerate(fills):
            np.testing.assert_allclose(out[k, :f].numpy(), numpy_expert(m, k, x[k, :f]), **tol)
            assert bool(torch.isnan(out[k, f:]).all())      # rows past the fill are never written
