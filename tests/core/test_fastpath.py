"""The CPU fast path: reused buffers, in-place group FFN, bmm scatter, bmm-friendly weight layout.

References: HF's own eager experts forward (tiny Qwen3-MoE experts module) and the plain allocation path."""
from types import SimpleNamespace

import pytest
import torch
from transformers import AutoConfig
from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeExperts

from npumoe_lab.execution.engine import PlanExecutor, _bmm_weights
from npumoe_lab.execution.experts import LayerHandle
from npumoe_lab.planning.layout import ExecutionLayout, GroupLayout
from npumoe_lab.core.packing import Workspace, group_ffn, group_ffn_into, pack, plan_dispatch, scatter


def G(gid, experts, capacity):
    """A resident group of the plan IR (what the engine hands packing)."""
    return GroupLayout(gid, experts, capacity, "npu")


E, K, H, I, T = 8, 2, 32, 16, 40


def experts_module(dtype=torch.float32, seed=0):
    cfg = AutoConfig.for_model("qwen3_moe", num_experts=E, num_experts_per_tok=K, hidden_size=H,
                               moe_intermediate_size=I)
    cfg._experts_implementation = "eager"
    torch.manual_seed(seed)
    m = Qwen3MoeExperts(cfg)
    with torch.no_grad():
        m.gate_up_proj.normal_(0, H ** -0.5)
        m.down_proj.normal_(0, I ** -0.5)
    return m.to(dtype).eval()


def routing(seed, n=T, dtype=torch.float32, hot=True):
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(n, E, generator=g) + (torch.linspace(2, 0, E) if hot else 0)   # expert 0 hottest
    v, idx = logits.topk(K, dim=1)
    return idx, torch.softmax(v, 1).to(dtype)


SPEC = SimpleNamespace(layer=0, n_experts=E, top_k=K, hidden=H, intermediate=I)


def plan(capacity):
    """Two groups of 4 experts at the given capacities (every expert resident)."""
    return ExecutionLayout.build([SPEC], {0: [((0, 1, 2, 3), capacity[0], True), ((4, 5, 6, 7), capacity[1], True)]})


@torch.no_grad()
def test_reused_buffers_identical_across_calls_with_different_routings():
    m = experts_module()
    h = LayerHandle(0, m)
    reused = PlanExecutor(plan((16, 8)), [h])          # small capacities: drops and padding both happen
    x1, x2 = torch.randn(T, H), torch.randn(T // 2, H)   # different token counts too
    r1, r2 = routing(1), routing(2, n=T // 2)
    first = reused(h, x1, *r1)
    second = reused(h, x2, *r2)
    again = reused(h, x1, *r1)
    assert torch.equal(first, again)
    assert torch.equal(second, PlanExecutor(plan((16, 8)), [h])(h, x2, *r2))


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.bfloat16, 3e-2)])
@torch.no_grad()
def test_capacity_above_load_equals_hf_eager(dtype, tol):
    m = experts_module(dtype)
    h = LayerHandle(0, m)
    x = torch.randn(T, H).to(dtype)
    idx, w = routing(3, dtype=dtype)
    y = PlanExecutor(plan((T, T)), [h])(h, x, idx, w)
    torch.testing.assert_close(y.float(), m(x, idx, w).float(), atol=tol, rtol=tol)


@torch.no_grad()
def test_bf16_path_close_to_fp32():
    m32 = experts_module(torch.float32)
    m16 = experts_module(torch.float32).to(torch.bfloat16)
    x = torch.randn(T, H)
    idx, w = routing(4)
    y32 = PlanExecutor(plan((24, 16)), [LayerHandle(0, m32)])(LayerHandle(0, m32), x, idx, w)
    h16 = LayerHandle(0, m16)
    y16 = PlanExecutor(plan((24, 16)), [h16])(h16, x.bfloat16(), idx, w.bfloat16()).float()
    assert ((y16 - y32).norm() / y32.norm()) < 2e-2


@torch.no_grad()
def test_pack_into_dirty_buffer_zeroes_padding_and_scatter_ignores_nan_padding():
    idx, w = routing(5)
    from npumoe_lab.core.packing import Layout
    # expert 8 is never routed and owns rows 0-1: dropped assignments (which read row 0) meet NaN padding
    layout = Layout.from_groups(E + 1, [G(0, (8,), 2), G(1, (0, 1, 2, 3), 6), G(2, (4, 5, 6, 7), 4)])
    d, _ = plan_dispatch(idx, w, layout)
    assert d.n_dropped > 0 and d.n_padded > 0
    x = torch.randn(T, H)
    buf = torch.full((layout.total_rows, H), float("nan"))
    packed = pack(x, d, out=buf)
    assert packed.data_ptr() == buf.data_ptr()
    assert torch.equal(packed, pack(x, d))
    assert torch.count_nonzero(packed[d.src_token < 0]) == 0
    out = torch.randn(layout.total_rows, H)
    out[d.src_token < 0] = float("nan")
    assert torch.isnan(out[0]).all()
    y = scatter(out, d, work=torch.full((T * K, H), float("nan")))
    assert torch.isfinite(y).all()
    kept = d.slot.view(T, K)
    ref = sum(torch.where((kept[:, k] >= 0)[:, None], out[kept[:, k].clamp_min(0)] * w[:, k:k + 1], 0.0)
              for k in range(K))
    torch.testing.assert_close(y, ref, atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@torch.no_grad()
def test_group_ffn_into_matches_group_ffn_and_layout_keeps_values(dtype):
    from npumoe_lab.models.weights import expert_weights
    w = expert_weights(experts_module(dtype)).select([5, 1, 3])
    wb = _bmm_weights(w)
    assert torch.equal(wb.gate_up, w.gate_up) and torch.equal(wb.down, w.down)
    x = torch.randn(3, 7, H).to(dtype)
    out = torch.full((3, 7, H), float("nan"), dtype=dtype)
    group_ffn_into(x, wb, out, Workspace())
    torch.testing.assert_close(out, group_ffn(x, w), atol=0, rtol=0)
    assert _bmm_weights(w, torch.bfloat16).gate_up.dtype == torch.bfloat16


def test_grad_mode_falls_back_without_error():
    m = experts_module()                                 # parameters require grad, grad mode on
    h = LayerHandle(0, m)
    x = torch.randn(T, H, requires_grad=True)
    idx, w = routing(6)
    y = PlanExecutor(plan((T, T)), [h])(h, x, idx, w)
    torch.testing.assert_close(y, m(x, idx, w), atol=1e-5, rtol=1e-5)
    y.sum().backward()
    assert x.grad is not None


def _hf_order_reference(rows, dispatch):
    """The straightforward form of HF eager's bf16 accumulation (per token, ascending expert id, rounding after
    each add) that the fast scatter must reproduce bit for bit."""
    T, K, H = rows.shape
    order = dispatch.k_order
    w = dispatch.weight.view(T, K).gather(1, order)
    ordered = rows.gather(1, order.unsqueeze(-1).expand(T, K, H))
    out = (ordered[:, 0] * w[:, :1]).to(rows.dtype)
    for k in range(1, K):
        out = out + (ordered[:, k] * w[:, k:k + 1]).to(rows.dtype)
    return out


@pytest.mark.parametrize("wdtype", [torch.bfloat16, torch.float32])
@torch.no_grad()
def test_bf16_scatter_bit_identical_to_hf_order_reference(wdtype):
    from npumoe_lab.core.packing import Layout
    idx, w = routing(7, dtype=wdtype)
    layout = Layout.from_groups(E, [G(0, (0, 1, 2, 3), 9), G(1, (4, 5, 6, 7), 5)])
    d, _ = plan_dispatch(idx, w, layout)
    assert d.n_dropped > 0
    out = (torch.randn(layout.total_rows, H) * 3).bfloat16()
    rows = out[d.slot.clamp_min(0)] * (d.slot >= 0)[:, None]
    ref = _hf_order_reference(rows.view(T, K, H), d)
    y = scatter(out, d, work=torch.empty(T * K, H, dtype=torch.bfloat16))
    assert y.dtype == ref.dtype and torch.equal(y, ref)
