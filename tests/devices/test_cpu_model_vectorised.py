"""The vectorised host model (devices/cpu_model.py: features once, numpy evaluation) against a plain copy of the
scalar per-record `price` it replaced (2026-12-04): equal to rtol 1e-12 on the real measurement rows and on
generated records of every op kind, and the same fit."""
import math
import os
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from npumoe_lab.devices import cpu_model as cm
from npumoe_lab.errors import NpuMoeError

# real `measure --device cpu` rows where this checkout has them (`make cpu-loop` writes them), or any such file
# named by NPUMOE_CPU_MEASUREMENTS; the property tests below cover generated records everywhere
MEASUREMENTS = Path(os.environ.get("NPUMOE_CPU_MEASUREMENTS") or
                    Path(__file__).resolve().parents[2] / "results" / "cpu-loop" / "measure" / "measurements.yaml")
LARGE, DB = cm.LARGE_GEMM_ELEMS, cm.DTYPE_BYTES


# ---- reference: the scalar model as it was (one record at a time, plain Python) ----
def ref_gemm_of(op):
    if op["gemm"] is not None or op["kind"] not in ("experts_dynamic", "experts_hf") or not op["bytes"]:
        return op["gemm"]
    calls = max(op["calls"], 1)
    hi = op["bytes"] / (calls * 3 * DB)
    rows = op["flops"] / (6.0 * hi * calls)
    return (max(rows, 1e-9), int(hi), 1)


def ref_util(w, rows, p, large=False):
    if w <= 0:
        return 1.0
    return w / (w + p["work_half_flops"]) * rows / (rows + p["large_rows_half" if large else "rows_half"])


def ref_gemm_memory(flops, nbytes, w, rows, p, rate="peak_flops"):
    large = rate in ("large_flops", "large_attention_flops")
    t_gemm = flops / (p[rate] * ref_util(w, max(rows, 1), p, large)) if flops else 0.0
    return max(t_gemm, nbytes / p["bandwidth_bytes_s"])


def ref_context(op, key, default):
    ctx = op.get("context")
    return default if not ctx or key not in ctx else ctx[key]


def ref_price(p, op):
    kind, calls, gemm = op["kind"], op["calls"], op["gemm"]
    if kind == "other":
        t, layers, h, v = op["shape"][:4]
        r = op["shape"][4] if len(op["shape"]) == 5 else t          # the LM head's rows (4 entries: every row)
        flops = 2.0 * r * h * v
        gemm = flops / (p["lm_head_flops"] * ref_util(flops, r, p)) if r > 1 else 0.0     # one row: a GEMV, the pass
        t_head = gemm + v * h * DB / p["lm_head_bytes_s"] if r else 0.0
        return (p["other_chunk_s"] + layers * p["other_layer_s"] + ref_context(op, "chunk_ops", 0) * p["other_op_s"]
                + t_head + layers * 10 * t * h * DB / p["bandwidth_bytes_s"])
    base = calls * p[f"call_s_{kind}"]
    calls = max(calls, 1)
    gemm = ref_gemm_of(op)
    rows = 1 if gemm is None else gemm[0]
    flops, nbytes, scores, chains, rate = op["flops"], op["bytes"], 0.0, calls, "peak_flops"
    if kind == "attention":
        rate = "attention_gemm_flops" if gemm is None or gemm[1] * gemm[2] < LARGE else "large_attention_flops"
    elif gemm is not None and gemm[1] * gemm[2] >= LARGE:
        rate = "large_flops"
    if kind == "experts_dynamic":
        base += p["op_s_experts_dynamic"]
    if kind == "router" and len(op["shape"]) == 3:
        base += op["shape"][0] * op["shape"][2] * p["router_elem_s"]
    if kind == "dispatch" and op["shape"]:
        base += op["shape"][0] * p["dispatch_row_s"]
    if kind == "experts_hf" and gemm is not None:     # each expert hit scans all T * K assignments
        assignments = gemm[0] if op["gemm"] is not None else gemm[0] * calls
        base += calls * assignments * p["hf_scan_s"]
    if kind in ("experts_dynamic", "experts_hf") and op["gemm"] is not None:
        rows = rows / calls
    elif kind == "expert_group" and len(op["shape"]) == 4:
        chains = calls * op["shape"][0]
        base += chains * p["call_s_group_expert"]
    elif kind == "scatter":
        static, n_parts = ref_context(op, "static_rows", 1) > 0, ref_context(op, "parts", 0)
        base += static * p["call_s_gather"] + n_parts * p["call_s_scatter_part"]
        h = op["shape"][1] if len(op["shape"]) == 2 else 0
        nbytes = (nbytes if static else 0.0) + (3 * n_parts + (not static)) * ref_context(op, "tokens", 0) * h * DB
    if kind == "attention" and gemm is not None and len(op["shape"]) == 2:
        t, past = op["shape"]
        score_flops = 4.0 * t * (past + t) * gemm[1]
        flops = max(flops - score_flops, 0.0)
        scores = score_flops / p["attention_flops"]
    return base + ref_gemm_memory(flops, nbytes, flops / chains, rows, p, rate) + scores


def ref_informed(name, ops):
    kinds = {o["kind"] for o in ops}
    if name.startswith("call_s_") and name[len("call_s_"):] in cm.CALL_KINDS:
        return name[len("call_s_"):] in kinds
    if name == "call_s_group_expert":
        return any(o["kind"] == "expert_group" and len(o["shape"]) == 4 for o in ops)
    if name == "call_s_gather":
        return any(o["kind"] == "scatter" and ref_context(o, "static_rows", 1) > 0 for o in ops)
    if name == "call_s_scatter_part":
        return any(o["kind"] == "scatter" and ref_context(o, "parts", 0) > 0 for o in ops)
    if name == "other_op_s":
        return any(o["kind"] == "other" and ref_context(o, "chunk_ops", 0) > 0 for o in ops)
    if name in ("other_chunk_s", "other_layer_s"):
        return "other" in kinds
    if name in ("lm_head_flops", "lm_head_bytes_s"):      # the rate needs a head of more than one row
        least = 2 if name == "lm_head_flops" else 1
        return any(o["kind"] == "other" and (o["shape"][4] if len(o["shape"]) == 5 else o["shape"][0]) >= least
                   for o in ops)
    if name in ("large_flops", "large_rows_half"):
        return any(o["kind"] not in ("other", "attention") and (g := ref_gemm_of(o)) is not None
                   and g[1] * g[2] >= LARGE for o in ops) or \
            (name == "large_rows_half" and ref_informed("large_attention_flops", ops))
    if name == "large_attention_flops":
        return any(o["kind"] == "attention" and o["gemm"] is not None and o["gemm"][1] * o["gemm"][2] >= LARGE
                   for o in ops)
    if name == "op_s_experts_dynamic":
        return "experts_dynamic" in kinds
    if name == "router_elem_s":
        return any(o["kind"] == "router" and len(o["shape"]) == 3 for o in ops)
    if name == "dispatch_row_s":
        return any(o["kind"] == "dispatch" and o["shape"] for o in ops)
    if name == "hf_scan_s":
        return any(o["kind"] == "experts_hf" and ref_gemm_of(o) is not None for o in ops)
    if name == "attention_flops":
        return "attention" in kinds
    if name == "attention_gemm_flops":
        return any(o["kind"] == "attention" and o["gemm"] is not None and o["gemm"][1] * o["gemm"][2] < LARGE
                   for o in ops)
    return True


# ---- generated records of every kind ----
pos = st.floats(1.0, 1e13, allow_nan=False)
dims = st.integers(1, 4096)
params = st.fixed_dictionaries({k: st.floats(0.2, 5.0).map(lambda m, v=v: v * m) for k, v in cm.START.items()})


@st.composite
def records(draw):
    kind = draw(st.sampled_from(cm.CALL_KINDS + ("other", "experts_dynamic", "experts_hf", "scatter",
                                                 "expert_group", "attention")))
    calls = draw(st.integers(0, 64))
    gemm = draw(st.none() | st.tuples(dims, st.sampled_from([64, 256, 2048, 4096]), st.sampled_from([128, 768, 2048])))
    shape, ctx = (), None
    if kind == "other":
        shape = (draw(dims), draw(st.integers(1, 48)), draw(dims), draw(st.integers(1000, 152000)))
        ctx = draw(st.none() | st.fixed_dictionaries({"chunk_ops": st.integers(0, 900)}))
    elif kind == "attention":
        shape = draw(st.just(()) | st.tuples(dims, st.integers(0, 8192)))
    elif kind == "expert_group":
        shape = draw(st.just(()) | st.tuples(st.integers(1, 32), dims, dims, dims))
    elif kind == "scatter":
        shape = draw(st.just(()) | st.tuples(dims, dims))
        ctx = draw(st.none() | st.fixed_dictionaries({"static_rows": st.integers(0, 2048), "parts": st.integers(0, 4),
                                                      "tokens": dims}))
    elif kind in ("experts_dynamic", "experts_hf"):
        shape = draw(st.just(()) | st.tuples(dims, dims))
    elif kind == "router":
        shape = draw(st.just(()) | st.tuples(dims, dims, st.integers(1, 256)))
    elif kind == "dispatch":
        shape = draw(st.just(()) | st.tuples(dims))
    nbytes = draw(st.just(0.0) | pos)
    return cm.op_record(kind, draw(st.just(0.0) | pos), nbytes, calls, gemm, shape, context=ctx)


@settings(max_examples=150, deadline=None)
@given(st.lists(records(), min_size=1, max_size=40), params)
def test_generated_records_price_as_the_scalar_reference(ops, p):
    want = np.array([ref_price(p, o) for o in ops])
    np.testing.assert_allclose(cm.price_many(p, ops), want, rtol=1e-12, atol=0)
    np.testing.assert_allclose([cm.price(p, o) for o in ops], want, rtol=1e-12, atol=0)
    assert all(cm._informed(k, ops) == ref_informed(k, ops) for k in cm.PARAMS)


@settings(max_examples=50, deadline=None)
@given(st.lists(records(), min_size=4, max_size=40), params, st.data())
def test_a_masked_feature_subset_prices_its_records(ops, p, data):
    mask = np.array(data.draw(st.lists(st.booleans(), min_size=len(ops), max_size=len(ops))))
    got = cm.price_many(p, cm.features(ops)[mask])
    np.testing.assert_allclose(got, [ref_price(p, o) for o, m in zip(ops, mask) if m], rtol=1e-12, atol=0)


def test_bad_records_raise_the_same_errors():
    with pytest.raises(NpuMoeError, match="'other' op needs shape"):
        cm.price(cm.START, cm.op_record("other", 1, 1, 1, None, (4, 2)))
    with pytest.raises(NpuMoeError, match="no price in the CPU model"):
        cm.price_many(cm.START, [cm.op_record("router", 1, 1, 1), cm.op_record("warp", 1, 1, 1)])


@pytest.mark.skipif(not MEASUREMENTS.is_file(), reason=f"no {MEASUREMENTS} on this machine")
def test_every_real_measurement_row_prices_as_the_scalar_reference():
    from npumoe_lab.devices.cpu_fit import host_op, host_rows
    from npumoe_lab.devices.measurements import load_measurements
    ops = [host_op(r) for r in host_rows(load_measurements(MEASUREMENTS)).to_dict("records")]
    assert len(ops) > 1000
    rng = np.random.default_rng(7)
    for p in (cm.START, {k: v * math.exp(rng.normal(0, 1)) for k, v in cm.START.items()}):
        np.testing.assert_allclose(cm.price_many(p, ops), [ref_price(p, o) for o in ops], rtol=1e-12, atol=0)


def ref_fit(ops, y, start):
    """The fit as it was: least squares on log time over the scalar reference, finite-difference Jacobian."""
    from scipy.optimize import least_squares
    free = [k for k in cm.PARAMS if ref_informed(k, ops)]
    base = {**cm.START, **start}

    def params(x):
        return {**base, **{k: math.exp(v) for k, v in zip(free, x)}}
    sol = least_squares(lambda x: np.log([ref_price(params(x), o) for o in ops]) - np.log(y),
                        np.array([math.log(base[k]) for k in free]), method="trf", x_scale=1.0, max_nfev=4000)
    return params(sol.x), free


def test_fit_returns_the_scalar_references_parameters():
    from tests.devices.test_cpu_model import TRUE, synthetic_ops
    ops = synthetic_ops()
    y = np.array([ref_price(TRUE, o) for o in ops]) * np.exp(np.random.default_rng(3).normal(0, 0.05, len(ops)))
    start = {k: v * 1.7 for k, v in TRUE.items()}
    want, free = ref_fit(ops, y, start)
    got = cm.fit(ops, y, start=start)
    assert got["free"] == free
    for k in free:
        assert math.log(got["params"][k] / want[k]) == pytest.approx(0, abs=1e-5), k
