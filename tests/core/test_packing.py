"""Property tests of the static packing against a plain-Python reference (acceptance)."""
import numpy as np
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from npumoe_lab.models.weights import ExpertWeights
from npumoe_lab.core.packing import Layout, pack, plan_dispatch, run_groups, scatter
from npumoe_lab.planning.layout import GroupLayout


def G(gid, experts, capacity):
    """A resident group of the plan IR (what the engine hands packing)."""
    return GroupLayout(gid, experts, capacity, "npu")



def reference_slots(idx, scores, capacity):
    """Plain Python: per expert, keep the top-`capacity` assignments by score (earlier token on ties)."""
    T, K = idx.shape
    kept = np.zeros((T, K), bool)
    for e in range(len(capacity)):
        cands = [(t, k) for t in range(T) for k in range(K) if idx[t, k] == e]
        cands.sort(key=lambda tk: (-scores[tk], tk[0], tk[1]))
        for t, k in cands[:capacity[e]]:
            kept[t, k] = True
    return kept


def random_weights(E, H, I, seed):
    g = torch.Generator().manual_seed(seed)
    gu = torch.randn(E, H, 2 * I, generator=g) * 0.2
    down = torch.randn(E, I, H, generator=g) * 0.2

    def swiglu(h):
        a, b = h.chunk(2, dim=-1)
        return torch.nn.functional.silu(a) * b
    return ExpertWeights(gu, down, None, None, swiglu, True, "swiglu")


def dense_reference(hidden, idx, w, kept, weights):
    """Token by token: sum_k weight * expert(x) over kept assignments (NumPy-free torch loop)."""
    out = torch.zeros_like(hidden)
    for t in range(hidden.shape[0]):
        for k in range(idx.shape[1]):
            if kept[t, k]:
                e = int(idx[t, k])
                h = hidden[t] @ weights.gate_up[e]
                out[t] += w[t, k] * (weights.apply_gate(h) @ weights.down[e])
    return out


routing = st.integers(1, 24).flatmap(lambda T: st.tuples(
    st.just(T), st.integers(1, 3), st.integers(3, 6), st.integers(0, 10_000)))


def make_case(T, K, E, seed):
    g = torch.Generator().manual_seed(seed)
    idx = torch.stack([torch.randperm(E, generator=g)[:K] for _ in range(T)])
    w = torch.rand(T, K, generator=g)
    scores = torch.rand(T, K, generator=g).round(decimals=1)   # ties on purpose
    cap = torch.randint(1, T + 2, (E,), generator=g)
    return idx, w, scores, cap


def layout_for(cap, group_size=2):
    E = len(cap)
    groups, gid = [], 0
    by_cap = {}
    for e in range(E):
        by_cap.setdefault(int(cap[e]), []).append(e)
    for c, experts in by_cap.items():
        for i in range(0, len(experts), group_size):
            groups.append(G(gid, tuple(experts[i:i + group_size]), c))
            gid += 1
    return Layout.from_groups(E, groups)


@settings(max_examples=60, deadline=None)
@given(routing)
def test_every_assignment_in_one_slot_or_dropped(case):
    idx, w, scores, cap = make_case(*case)
    layout = layout_for(cap)
    d, _ = plan_dispatch(idx, w, layout, scores=scores)
    kept = d.slot.view(idx.shape) >= 0
    ref = reference_slots(idx.numpy(), scores.numpy(), cap.tolist())
    assert np.array_equal(kept.numpy(), ref)
    slots = d.slot[d.slot >= 0]
    assert slots.unique().numel() == slots.numel()                    # no slot used twice
    assert d.n_dropped + int(kept.sum()) == idx.numel()               # kept or counted as dropped
    # each kept slot lies inside its own expert's block and holds its token
    e = idx.reshape(-1)[d.slot >= 0]
    assert bool(((slots >= layout.offset[e]) & (slots < layout.offset[e] + layout.capacity[e])).all())
    tok = torch.arange(idx.numel())[d.slot >= 0] // idx.shape[1]
    assert torch.equal(d.src_token[slots], tok)
    assert d.n_padded == layout.total_rows - int(kept.sum())


@settings(max_examples=40, deadline=None)
@given(routing)
def test_output_matches_dense_reference_and_padding_is_inert(case):
    T, K, E, seed = case
    idx, w, scores, cap = make_case(T, K, E, seed)
    H, I = 8, 6
    weights = random_weights(E, H, I, seed)
    hidden = torch.randn(T, H, generator=torch.Generator().manual_seed(seed + 1))
    layout = layout_for(cap)
    d, _ = plan_dispatch(idx, w, layout, scores=scores)
    packed = pack(hidden, d)
    assert torch.count_nonzero(packed[d.src_token < 0]) == 0          # padded rows are zero
    out = run_groups(packed, layout, weights)
    garbage = out.clone()
    garbage[d.src_token < 0] = float("nan")                           # padded outputs are never read
    y = scatter(garbage, d)
    ref = dense_reference(hidden, idx, w, (d.slot >= 0).view(T, K).numpy(), weights)
    torch.testing.assert_close(y, ref, atol=1e-5, rtol=1e-5)
    # padding not zeroed (the engine skipping padding): the filled rows are the same, and whatever the padding rows
    # hold (NaN here) never reaches the output
    unzeroed = pack(hidden, d, out=torch.empty_like(packed), zero_padding=False)
    real = d.src_token >= 0
    assert torch.equal(unzeroed[real], packed[real])
    unzeroed[~real] = float("nan")
    torch.testing.assert_close(scatter(run_groups(unzeroed, layout, weights), d), ref, atol=1e-5, rtol=1e-5)


@settings(max_examples=40, deadline=None)
@given(routing)
def test_capacity_at_least_load_equals_dropless(case):
    T, K, E, seed = case
    idx, w, scores, _ = make_case(T, K, E, seed)
    weights = random_weights(E, 8, 4, seed)
    hidden = torch.randn(T, 8, generator=torch.Generator().manual_seed(seed))
    load = torch.bincount(idx.reshape(-1), minlength=E)
    big = layout_for(load.clamp_min(1) + 3)
    d_big, _ = plan_dispatch(idx, w, big, scores=scores)
    d_free, free = plan_dispatch(idx, w, None)
    assert d_big.n_dropped == 0
    y_big = scatter(run_groups(pack(hidden, d_big), big, weights), d_big)
    y_free = scatter(run_groups(pack(hidden, d_free), free, weights), d_free)
    torch.testing.assert_close(y_big, y_free, atol=1e-6, rtol=1e-6)


@settings(max_examples=60, deadline=None)
@given(routing, st.integers(0, 5))
def test_raising_a_capacity_never_increases_drops(case, bump):
    idx, w, scores, cap = make_case(*case)
    d0, _ = plan_dispatch(idx, w, layout_for(cap), scores=scores)
    cap2 = cap.clone()
    cap2[int(case[3]) % len(cap)] += bump
    d1, _ = plan_dispatch(idx, w, layout_for(cap2), scores=scores)
    assert d1.n_dropped <= d0.n_dropped
    kept0, kept1 = d0.slot >= 0, d1.slot >= 0
    assert bool((kept1 | ~kept0).all())          # what was kept stays kept


@settings(max_examples=20, deadline=None)
@given(routing)
def test_same_inputs_same_result(case):
    idx, w, scores, cap = make_case(*case)
    a, _ = plan_dispatch(idx, w, layout_for(cap), scores=scores)
    b, _ = plan_dispatch(idx, w, layout_for(cap), scores=scores)
    assert torch.equal(a.slot, b.slot) and torch.equal(a.src_token, b.src_token)


def test_inactive_assignments_take_no_capacity():
    idx = torch.tensor([[0], [0], [0]])
    w = torch.ones(3, 1)
    layout = Layout.from_groups(1, [G(0, (0,), 2)])
    active = torch.tensor([[False], [True], [True]])
    d, _ = plan_dispatch(idx, w, layout, active=active)
    assert d.slot.tolist() == [-1, 0, 1] and d.weight.tolist() == [0.0, 1.0, 1.0]


def test_renormalize_rescales_kept_weights_hand_case():
    # token 0 routes to experts 0 (w .6) and 1 (w .4); expert 1 has capacity 1 and token 1 outranks it
    idx = torch.tensor([[0, 1], [1, 0]])
    w = torch.tensor([[0.6, 0.4], [0.9, 0.1]])
    layout = Layout.from_groups(2, [G(0, (0,), 2), G(1, (1,), 1)])
    d, _ = plan_dispatch(idx, w, layout, scores=w, renormalize=True)
    assert d.slot.view(2, 2)[0, 1] == -1                  # (t0, e1) dropped: lower weight than (t1, e1)
    torch.testing.assert_close(d.weight.view(2, 2)[0], torch.tensor([1.0, 0.0]))
