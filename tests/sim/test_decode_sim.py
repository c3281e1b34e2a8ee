"""Decode from routing alone: a replay of a run's recorded decode routing reproduces the run's decode op stream
exactly (the run is the reference: the bundled model decoded through the engine, modeled M2 Max, real numerics), the
array stream equals the per-op replay, and decode_tokens=0 leaves the prefill-only rows as they were."""
import math
import subprocess
import sys

import numpy as np
import pytest
import torch

import npumoe_lab as nl
from npumoe_lab.execution.decode import run_decode
from npumoe_lab.execution.decode_policy import DECODE_POLICIES
from npumoe_lab.execution.geometry import ModelGeometry
from npumoe_lab.execution.routing import RoutingRecorder
from npumoe_lab.execution.runtime import PrefillConfig, run_prefill
from npumoe_lab.experiments.runner import _attach_variant
from npumoe_lab.models import describe
from npumoe_lab.planning.variants import VARIANTS
from npumoe_lab.sim.decode import decode_stream, replay_decode, step_counts, stream_decode_summary
from npumoe_lab.sim.run import simulate, variant_executor

SUMMARY = ("decode_s", "decode_energy_j", "decode_cpu_cycles", "decode_drop_rate")


@pytest.fixture(scope="module")
def tiny():
    model, tok = nl.load_model("tiny")
    profile = nl.calibrate(model, tok, "mixed", chunk=128, tokens=1024)
    return model, tok, profile


def _key(op):
    return op.name, op.kind, op.role, op.layer, op.chunk, op.cost.flops, op.cost.bytes, op.cost.calls


@pytest.mark.parametrize("policy", DECODE_POLICIES)
def test_replay_of_recorded_decode_routing_reproduces_the_op_stream(tiny, policy):
    model, tok, profile = tiny
    specs, geo = describe(model), ModelGeometry.from_config(model.config)
    ids = torch.tensor([tok("In the beginning God created the heaven and the earth. " * 30).input_ids[:300]])
    for name in ("reference", "cpu-only", "naive-npu", "npumoe", "npumoe-spill"):
        v = VARIANTS[name]
        config = PrefillConfig("m2-max", 128, attention=v.attention)
        _attach_variant(model, v, specs, profile, config, {}, None)
        pre = run_prefill(model, ids, config, measure_hf_experts=v.experts == "hf")
        with RoutingRecorder(model) as rec:
            run = run_decode(model, pre, config, 4, policy, measure_hf_experts=v.experts == "hf")
        steps = [{r.layer: (r.topk_idx, r.topk_weight, r.hidden_norm) for r in call} for call in rec.by_call()]
        assert len(steps) == 4
        executor, _ = variant_executor(v, specs, profile, "m2-max", {})
        clock, sim = replay_decode(geo, executor, config, steps, 300, policy)[0]
        assert [_key(o) for o, _, _ in clock.ops] == [_key(o) for o, _, _ in run.ops], (policy, name)
        for k in SUMMARY:
            assert math.isclose(sim[k], run.summary[k], rel_tol=1e-9, abs_tol=1e-15), (policy, name, k)
        # the same ops as arrays (the simulation's default path)
        arr, _ = variant_executor(v, specs, profile, "m2-max", {}, engine="array")
        np_steps = [{la: tuple(None if x is None else x.numpy() for x in r) for la, r in s.items()} for s in steps]
        stream = decode_stream(geo, arr, step_counts(np_steps, specs, policy, 128), 300, 128, policy,
                               attention=v.attention)
        got = stream_decode_summary(stream, config.platform)
        assert len(stream) == len(run.ops)
        for k in SUMMARY:
            assert math.isclose(got[k], run.summary[k], rel_tol=1e-9, abs_tol=1e-15), (policy, name, k)
    nl.detach(model)


GRID = dict(geometry="phi-tiny-moe", platforms="m2-max,m2-ultra", variants="all", prompt_len="512,1024",
            chunk="256")


@pytest.mark.parametrize("policy", DECODE_POLICIES)
def test_simulated_decode_array_path_equals_per_op_path(policy):
    a = simulate(**GRID, decode_tokens=3, decode_policy=policy)
    o = simulate(**GRID, decode_tokens=3, decode_policy=policy, engine="ops")
    for col in ("ttft_s", "tpot_s", "e2e_s", "energy_e2e_mj", "cpu_cycles_e2e", "decode_drop_rate"):
        np.testing.assert_allclose(a[col], o[col], rtol=1e-9, atol=1e-15, err_msg=f"{policy} {col}")
    np.testing.assert_allclose(a.e2e_s, a.ttft_s + 3 * a.tpot_s, rtol=1e-12)
    assert (a.e2e_source == "modeled").all() and (a.decode_policy == policy).all()


def test_decode_zero_keeps_the_prefill_rows_and_intervals_pair_draws():
    base = simulate(**GRID, decode_tokens=0, draws=30)
    dec = simulate(**GRID, decode_tokens=8, draws=30)
    assert not any(c.startswith(("e2e", "tpot", "decode")) for c in base.columns)
    import pandas as pd
    for c in base.columns:
        if pd.api.types.is_numeric_dtype(base[c]) and not pd.api.types.is_bool_dtype(base[c]):
            np.testing.assert_allclose(base[c], dec[c], rtol=1e-12, err_msg=c)
    assert (dec.e2e_s_lo <= dec.e2e_s_hi).all() and (dec.e2e_s_lo > dec.ttft_s_lo).all()
    assert (dec.energy_e2e_mj > base.energy_j * 1e3).all()        # the decode's energy on top of the prefill's


@pytest.mark.parametrize("flags,what", [(["--decode-tokens", "-1"], "--decode-tokens -1"),
                                        (["--decode-policy", "gpu"], "--decode-policy 'gpu'")])
def test_bad_decode_flags_one_line_exit_2(tmp_path, flags, what):
    done = subprocess.run([sys.executable, "-m", "npumoe_lab", "simulate", "--geometry", "phi-tiny-moe",
                           "--out", str(tmp_path / "o"), *flags], capture_output=True, text=True)
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and what in lines[0], done.stderr


def test_decode_routing_is_kept_per_source_and_equals_a_fresh_draw(monkeypatch):
    """A sweep's cells reuse one parsed source: its decode steps are drawn once and handed out again, equal to
    what a freshly parsed source draws, and the prompt's own draws (and their Gini) are unchanged by them."""
    monkeypatch.setenv("NPUMOE_DRAW_CACHE", "off")      # the fresh source samples its own draws, not the disk's
    from npumoe_lab.sim.decode import DECODE_SEED, decode_routing
    from npumoe_lab.sim.geometries import load_geometry
    from npumoe_lab.sim.routing import parse_routing
    specs = list(load_geometry("phi-tiny-moe", hf_config=False)[2].moe)
    src = parse_routing("synthetic:gini=0.6", specs, 0)
    before = src.chunks(specs, 512, 256, 0)
    gini = src.gini()
    first = decode_routing(src, specs, 8, 0)
    assert decode_routing(src, specs, 8, 0) is first
    # the reference: the steps as defined, one-token chunks of a freshly parsed source at the decode seed
    fresh = parse_routing("synthetic:gini=0.6", specs, 0).chunks(specs, 8, 1, 0 + DECODE_SEED)[:8]
    assert len(first) == len(fresh) == 8
    for a, b in zip(first, fresh):
        assert a.keys() == b.keys()
        for layer in a:
            for x, y in zip(a[layer], b[layer]):
                assert (x is None and y is None) or np.array_equal(x, y[:1])
    four = decode_routing(src, specs, 4, 0)            # another key: its own draw, the same stream's first steps
    assert four is not first and len(four) == 4
    assert all(np.array_equal(a[layer][0], b[layer][0]) for a, b in zip(four, first) for layer in a)
    after = src.chunks(specs, 512, 256, 0)
    assert src.gini() == gini
    for a, b in zip(before, after):
        for layer in a:
            assert np.array_equal(a[layer][0], b[layer][0])
