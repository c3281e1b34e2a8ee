"""The host's op-level cost model (devices/cpu_model.py): prices by hand, parameter recovery, fit refusals."""
import math

import numpy as np
import pytest
import torch

from npumoe_lab.devices import cpu_model as cm
from npumoe_lab.devices.cost import attention_cost, dense_cost, expert_ffn_cost, memory_cost
from npumoe_lab.errors import NpuMoeError
from npumoe_lab.execution.engine import dynamic_experts_cost

TRUE = {**{f"call_s_{k}": v for k, v in zip(cm.CALL_KINDS, (4e-4, 6e-5, 5e-5, 2e-4, 3e-4, 4e-5, 9e-5, 1.2e-4,
                                                            3.5e-5))},
        "call_s_group_expert": 6e-6, "call_s_gather": 7e-5, "call_s_scatter_part": 1.5e-5, "other_op_s": 2e-5,
        "peak_flops": 4.0e11, "work_half_flops": 2.0e7, "rows_half": 6.0, "large_flops": 8.0e11,
        "large_rows_half": 20.0, "bandwidth_bytes_s": 1.5e10, "attention_flops": 8.0e10, "attention_gemm_flops": 5.0e11,
        "lm_head_flops": 6.0e11, "lm_head_bytes_s": 4.0e9, "other_chunk_s": 5e-4, "other_layer_s": 8e-5,
        "op_s_experts_dynamic": 3e-4, "router_elem_s": 1.2e-8, "dispatch_row_s": 1.5e-7,
        "hf_scan_s": 1e-7, "large_attention_flops": 1.5e12}


def rec(kind, cost, shape=(), context=None):
    return cm.op_record(kind, cost.flops, cost.bytes, cost.calls, cost.gemm, shape, context=context)


def test_true_covers_every_parameter():
    assert set(TRUE) == set(cm.PARAMS) == set(cm.START)


def test_large_gemm_rule_is_the_engines_packing_rule():
    from npumoe_lab.core.cpu_ffn import MIN_PACKED_ELEMS
    assert cm.LARGE_GEMM_ELEMS == MIN_PACKED_ELEMS


@pytest.mark.parametrize("H,I,rate,half", [(256, 128, "peak_flops", "rows_half"),
                                           (2048, 768, "large_flops", "large_rows_half")])
def test_expert_group_price_by_hand(H, I, rate, half):
    """G experts = G GEMM chains: a floor per call + one per expert, each chain at ONE expert's utilisation."""
    G, C = 4, 32
    cost = expert_ffn_cost(G, C, H, I, dtype_bytes=2, weight_bytes=2)
    flops = 6.0 * G * C * H * I                       # gate+up [C,H]x[H,2I] and down [C,I]x[I,H], per expert
    assert cost.flops == pytest.approx(flops)
    w = flops / G                                     # one expert's chain
    u = w / (w + TRUE["work_half_flops"]) * C / (C + TRUE[half])
    nbytes = 3 * G * H * I * 2 + 2 * G * C * H * 2    # weights + packed in/out, bf16
    want = TRUE["call_s_expert_group"] + G * TRUE["call_s_group_expert"] + \
        max(flops / (TRUE[rate] * u), nbytes / TRUE["bandwidth_bytes_s"])
    assert cm.price(TRUE, rec("expert_group", cost, (G, C, H, I))) == pytest.approx(want, rel=1e-12)


def test_scatter_price_by_hand_with_and_without_static_rows():
    S, H, T = 512, 256, 128
    cost = memory_cost(2 * S * H * 2, "scatter")
    gathered = TRUE["call_s_scatter"] + TRUE["call_s_gather"] + 2 * S * H * 2 / TRUE["bandwidth_bytes_s"]
    got = cm.price(TRUE, rec("scatter", cost, (S, H), {"static_rows": 1024, "parts": 0, "tokens": T}))
    assert got == pytest.approx(gathered, rel=1e-12)
    # two dynamic parts: two [T, H] adds (read 2, write 1 each) on top of the gather
    got = cm.price(TRUE, rec("scatter", cost, (S, H), {"static_rows": 1024, "parts": 2, "tokens": T}))
    want = gathered + 2 * TRUE["call_s_scatter_part"] + 6 * T * H * 2 / TRUE["bandwidth_bytes_s"]
    assert got == pytest.approx(want, rel=1e-12)
    # every expert cold: no gather, a [T, H] zeros and the one part's add
    got = cm.price(TRUE, rec("scatter", cost, (S, H), {"static_rows": 0, "parts": 1, "tokens": T}))
    want = TRUE["call_s_scatter"] + TRUE["call_s_scatter_part"] + 4 * T * H * 2 / TRUE["bandwidth_bytes_s"]
    assert got == pytest.approx(want, rel=1e-12)


def test_annotate_reads_each_ops_context_from_its_stream():
    """A two-layer chunk by hand: layer 0 with static rows and a cold part, layer 1 all cold (no pack)."""
    def r(kind, layer, shape=(), chunk=0):
        return cm.op_record(kind, 1.0, 1.0, 1, None, shape, chunk=chunk, layer=layer)
    stream = [r("attention", 0, (64, 0)), r("router", 0), r("dispatch", 0), r("pack", 0, (96, 256)),
              r("expert_group", 0), r("experts_dynamic", 0), r("scatter", 0, (256, 256)),
              r("attention", 1, (64, 0)), r("router", 1), r("dispatch", 1), r("experts_dynamic", 1),
              r("scatter", 1, (256, 256)), r("other", -1, (64, 2, 256, 4096)),
              r("attention", 0, (64, 64), chunk=1), r("other", -1, (64, 2, 256, 4096), chunk=1)]
    out = cm.annotate(stream)
    assert out[6]["context"] == {"static_rows": 96, "parts": 1, "tokens": 64}
    assert out[11]["context"] == {"static_rows": 0, "parts": 1, "tokens": 64}
    assert out[12]["context"] == {"chunk_ops": 12} and out[14]["context"] == {"chunk_ops": 1}
    assert all(o["context"] is None for i, o in enumerate(out) if i not in (6, 11, 12, 14))


def test_attention_scores_priced_apart_and_grow_with_context():
    t, past, H, nh, nkv, hd = 128, 384, 256, 4, 2, 64
    cost = attention_cost(t, past, H, nh, nkv, hd)
    scores = 4.0 * t * (past + t) * nh * hd
    proj = cost.flops - scores
    u = proj / (proj + TRUE["work_half_flops"]) * t / (t + TRUE["rows_half"])
    want = TRUE["call_s_attention"] + \
        max(proj / (TRUE["attention_gemm_flops"] * u), cost.bytes / TRUE["bandwidth_bytes_s"]) \
        + scores / TRUE["attention_flops"]
    assert cm.price(TRUE, rec("attention", cost, (t, past))) == pytest.approx(want, rel=1e-12)
    longer = cm.price(TRUE, rec("attention", attention_cost(t, 4 * past, H, nh, nkv, hd), (t, 4 * past)))
    assert longer > want


@pytest.mark.parametrize("shape_rows,R", [((), 128), ((0,), 0), ((1,), 1)])
def test_chunk_rest_priced_from_its_shape(shape_rows, R):
    """The shape's fifth entry is the LM head's rows (0: no head in this chunk); a four-entry record is from
    before prefills projected the last token only, so every row (R = T)."""
    T, L, H, V, n_ops = 128, 4, 256, 4096, 37
    flops = 2.0 * R * H * V
    u = flops / (flops + TRUE["work_half_flops"]) * R / (R + TRUE["rows_half"])
    # the LM head: its compute PLUS one pass over its [V, H] weight (one row, a GEMV: the pass alone); the norms'
    # [T, H] traffic per layer
    head = (flops / (TRUE["lm_head_flops"] * u) if R > 1 else 0.0) + V * H * 2 / TRUE["lm_head_bytes_s"] if R else 0.0
    want = TRUE["other_chunk_s"] + L * TRUE["other_layer_s"] + n_ops * TRUE["other_op_s"] + head + \
        L * 10 * T * H * 2 / TRUE["bandwidth_bytes_s"]
    got = cm.price(TRUE, rec("other", memory_cost(0, "other"), (T, L, H, V) + shape_rows, {"chunk_ops": n_ops}))
    assert got == pytest.approx(want, rel=1e-12)
    with pytest.raises(NpuMoeError, match="shape"):
        cm.price(TRUE, rec("other", memory_cost(0, "other"), ()))


@pytest.mark.parametrize("H,I,rate,half", [(256, 128, "peak_flops", "rows_half"),
                                            (2048, 768, "large_flops", "large_rows_half")])
def test_dynamic_experts_without_a_gemm_are_priced_per_expert_from_their_cost(H, I, rate, half):
    """The engine's dynamic / HF experts cost records no GEMM: one expert's [H, I] comes from the bytes and its
    mean rows from the FLOPs, so the large geometry gets the large GEMMs' rate."""
    idx = torch.tensor([[0, 1], [0, 2], [1, 2], [0, 3]])          # 8 assignments over 4 experts: 2 rows each
    cost = dynamic_experts_cost(idx, torch.ones_like(idx, dtype=torch.bool), H, I, 2)
    assert cost.gemm is None and cost.calls == 4
    hi = cost.bytes / (4 * 3 * 2)                                     # one expert's weights (+ the activations)
    rows, w = cost.flops / (6 * hi * 4), 6.0 * 2 * H * I             # its mean rows, its chain's FLOPs
    assert rows == pytest.approx(2.0, rel=0.02)
    u = w / (w + TRUE["work_half_flops"]) * rows / (rows + TRUE[half])
    want = TRUE["op_s_experts_dynamic"] + 4 * TRUE["call_s_experts_dynamic"] + \
        max(cost.flops / (TRUE[rate] * u), cost.bytes / TRUE["bandwidth_bytes_s"])
    got = cm.price(TRUE, cm.op_record("experts_dynamic", cost.flops, cost.bytes, cost.calls, None))
    assert got == pytest.approx(want, rel=1e-9)


@pytest.mark.parametrize("H,I,rate,half", [(256, 128, "peak_flops", "rows_half"),
                                            (2048, 768, "large_flops", "large_rows_half")])
def test_hf_experts_pay_a_scan_of_the_assignment_mask_per_expert_hit(H, I, rate, half):
    """HF's eager loop runs torch.where over the whole [K, T] mask for every expert it hits: hits x T*K elements
    at hf_scan_s, on top of the per-expert floor and the GEMMs (no dynamic op's floor: that is the engine's)."""
    T, K = 64, 2
    idx = torch.stack([torch.arange(T) % 8, (torch.arange(T) + 3) % 8], 1)     # 8 experts hit, 16 rows each
    cost = dynamic_experts_cost(idx, torch.ones_like(idx, dtype=torch.bool), H, I, 2)
    assert cost.calls == 8
    hi = cost.bytes / (8 * 3 * 2)
    rows, w = cost.flops / (6 * hi * 8), 6.0 * 16 * H * I
    u = w / (w + TRUE["work_half_flops"]) * rows / (rows + TRUE[half])
    gemm = max(cost.flops / (TRUE[rate] * u), cost.bytes / TRUE["bandwidth_bytes_s"])
    scanned = 8 * rows * 8                      # hits x the assignments read off the cost (a little below T * K)
    assert scanned == pytest.approx(8 * T * K, rel=0.2)
    want = 8 * TRUE["call_s_experts_hf"] + scanned * TRUE["hf_scan_s"] + gemm
    got = cm.price(TRUE, cm.op_record("experts_hf", cost.flops, cost.bytes, cost.calls, None))
    assert got == pytest.approx(want, rel=1e-9)
    # a record with its GEMM (the simulation's streams: rows = every assignment) scans exactly hits x T * K
    sim = cm.op_record("experts_hf", cost.flops, cost.bytes, 8, (T * K, I, H))
    assert cm.price(TRUE, sim) - cm.price({**TRUE, "hf_scan_s": 0.0}, sim) == pytest.approx(
        8 * T * K * TRUE["hf_scan_s"], rel=1e-9)
    # the engine's own dynamic experts do not scan a mask
    dyn = cm.op_record("experts_dynamic", cost.flops, cost.bytes, cost.calls, None)
    assert cm.price(TRUE, dyn) == cm.price({**TRUE, "hf_scan_s": 1.0}, dyn)


def test_router_and_dispatch_grow_with_their_elements():
    """The router's softmax / top-k over T x E scores and the dispatch's T x K assignments are priced per element
    on top of the per-call floor (the fit rows' residuals grew with T under a floor alone)."""
    T, H, E, K = 256, 256, 32, 4
    cost = dense_cost(T, H, E)
    u = cost.flops / (cost.flops + TRUE["work_half_flops"]) * cost.gemm[0] / (cost.gemm[0] + TRUE["rows_half"])
    want = TRUE["call_s_router"] + T * E * TRUE["router_elem_s"] + \
        max(cost.flops / (TRUE["peak_flops"] * u), cost.bytes / TRUE["bandwidth_bytes_s"])
    assert cm.price(TRUE, rec("router", cost, (T, H, E))) == pytest.approx(want, rel=1e-12)
    d = memory_cost(T * K * 16, "dispatch")
    want = TRUE["call_s_dispatch"] + T * K * TRUE["dispatch_row_s"] + d.bytes / TRUE["bandwidth_bytes_s"]
    assert cm.price(TRUE, rec("dispatch", d, (T * K,))) == pytest.approx(want, rel=1e-12)
    assert cm.price(TRUE, rec("dispatch", memory_cost(2 * T * K * 16, "dispatch"), (2 * T * K,))) > want


def test_a_large_attention_runs_at_its_own_rate():
    """Attention projections with a large weight (the Qwen3-30B-A3B geometry) are F.linear calls, priced at
    large_attention_flops, not the expert chains' large_flops."""
    t, past, H, nh, nkv, hd = 128, 0, 2048, 32, 4, 128
    cost = attention_cost(t, past, H, nh, nkv, hd)
    assert cost.gemm[1] * cost.gemm[2] >= cm.LARGE_GEMM_ELEMS
    scores = 4.0 * t * (past + t) * nh * hd
    proj = cost.flops - scores
    u = proj / (proj + TRUE["work_half_flops"]) * t / (t + TRUE["large_rows_half"])
    want = TRUE["call_s_attention"] + max(proj / (TRUE["large_attention_flops"] * u),
                                          cost.bytes / TRUE["bandwidth_bytes_s"]) + scores / TRUE["attention_flops"]
    assert cm.price(TRUE, rec("attention", cost, (t, past))) == pytest.approx(want, rel=1e-12)
    assert cm.price({**TRUE, "large_flops": 10 * TRUE["large_flops"]}, rec("attention", cost, (t, past))) == \
        pytest.approx(want, rel=1e-12)


def synthetic_ops():
    """A grid like measure's: every op kind at several sizes (the engine's cost builders)."""
    ops = []
    for H, I in ((256, 128), (2048, 768)):
        for G in (1, 4, 16):
            for C in (1, 4, 16, 64, 256):
                ops.append(rec("expert_group", expert_ffn_cost(G, C, H, I), (G, C, H, I)))
        for T in (32, 128, 512):
            for past in (0, T, 4 * T):
                ops.append(rec("attention", attention_cost(T, past, H, 8, 2, 64), (T, past)))
            ops.append(rec("router", dense_cost(T, H, 64), (T, H, 64)))
            ops.append(rec("shared_experts", dense_cost(T, H, 3 * I)))
            ops.append(rec("dispatch", memory_cost(T * 4 * 16.0, "dispatch"), (T * 4,)))
            ops.append(rec("pack", memory_cost(T * H * 4.0, "pack")))
            for static, parts in ((1, 0), (0, 1), (1, 2)):
                ops.append(rec("scatter", memory_cost(T * H * 4.0, "scatter"), (4 * T, H),
                               {"static_rows": static * 4 * T, "parts": parts, "tokens": T}))
            for n in (4, 16):
                dyn = expert_ffn_cost(1, T, H, I, calls=n)
                ops.append(rec("experts_dynamic", dyn))
                ops.append(rec("experts_hf", dyn))
            for L, n_ops in ((1, 8), (2, 16), (2, 80)):
                ops.append(rec("other", memory_cost(0, "other"), (T, L, H, 4096), {"chunk_ops": n_ops}))
    return ops


def test_parameters_are_recovered_from_rows_the_model_generated():
    ops = synthetic_ops()
    y = cm.price_many(TRUE, ops)
    start = {k: v * (3.0 if i % 2 else 0.3) for i, (k, v) in enumerate(TRUE.items())}
    res = cm.fit(ops, y, start=start)
    assert set(res["free"]) == set(cm.PARAMS)
    for k in cm.PARAMS:
        assert res["params"][k] == pytest.approx(TRUE[k], rel=0.05), k
    assert res["worst_abs_err"] < 1e-3


def test_a_fit_with_fewer_rows_than_free_parameters_is_refused():
    ops = synthetic_ops()[:3]                # expert groups only: 5 free parameters, 3 rows
    with pytest.raises(NpuMoeError, match="at least as many rows"):
        cm.fit(ops, cm.price_many(TRUE, ops))


def test_unknown_op_kind_is_named():
    with pytest.raises(NpuMoeError, match="'bogus'"):
        cm.price(TRUE, cm.op_record("bogus", 1.0, 1.0, 1))


def test_uninformed_parameters_stay_at_their_start():
    ops = [o for o in synthetic_ops() if o["kind"] == "expert_group"]
    res = cm.fit(ops, cm.price_many(TRUE, ops))
    assert "call_s_router" not in res["free"] and res["params"]["call_s_router"] == cm.START["call_s_router"]
    assert math.isclose(res["params"]["peak_flops"], TRUE["peak_flops"], rel_tol=0.05)
    assert np.all(np.isfinite(cm.price_many(res["params"], ops)))
