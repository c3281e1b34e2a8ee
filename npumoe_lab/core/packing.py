"""Sort-by-expert dispatch, static-capacity packing and weighted scatter: the workbench's expert numerics.

One `Dispatch` is computed per (layer, chunk) routing result and shared by pack and scatter, so the routing
is sorted once. Layout of the packed buffer: experts in `layout.order`, expert e owning `capacity[e]`
contiguous rows; a group of G same-capacity experts is then one contiguous [G*C, H] slice = a static
[G, C, H] graph input. Assignments beyond an expert's capacity are dropped, keeping the most salient
(higher score first, earlier token on ties). Padded rows are zero and never read back.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from npumoe_lab.errors import NpuMoeError
from npumoe_lab.models.weights import ExpertWeights


@dataclass(frozen=True)
class GroupSlice:
    """One static graph placed in the buffer: experts (in buffer order) sharing capacity C, rows [start, start+G*C)."""
    experts: tuple[int, ...]
    capacity: int
    start: int
    resident: bool             # NPU (True) or CPU (False)
    id: int                    # the plan group's id (the expert's id on the dropless path)

    @property
    def rows(self) -> int:
        return len(self.experts) * self.capacity


@dataclass(frozen=True)
class Layout:
    """Static buffer layout of one MoE layer: per-expert capacity and the groups placed in buffer order."""
    capacity: torch.Tensor          # [E] int64 (0: the expert has no static slots, e.g. a dynamic cold expert)
    offset: torch.Tensor            # [E] int64, first row of each expert's block
    groups: tuple[GroupSlice, ...]
    total_rows: int

    @staticmethod
    def from_groups(n_experts: int, groups) -> "Layout":
        """Place typed groups (anything with `id, experts, capacity, resident`: `planning.layout.GroupLayout`, whose
        layer checks that each expert is in exactly one group) one after another. Experts in none of `groups`
        get capacity 0: they take no slot (the engine runs them elsewhere, e.g. cold experts at their load)."""
        capacity, offset = [0] * n_experts, [0] * n_experts     # Python lists: one tensor each at the end
        out, row = [], 0
        for g in groups:
            for j, e in enumerate(g.experts):
                offset[e] = row + j * g.capacity
                capacity[e] = g.capacity
            out.append(GroupSlice(tuple(int(e) for e in g.experts), int(g.capacity), row, bool(g.resident),
                                  int(g.id)))
            row += len(g.experts) * g.capacity
        capacity, offset = torch.tensor(capacity, dtype=torch.long), torch.tensor(offset, dtype=torch.long)
        return Layout(capacity, offset, tuple(out), row)


def dropless_layout(load: torch.Tensor) -> Layout:
    """Capacity = actual load, one 'group' per expert that received tokens (the dynamic, dropless path)."""
    capacity = load.clone()
    offset = torch.zeros_like(load)
    offset[1:] = torch.cumsum(load, 0)[:-1]
    return Layout(capacity, offset, tuple(GroupSlice((e,), c, int(offset[e]), True, e)
                                          for e, c in enumerate(load.tolist()) if c > 0), int(load.sum()))


@dataclass(frozen=True)
class Dispatch:
    """Where every routed assignment (t, k) goes. S = T*K assignments, flattened t-major like HF."""
    n_tokens: int
    top_k: int
    load: torch.Tensor        # [E] routed assignments per expert (before dropping)
    slot: torch.Tensor        # [S] row of the packed buffer, or -1 when dropped
    src_token: torch.Tensor   # [R] token feeding each packed row; R = layout.total_rows, -1 for padding
    weight: torch.Tensor      # [S] routing weight used in the scatter (0 for dropped, renormalised if asked)
    k_order: torch.Tensor | None = None   # [T, K] each token's k positions in ascending expert id

    @property
    def kept(self) -> torch.Tensor:
        return self.slot >= 0

    @property
    def n_dropped(self) -> int:
        return int((self.slot < 0).sum())

    @property
    def n_padded(self) -> int:
        return int((self.src_token < 0).sum())

    def dropped_per_token(self) -> torch.Tensor:
        return (self.slot < 0).view(self.n_tokens, self.top_k).sum(1)


def plan_dispatch(top_k_index: torch.Tensor, top_k_weights: torch.Tensor, layout: Layout | None,
                  scores: torch.Tensor | None = None, renormalize: bool = False,
                  active: torch.Tensor | None = None) -> tuple[Dispatch, Layout]:
    """Assign each (token, k) to a packed slot under the layout's capacities (None = dropless).

    Priority within an expert: higher `scores` first, earlier position on ties (scores=None: position only,
    Switch-style first come). `active` [T, K] bool: only these assignments take part (padding tokens, or a
    subset handled elsewhere); the others get no slot and weight 0. Returns the dispatch and the layout used.
    """
    T, K = top_k_index.shape
    expert = top_k_index.reshape(-1)
    n_exp = int(layout.capacity.numel()) if layout is not None else None
    if active is not None:       # inactive assignments sort after every real expert and are never kept
        sentinel = max(int(expert.max()) + 1 if expert.numel() else 0, n_exp or 0)
        expert = torch.where(active.reshape(-1), expert, sentinel)
    load = torch.bincount(expert, minlength=n_exp or 0)
    if active is not None:
        load = load[:sentinel] if load.numel() > sentinel else load
    if layout is None:
        layout = dropless_layout(load)
    if load.numel() > layout.capacity.numel():
        raise NpuMoeError(f"routing names expert {load.numel() - 1} but the layout has only "
                          f"{layout.capacity.numel()} experts: the plan was built for another model")
    # Sort assignments by (expert, -score, position) with two stable sorts; done once per routing.
    if scores is None:
        perm = torch.sort(expert, stable=True).indices
    else:
        by_score = torch.sort(-scores.reshape(-1).float(), stable=True).indices
        perm = by_score[torch.sort(expert[by_score], stable=True).indices]
    e_sorted = expert[perm]
    real = e_sorted < layout.capacity.numel()
    e_safe = torch.where(real, e_sorted, 0)
    start = torch.cumsum(load, 0) - load
    dev = expert.device                  # layouts live on the CPU; routing may be on an accelerator
    rank = torch.arange(e_sorted.numel(), device=dev) - start[e_safe]
    keep = real & (rank < layout.capacity.to(dev)[e_safe])
    slot = torch.full_like(expert, -1)
    slot[perm[keep]] = layout.offset.to(dev)[e_safe[keep]] + rank[keep]
    src_token = torch.full((layout.total_rows,), -1, dtype=torch.long, device=dev)
    src_token[slot[perm[keep]]] = perm[keep] // K
    weight = top_k_weights.reshape(-1).clone()
    dropped = slot < 0
    if renormalize and bool(dropped.any()):
        w = top_k_weights.reshape(T, K).float()
        kept_sum = (w * (~dropped).view(T, K)).sum(1, keepdim=True)
        scale = torch.where(kept_sum > 0, w.sum(1, keepdim=True) / kept_sum.clamp_min(1e-30), 0.0)
        weight = (w * scale).reshape(-1).to(top_k_weights.dtype)
    weight = weight.masked_fill(dropped, 0)
    if active is not None and renormalize:
        weight = weight.masked_fill(~active.reshape(-1), 0)
    k_order = torch.sort(top_k_index, dim=1, stable=True).indices
    return Dispatch(T, K, load, slot, src_token, weight, k_order), layout


def _no_autograd(*tensors) -> bool:
    """out= buffers cannot record autograd: use them only when nothing here needs a gradient."""
    return not torch.is_grad_enabled() or not any(t.requires_grad for t in tensors)


def pack(hidden: torch.Tensor, dispatch: Dispatch, out: torch.Tensor | None = None,
         zero_padding: bool = True) -> torch.Tensor:
    """[T, H] -> [R, H] packed buffer; padded rows are zero. One gather (into `out`, e.g. a reused buffer) and
    the padded rows zeroed in place: no copy of the whole hidden states with an appended zero row.
    `zero_padding=False`: the padded rows keep token 0's values - for callers that never read them (the engine
    when it skips padding). The zeroing was the larger part of packing: 2.0 vs 5.2 ms at 24,608 x 2048 bf16 rows
    (a third padding), 1.4 vs 6.4 ms at 80 % padding; gathering only the filled rows (index_copy_) was slower still
    (27.6 / 1.6 ms)."""
    T, H = hidden.shape
    src = dispatch.src_token
    if T == 0:
        return hidden.new_zeros(src.numel(), H) if out is None else out.zero_()
    if out is not None and _no_autograd(hidden):
        torch.index_select(hidden, 0, src.clamp_min(0), out=out)    # padded rows read token 0 ...
    else:
        out = hidden.index_select(0, src.clamp_min(0))
    pad_rows = torch.nonzero(src < 0).flatten() if zero_padding else None
    if pad_rows is not None and pad_rows.numel():
        out.index_fill_(0, pad_rows, 0)                          # ... and are zeroed here
    return out


def scatter(expert_out: torch.Tensor, dispatch: Dispatch, work: torch.Tensor | None = None) -> torch.Tensor:
    """[R, H] expert outputs -> [T, H]: weighted sum over each token's kept assignments, deterministic, in the
    promoted dtype of outputs and weights (like HF). `work`: optional reusable [S, H] gather buffer.

    One gather of the S = T*K assignment rows (in each token's ascending expert-id order for reduced precision),
    then HF eager's own accumulation in every dtype (see _accumulate_like_hf_eager). A batched [1, K] x [K, H]
    product is not the same sum: whether the BLAS fuses multiply and add (one rounding) depends on the CPU, so
    fp32 logits differed from HF's by ~2e-7 on some CPUs and by 0.1 where that flipped a later routing decision."""
    R, H = expert_out.shape
    T, K = dispatch.n_tokens, dispatch.top_k
    dtype = torch.promote_types(expert_out.dtype, dispatch.weight.dtype)
    if R == 0 or T == 0:                     # nothing was packed: every assignment was dropped
        return expert_out.new_zeros(T, H, dtype=dtype)
    hf_order = dispatch.k_order is not None
    slot, weight = dispatch.slot.view(T, K), dispatch.weight.view(T, K)
    if hf_order:      # order the small [T, K] indices, not the [T, K, H] rows; k-major: contiguous [T, H] slabs
        slot, weight = slot.gather(1, dispatch.k_order).t(), weight.gather(1, dispatch.k_order).t()
    slot = slot.reshape(-1)
    rows = torch.index_select(expert_out, 0, slot.clamp_min(0), out=work if _no_autograd(expert_out) else None)
    dropped = torch.nonzero(slot < 0).flatten()
    if dropped.numel():                      # dropped assignments read row 0 (maybe padding): zero them, as
        rows.index_fill_(0, dropped, 0)      # 0 * (garbage/NaN padding) would not be 0
    if hf_order:
        return _accumulate_like_hf_eager(rows.view(K, T, H), weight)
    return torch.bmm(weight.view(T, 1, K).to(dtype), rows.view(T, K, H).to(dtype)).view(T, H)


def _accumulate_like_hf_eager(rows: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """Rows [K, T, H] already in each token's ascending expert-id order: multiply by the weights (one rounding to
    the activation dtype per product), then add the K rows one by one rounding after each add - exactly what HF's
    eager experts do (index_add_ per expert into the activation-dtype buffer). One wider or fused sum is more
    accurate but differs by a rounding that can flip later routing decisions; tests/test_models_parity.py
    holds every family to HF's bf16 logits with top-k 2 and 4. K whole-tensor adds, no per-expert loop."""
    if _no_autograd(rows, w):
        p = torch.mul(rows, w.unsqueeze(-1), out=rows)          # in place: no [K, T, H] temporary
    else:
        p = (rows * w.unsqueeze(-1)).to(rows.dtype)
    out = p[0].clone()
    for k in range(1, rows.shape[0]):
        out.add_(p[k])
    return out


class Workspace:
    """Grow-only scratch buffers reused across calls. Large CPU allocations are fresh mmap'd pages, zero-filled by
    page faults on every call; reusing them removes that cost. Contents of a returned view are undefined."""

    def __init__(self):
        self._bufs: dict = {}

    def get(self, name: str, shape, dtype, device=None) -> torch.Tensor:
        n = 1
        for d in shape:
            n *= int(d)
        key = (name, dtype, str(device or "cpu"))
        buf = self._bufs.get(key)
        if buf is None or buf.numel() < n:
            buf = self._bufs[key] = torch.empty(n, dtype=dtype, device=device)
        return buf[:n].view(tuple(shape))


def group_ffn(x: torch.Tensor, w: ExpertWeights) -> torch.Tensor:
    """Static grouped expert FFN: [G, C, H] -> [G, C, H] with G experts' weights (w.n_experts == G)."""
    h = torch.bmm(x, w.gate_up)
    if w.b_gate_up is not None:
        h = h + w.b_gate_up.unsqueeze(1)
    y = torch.bmm(w.apply_gate(h), w.down)
    if w.b_down is not None:
        y = y + w.b_down.unsqueeze(1)
    return y


def _is_hf_swiglu(w: ExpertWeights) -> bool:
    """True when w.apply_gate is HF's default `act_fn(gate) * up` on concatenated gate|up with SiLU."""
    from transformers.integrations.moe import _default_apply_gate
    owner = getattr(w.apply_gate, "__self__", None)
    return (getattr(w.apply_gate, "__func__", None) is _default_apply_gate and w.concatenated
            and type(getattr(owner, "act_fn", None)).__name__ in ("SiLUActivation", "SiLU"))


def swiglu_(h: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """HF's `silu(gate) * up` on concatenated gate|up rows [..., 2I] -> [..., I]: silu in place on the gate half
    (h is scratch), then one multiply into `out` (same bits as HF's, one temporary less, a dense down operand)."""
    i = h.shape[-1] // 2
    return torch.mul(torch.nn.functional.silu(h[..., :i], inplace=True), h[..., i:], out=out)


def group_ffn_into(x: torch.Tensor, w: ExpertWeights, out: torch.Tensor, work: "Workspace | None" = None
                   ) -> torch.Tensor:
    """group_ffn writing into `out` [G, C, H] (e.g. a slice of the packed output buffer: no copy afterwards),
    intermediates in `work`'s reused buffers. HF's SiLU gate runs as silu_ in place on the gate half, then one
    multiply into a contiguous [G, C, I] buffer (same bits as `silu(gate) * up`, one temporary less, and the
    down GEMM reads a dense operand); other gates use the family's own function.
    out= ops cannot record autograd: with grad enabled on grad-requiring inputs this is group_ffn + copy."""
    if not _no_autograd(x, w.gate_up, w.down):
        return out.copy_(group_ffn(x, w))
    G, C, _ = x.shape
    two_i = w.gate_up.shape[-1]
    h = torch.bmm(x, w.gate_up, out=None if work is None else work.get("h", (G, C, two_i), x.dtype, x.device))
    if w.b_gate_up is not None:
        h += w.b_gate_up.unsqueeze(1)
    if _is_hf_swiglu(w):
        a = swiglu_(h, None if work is None else work.get("act", (G, C, two_i // 2), x.dtype, x.device))
    else:
        a = w.apply_gate(h)
    torch.bmm(a, w.down, out=out)
    if w.b_down is not None:
        out += w.b_down.unsqueeze(1)
    return out


def run_groups(packed: torch.Tensor, layout: Layout, weights: ExpertWeights, group_weights=None,
               run=None) -> torch.Tensor:
    """Run every group of the layout over its slice of the packed buffer.

    group_weights: optional list of pre-stacked ExpertWeights per group (what a compiled graph holds);
    run: optional callable(group_slice, x [G,C,H], w) -> [G,C,H] (the engine times/places each call).
    """
    H = packed.shape[1]
    out = torch.empty_like(packed)
    for i, g in enumerate(layout.groups):
        x = packed[g.start:g.start + g.rows].view(len(g.experts), g.capacity, H)
        w = group_weights[i] if group_weights is not None else weights.select(g.experts)
        y_slice = out[g.start:g.start + g.rows].view(len(g.experts), g.capacity, H)
        if run is not None:
            y_slice.copy_(run(g, x, w))
        elif w.gate_up.dtype == x.dtype:
            group_ffn_into(x, w, y_slice)        # written in place: no per-group output copy
        else:
            y_slice.copy_(group_ffn(x, w))
    return out


def dropless_experts(weights: ExpertWeights, hidden: torch.Tensor, top_k_index: torch.Tensor,
                     top_k_weights: torch.Tensor) -> torch.Tensor:
    """The dropless path: capacity = actual load, so every assignment is computed exactly once."""
    dispatch, layout = plan_dispatch(top_k_index, top_k_weights, None)
    packed = pack(hidden, dispatch)
    out = run_groups(packed, layout, weights)
    return scatter(out, dispatch).to(hidden.dtype)
