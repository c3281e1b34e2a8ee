"""Routing sources from real routing data (counts: / trace:), checked by hand on small cases: the leave-one-domain-
out drop rate equals the drop computed directly from the counts with the plan's capacities, and routing-stats on an
imported llama.cpp moe-trace CSV reproduces Gini and hot-10 % share computed straight from the CSV."""
import csv
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from npumoe_lab.cli import main
from npumoe_lab.planning.plan import variant_plan
from npumoe_lab.routing_data.schema import RoutingData, counts_from_selections, selections_frame
from npumoe_lab.sim.geometries import load_geometry
from npumoe_lab.sim.real_routing import from_counts, from_trace
from npumoe_lab.sim.routing import parse_routing
from npumoe_lab.sim.run import simulate

FIX = Path(__file__).parent.parent / "routing_data" / "fixtures"
TINY = "data/models/npumoe-tiny"
SPECS = list(load_geometry(TINY, hf_config=False)[2].moe)      # 4 layers, 32 experts, top-4


def _three_domain_trace(tmp_path) -> Path:
    """A per-token trace of 3 domains with different hot sets (the eval domain's hot experts differ)."""
    rng = np.random.default_rng(3)
    frames = []
    for d, hot in (("a", [0, 1, 2, 3]), ("b", [0, 1, 4, 5]), ("c", [6, 7, 0, 8])):
        p = np.full(32, 1.0)
        p[hot] = 12.0
        p /= p.sum()
        T = 300
        ids = np.stack([[rng.choice(32, 4, replace=False, p=p) for _ in range(T)] for _ in SPECS])   # [L, T, K]
        for j, s in enumerate(SPECS):
            frames.append(selections_frame(s.layer, np.repeat(np.arange(T), 4), d, d, "prefill",
                                           np.tile(np.arange(4), T), ids[j].reshape(-1)))
    sel = pd.concat(frames, ignore_index=True)
    prov = {"model": "hand-made", "tool": "test", "phase": "prefill", "licence": "test", "notes": [],
            "geometry": {"name": "npumoe-tiny", "moe_layers": [0, 1, 2, 3], "n_experts": 32, "top_k": 4}}
    RoutingData("trace", counts_from_selections(sel), prov, sel).save(tmp_path / "lodo")
    return tmp_path / "lodo"


def test_leave_one_domain_out_drop_equals_direct_count(tmp_path):
    folder = _three_domain_trace(tmp_path)
    chunk, prompt = 64, 256
    sel = pd.read_parquet(folder / "selections.parquet")
    src = from_trace(SPECS, folder, "a+b", "c")
    prof = src.calibration_profile(SPECS, chunk)
    # the plan is calibrated on domains a and b only: its per-chunk counts are a+b's tokens, chunk by chunk
    for s in SPECS:
        ab = sel[(sel.layer == s.layer) & sel.domain.isin(["a", "b"])].sort_values(["segment", "phase", "token",
                                                                                    "rank"])
        ids = ab.expert.to_numpy().reshape(-1, 4)
        want = np.stack([np.bincount(ids[j * chunk:(j + 1) * chunk].ravel(), minlength=32)
                         for j in range(len(ids) // chunk)], 1)
        np.testing.assert_array_equal(prof.count_matrix(s.layer), want)
    plan = variant_plan(prof, "npumoe-tg", SPECS, platform="m2-max")
    over = routed = 0
    for lp in plan.layers:              # by hand: domain c's tokens in order, chunk by chunk, against the capacities
        c = sel[(sel.layer == lp["layer"]) & (sel.domain == "c")].sort_values(["token", "rank"])
        ids = c.expert.to_numpy().reshape(-1, 4)[:prompt]
        cap = np.asarray(lp["capacity"])
        for j in range(prompt // chunk):
            cnt = np.bincount(ids[j * chunk:(j + 1) * chunk].ravel(), minlength=32)
            over += np.maximum(cnt - cap, 0).sum()
            routed += cnt.sum()
    df = simulate(TINY, f"trace:{folder},calib=a+b,eval=c", "m2-max", "npumoe-tg", prompt, chunk)
    assert over > 0                     # the held-out domain's hot experts overflow: the case is not trivial
    assert df.drop_rate.iloc[0] == pytest.approx(over / routed, abs=1e-12)
    assert "calib = a+b, eval = c" in df.routing_source.iloc[0]


def test_counts_calibration_is_the_mix_of_the_other_domains(tmp_path):
    folder = _three_domain_trace(tmp_path)
    data = RoutingData.load(folder)
    src = from_counts(SPECS, folder)                 # default: leave one out
    label = src.label
    ev = label.split("eval = ")[1].split(" ")[0]
    rest = [d for d in "abc" if d != ev]
    for s in SPECS:
        mix = data.counts[(data.counts.layer == s.layer) & data.counts.domain.isin(rest)].groupby("expert")["count"] \
            .sum().reindex(range(32), fill_value=0).to_numpy(float)
        np.testing.assert_allclose(src.calibration[s.layer], (mix + 1e-9) / (mix + 1e-9).sum(), rtol=1e-12)
    assert "leave one out" in label


def test_acceptance_counts_source_names_data_phase_and_gaps():
    df = simulate("qwen3-30b-a3b", "counts:qwen3-30b-a3b", "m2-max", "cpu-only,npumoe", 1024, 512)
    src = df.routing_source.iloc[0]
    assert "qwen3-30b-a3b" in src and "phase decode" in src and "decode-only" in src
    assert df.ttft_s.gt(0).all()


def test_trace_source_on_an_imported_per_token_trace(tmp_path):
    out = tmp_path / "trace"
    assert main(["routing-import", "--format", "llama-moe-trace", str(FIX / "llama_moe_trace_phase.csv"),
                 "--model-geometry", TINY, "--out", str(out)]) == 0
    df = simulate(TINY, f"trace:{out}", "m2-max", "cpu-only,npumoe-tg", 128, 32)
    assert df.routing_source.str.startswith("trace:").all() and "replayed chunk by chunk" in df.routing_source.iloc[0]
    assert parse_routing(str(out), SPECS).__class__.__name__ == "TraceRouting"     # a folder: whichever kind


def test_geometry_mismatch_refused():
    from npumoe_lab.errors import NpuMoeError
    with pytest.raises(NpuMoeError, match="experts top-"):
        parse_routing("counts:mixtral-8x7b", list(load_geometry("qwen3-30b-a3b", hf_config=False)[2].moe))


def _gini_by_pairs(x):
    x = np.asarray(x, float)
    return np.abs(x[:, None] - x[None, :]).sum() / (2 * len(x) ** 2 * x.mean())


def test_routing_stats_on_llama_csv_reproduces_gini_and_hot10(tmp_path):
    imp = tmp_path / "imp"
    assert main(["routing-import", "--format", "llama-moe-trace", str(FIX / "llama_moe_trace.csv"),
                 "--model-geometry", TINY, "--out", str(imp)]) == 0
    assert main(["routing-stats", "--routing", str(imp), "--out", str(tmp_path / "stats")]) == 0
    got = pd.read_csv(tmp_path / "stats" / "routing_stats.csv")
    with open(FIX / "llama_moe_trace.csv", newline="") as f:
        rows = [(int(a), int(b)) for a, b in csv.reader(f)]
    for layer in range(4):
        x = np.bincount([e for lay, e in rows if lay == layer], minlength=32).astype(float)
        r = got[got.layer == layer].iloc[0]
        assert r.gini == pytest.approx(_gini_by_pairs(x), abs=1e-9)
        top = np.sort(x)[::-1][:math.ceil(32 / 10)]
        assert r.hot10_share == pytest.approx(top.sum() / x.sum(), abs=1e-9)
    assert (tmp_path / "stats" / "ROUTING_STATS.md").read_text().count("Verdict") == 1
    assert (tmp_path / "stats" / "routing_stats.png").stat().st_size > 1000


def test_shipped_olmoe_counts_reproduce_the_sourced_overlaps():
    """ROUTING_SOURCES.md (computed from the public files): one domain against the mix of six, 1 - TV = 0.78-0.89 at
    layer 0 and 0.57-0.88 at layers 7 and 15."""
    data = RoutingData.load("data/routing/olmoe-1b-7b")
    from npumoe_lab.sim.textlike import tv_overlap
    for layer, (lo, hi) in ((0, (0.78, 0.89)), (7, (0.57, 0.88)), (15, (0.57, 0.88))):
        ov = [tv_overlap(data.count_vector(layer), data.count_vector(layer, [d])) for d in data.domains]
        assert lo - 0.006 <= min(ov) and max(ov) <= hi + 0.006, (layer, ov)


def test_real_takes_each_geometrys_own_data_else_real_statistics():
    q = parse_routing("real", list(load_geometry("qwen3-30b-a3b", hf_config=False)[2].moe))
    assert q.label.startswith("real -> counts:qwen3-30b-a3b")
    p = parse_routing("real", list(load_geometry("phi-3.5-moe", hf_config=False)[2].moe))
    assert p.label.startswith("real -> no routing data") and "gini=0.56" in p.label and "OLMoE" in p.label
