"""Pre-packed CPU expert FFNs (npumoe_lab/core/cpu_ffn.py) and the executor's padding modes.

References: a NumPy re-implementation of the SwiGLU expert, HF's own eager experts forward, and the padded
(every-slot) execution of the same plan."""
import numpy as np
import pytest
import torch

from npumoe_lab.execution.clock import NullClock
from npumoe_lab.core.cpu_ffn import PackedExperts, onednn_packs, resolve_kernel
from npumoe_lab.execution.engine import PlanExecutor
from npumoe_lab.errors import NpuMoeError
from npumoe_lab.execution.experts import LayerHandle
from npumoe_lab.models.weights import expert_weights
from npumoe_lab.execution.ops import ChunkContext, chunk_scope
from tests.core.test_fastpath import E, H, T, experts_module, plan, routing

KERNELS = ["torch"] + (["onednn"] if onednn_packs(torch.float32) else [])


def numpy_expert(m, e, x):
    """SwiGLU expert e of a Qwen3MoeExperts module in float64 NumPy: down(silu(x Wg^T) * (x Wu^T))."""
    gu = m.gate_up_proj[e].detach().double().numpy()          # [2I, H]: gate rows then up rows
    dn = m.down_proj[e].detach().double().numpy()             # [H, I]
    h = x.double().numpy() @ gu.T
    i = h.shape[1] // 2
    g, u = h[:, :i], h[:, i:]
    return (g / (1 + np.exp(-g)) * u) @ dn.T


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("rows", [1, 7, 33])
@torch.no_grad()
def test_ffn_matches_numpy_swiglu(kernel, rows):
    m = experts_module()
    px = PackedExperts(expert_weights(m), kernel)
    assert px.kernel == kernel
    x = torch.randn(rows, H, generator=torch.Generator().manual_seed(rows))
    for e in (0, 5):
        np.testing.assert_allclose(px.ffn(e, x).numpy(), numpy_expert(m, e, x), rtol=1e-4, atol=1e-5)
    if kernel == "onednn":      # packed lazily: only the experts that ran hold a packed copy
        assert [i for i, p in enumerate(px._packed) if p is not None] == [0, 5]


@pytest.mark.skipif(not onednn_packs(torch.bfloat16), reason="oneDNN cannot pack bf16 on this CPU")
@torch.no_grad()
def test_bf16_packed_close_to_fp64_and_to_hf_linear():
    m = experts_module(torch.bfloat16)
    px = PackedExperts(expert_weights(m), "onednn")
    x = torch.randn(20, H, generator=torch.Generator().manual_seed(0)).to(torch.bfloat16)
    y = px.ffn(3, x).float().numpy()
    ref = numpy_expert(m, 3, x)
    assert np.abs(y - ref).max() <= 0.02 * np.abs(ref).max()           # bf16: ~3 significant digits
    plain = PackedExperts(expert_weights(m), "torch").ffn(3, x).float().numpy()
    assert np.abs(y - plain).max() <= 0.01 * np.abs(ref).max()


@torch.no_grad()
def test_ffn_rows_writes_only_its_spans():
    m = experts_module()
    px = PackedExperts(expert_weights(m), "auto")
    buf = torch.randn(12, H)
    out = torch.full((12, H), 7.0)
    px.ffn_rows(buf, [(2, 0, 3), (6, 5, 4), (1, 11, 0)], out)
    np.testing.assert_allclose(out[0:3].numpy(), numpy_expert(m, 2, buf[0:3]), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(out[5:9].numpy(), numpy_expert(m, 6, buf[5:9]), rtol=1e-4, atol=1e-5)
    assert bool((out[3:5] == 7).all()) and bool((out[9:] == 7).all())


@pytest.mark.parametrize("x_grad", [True, False])
def test_grad_mode_uses_plain_weights_and_keeps_the_graph(x_grad):
    m = experts_module()                                   # parameters require grad
    px = PackedExperts(expert_weights(m), KERNELS[-1])
    x = torch.randn(5, H, requires_grad=x_grad)
    px.ffn(1, x).sum().backward()
    assert (x.grad is not None) == x_grad
    assert m.gate_up_proj.grad is not None and m.down_proj.grad is not None


def test_bad_kernel_name_and_kernel_choice():
    with pytest.raises(NpuMoeError, match="cpu_kernel"):
        resolve_kernel("mkl", torch.float32)
    with pytest.raises(NpuMoeError, match="cannot pack"):        # oneDNN packing is a CPU thing
        resolve_kernel("onednn", torch.float32, "cuda")
    assert resolve_kernel("auto", torch.bfloat16, "cuda") == "torch"
    assert resolve_kernel("auto", torch.float32) == ("onednn" if onednn_packs(torch.float32) else "torch")
    assert resolve_kernel("auto", torch.float32, "cpu", 256 * 128) == "torch"    # small experts: one bmm per group
    with pytest.raises(NpuMoeError, match="pad_rows"):
        PlanExecutor(plan((16, 16)), [LayerHandle(0, experts_module())], pad_rows="none")


class _Measured(NullClock):
    """A clock that says it measures wall time (like TimelineClock(platform, measured=True))."""
    measured = True


def _rows_computed(monkeypatch):
    seen = []
    orig = PackedExperts.ffn

    def spy(self, e, x, out=None):
        seen.append(x.shape[0])
        return orig(self, e, x, out)
    monkeypatch.setattr(PackedExperts, "ffn", spy)
    return seen


@pytest.mark.parametrize("kernel", KERNELS)
@torch.no_grad()
def test_skipping_padding_keeps_outputs_and_computes_only_filled_rows(kernel, monkeypatch):
    m = experts_module()
    h = LayerHandle(0, m)
    hidden = torch.randn(T, H, generator=torch.Generator().manual_seed(4))
    idx, w = routing(1)
    load = torch.bincount(idx.reshape(-1), minlength=E)
    p = plan((12, 8))                                      # below the hottest loads: some assignments dropped
    seen = _rows_computed(monkeypatch)
    y_skip = PlanExecutor(p, [h], cpu_kernel=kernel, pad_rows="skip")(h, hidden, idx, w)
    skipped = list(seen)
    seen.clear()
    y_full = PlanExecutor(p, [h], cpu_kernel=kernel, pad_rows="compute")(h, hidden, idx, w)
    cap = torch.tensor([12] * 4 + [8] * 4)
    if kernel == "onednn":      # expert by expert: each expert's filled rows, or all its static slots
        assert sorted(skipped) == sorted(int(n) for n in torch.minimum(load, cap) if n > 0)
        assert sorted(seen) == [8] * 4 + [12] * 4
    else:                       # one bmm per group (trimmed to the group's fullest expert when skipping)
        assert skipped == [] and seen == []
    torch.testing.assert_close(y_skip, y_full, rtol=1e-6, atol=1e-6)
    # independent reference for the same executor with nothing dropped: HF's own eager experts
    m.config._experts_implementation = "eager"
    cap_ok = PlanExecutor(plan((T, T)), [h], cpu_kernel=kernel)(h, hidden, idx, w)
    torch.testing.assert_close(cap_ok, m(hidden, idx, w), rtol=1e-4, atol=1e-5)


@pytest.mark.skipif("onednn" not in KERNELS, reason="oneDNN cannot pack fp32 here")
@torch.no_grad()
def test_auto_padding_computes_static_shapes_only_when_measured(monkeypatch):
    m = experts_module()
    h = LayerHandle(0, m)
    hidden = torch.randn(T, H, generator=torch.Generator().manual_seed(4))
    idx, w = routing(2)
    seen = _rows_computed(monkeypatch)
    with chunk_scope(ChunkContext(index=0, past=0, n_real=T, length=T, clock=_Measured())):
        PlanExecutor(plan((16, 16)), [h], cpu_kernel="onednn")(h, hidden, idx, w)
    assert seen == [16] * E                                # a measured static graph pays for its padding
    seen.clear()
    PlanExecutor(plan((16, 16)), [h], cpu_kernel="onednn")(h, hidden, idx, w)   # untimed: the filled rows only
    assert sum(seen) == int(torch.minimum(torch.bincount(idx.reshape(-1), minlength=E), torch.tensor(16)).sum())


@torch.no_grad()
def test_npu_precision_groups_trim_padding_to_the_fullest_expert():
    """Groups computed in the NPU's precision (bf16 here, fp16 on the modeled ANE) stay one bmm per group; skipping
    padding trims the rows past the group's fullest expert and keeps the outputs."""
    m = experts_module()
    h = LayerHandle(0, m)
    hidden = torch.randn(T, H, generator=torch.Generator().manual_seed(5))
    idx, w = routing(3)
    p = plan((24, 24))
    y = {mode: PlanExecutor(p, [h], npu_dtype=torch.bfloat16, pad_rows=mode)(h, hidden, idx, w)
         for mode in ("skip", "compute")}
    torch.testing.assert_close(y["skip"], y["compute"], rtol=0, atol=1e-6)
    ref = m(hidden, idx, w)                                  # fp32 HF eager: bf16 groups are close, not equal
    assert float((y["skip"] - ref).abs().max()) <= 0.02 * float(ref.abs().max())


@pytest.mark.skipif("onednn" not in KERNELS, reason="oneDNN cannot pack fp32 here")
@torch.no_grad()
def test_sibling_shares_packed_weights_and_matches_a_fresh_executor():
    m = experts_module()
    h = LayerHandle(0, m)
    hidden = torch.randn(T, H, generator=torch.Generator().manual_seed(6))
    idx, w = routing(4)
    first = PlanExecutor(plan((12, 8)), [h], cpu_kernel="onednn", pad_rows="compute")
    first(h, hidden, idx, w)
    sib = first.sibling(plan((T, T)), cpu_kernel="onednn", pad_rows="skip")
    assert sib.packed_experts(h) is first.packed_experts(h) and sib.pad_rows == "skip"
    fresh = PlanExecutor(plan((T, T)), [h], cpu_kernel="onednn", pad_rows="skip")
    torch.testing.assert_close(sib(h, hidden, idx, w), fresh(h, hidden, idx, w), rtol=0, atol=0)
    torch.testing.assert_close(sib(h, hidden, idx, w), m(hidden, idx, w), rtol=1e-4, atol=1e-5)   # HF eager
    other = first.sibling(cpu_kernel="torch")                # another kernel: its own weights
    assert other._experts is not first._experts
