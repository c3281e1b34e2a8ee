"""The device model against the paper: sensitivity cases and conclusions, paper-check quantities.
References: hand-built result frames, the platform YAML's own alternatives, and plain `simulate` runs."""
import math

import numpy as np
import pandas as pd
import pytest

from npumoe_lab.devices import get_platform
from npumoe_lab.sim.papercheck import markdown, paper_check
from npumoe_lab.sim.run import simulate
from npumoe_lab.sim.sensitivity import ABLATION_CONCLUSION, alternatives, cases, run_sensitivity, score

SMALL = dict(geometry="phi-tiny-moe", prompt_len=512, chunk=256)


def test_score_of_a_hand_built_case():
    t = {"cpu-only": 4.0, "anemll": 3.0, "naive-npu": 8.0, "npumoe": 2.0, "npumoe-base": 10.0, "npumoe-t": 5.0,
         "npumoe-tg": 4.0}
    rows = pd.DataFrame({"variant": list(t), "ttft_s": list(t.values()), "energy_per_token_mj": 1.0,
                         "cpu_cycles": [2.0 if v == "npumoe" else 1.0 for v in t]})
    s = score(rows)
    assert s["npumoe faster than cpu-only"] == 2.0 and s["npumoe faster than naive-npu"] == 4.0
    assert s["npumoe fewer CPU cycles than cpu-only"] == 0.5                 # does not hold
    assert s[ABLATION_CONCLUSION] == pytest.approx(min(10 / 5, 5 / 4, 4 / 2))


def test_cases_cover_each_alternative_and_both_corners():
    base = get_platform("m2-max")
    alts = alternatives(base)
    cs = cases("m2-max")
    assert len(cs) == 1 + len(alts) + 2 and cs[0]["case"] == "baseline"
    for c, (knob, label, value) in zip(cs[1:], alts):
        role, _, key = knob.partition("_")
        assert c["platform"].params[role][key]["value"] == value and c["case"] == f"{knob}={label}"
    low = cs[-2]["platform"]
    for knob, _, _ in alts:
        role, _, key = knob.partition("_")
        vals = [base.params[role][key]["value"]] + [v for k, _, v in alts if k == knob]
        assert low.params[role][key]["value"] == min(vals)
    assert all(base.params[r][k]["confidence"] != "H" for r, k in (kn.split("_", 1) for kn, _, _ in alts))


def test_sensitivity_baseline_equals_a_plain_simulation_and_flips_are_consistent():
    res = run_sensitivity(SMALL["geometry"], "m2-max", prompt_len=SMALL["prompt_len"], chunk=SMALL["chunk"])
    plain = simulate(SMALL["geometry"], "synthetic:gini=0.6", "m2-max", "cpu-only,npumoe", SMALL["prompt_len"],
                     SMALL["chunk"]).set_index("variant").ttft_s
    base = res[(res.case == "baseline") & (res.conclusion == "npumoe faster than cpu-only")].ratio.iloc[0]
    assert math.isclose(base, plain["cpu-only"] / plain["npumoe"], rel_tol=1e-12)
    holds0 = res[res.case == "baseline"].set_index("conclusion").holds
    assert (res.flips == (res.holds != res.conclusion.map(holds0))).all()
    assert set(res.case) >= {"baseline", "low corner", "high corner"} and (res.timing_source == "modeled").all()


def test_paper_check_quantities_follow_the_simulated_rows():
    grid = dict(geometry="phi-tiny-moe", platforms="m2-max,m2-ultra", prompt_len="512", chunk="256,512")
    table, sens, df = paper_check(sensitivity=False, grid=grid)
    q = table.set_index("quantity")
    t = df.pivot_table(index=["platform", "chunk"], columns="variant", values="ttft_s")
    lowest = min((t[b] / t["npumoe"]).min() for b in ("cpu-only", "naive-npu", "anemll"))
    assert q.at["headline latency vs baselines, lowest (x)", "modeled"] == pytest.approx(lowest)
    assert q.at["headline latency vs baselines, lowest (x)", "paper"] == 1.32
    assert np.allclose(q.ratio, q.modeled / q.paper, equal_nan=True)
    npu = df[df.variant == "npumoe"]
    assert q.at["npumoe padding, highest (%)", "modeled"] == pytest.approx(100 * npu.pad_rate.max())
    # every headline row says whether npumoe's plan used the NPU at the setting it comes from
    row = npu.loc[npu.drop_rate.idxmax()]
    said = q.at["npumoe drop rate, highest (%)", "npumoe_used_npu"]
    assert said.startswith("no: npumoe = anemll here") == (row.n_npu_groups == 0)
    assert said.startswith("no") or f"{int(row.n_npu_groups)} of " in said
    assert all(str(u).startswith(("yes", "no", "-")) for u in q.npumoe_used_npu)
    text = markdown(table, sens, "synthetic:gini=0.6")
    assert "| headline latency vs baselines, lowest (x) | 1.32 |" in text and "modeled" in text
    assert "npumoe's plan used the NPU" in text


def test_paper_check_intervals_recompute_each_quantity_per_draw():
    """Each quantity's interval = percentiles over draws of the quantity recomputed from that draw's rows."""
    from npumoe_lab.sim.run import iter_simulation
    grid = dict(geometry="phi-tiny-moe", platforms="m2-max", prompt_len="512", chunk="256")
    table, _, _ = paper_check(sensitivity=False, grid=grid, draws=40)
    q = table.set_index("quantity")
    runs = list(iter_simulation("phi-tiny-moe", "synthetic:gini=0.6", "m2-max", "all", 512, 256, draws=40))
    t = {row["variant"]: res.draws["ttft_s"] for row, res in runs}
    lowest = np.min([t[b] / t["npumoe"] for b in ("cpu-only", "naive-npu", "anemll")], axis=0)
    name = "headline latency vs baselines, lowest (x)"
    assert q.at[name, "modeled_lo"] == pytest.approx(np.percentile(lowest, 5), rel=1e-9)
    assert q.at[name, "modeled_hi"] == pytest.approx(np.percentile(lowest, 95), rel=1e-9)
    assert q.at[name, "p_within_25pct"] == pytest.approx(np.mean((lowest / 1.32 >= 0.8) & (lowest / 1.32 <= 1.25)))
    assert (table.modeled_lo <= table.modeled_hi).all()


def test_sensitivity_probability_a_conclusion_holds_is_the_share_of_draws():
    from npumoe_lab.sim.run import iter_simulation
    res = run_sensitivity(SMALL["geometry"], "m2-max", prompt_len=SMALL["prompt_len"], chunk=SMALL["chunk"], draws=50)
    base = res[res.case == "baseline"].set_index("conclusion")
    runs = [(row, r) for row, r in iter_simulation(SMALL["geometry"], "synthetic:gini=0.6", "m2-max", "cpu-only,npumoe",
                                                   SMALL["prompt_len"], SMALL["chunk"], draws=50)]
    t = {row["variant"]: r.draws["ttft_s"] for row, r in runs}
    expect = np.mean(t["cpu-only"] / t["npumoe"] > 1)
    assert base.at["npumoe faster than cpu-only", "p_holds"] == pytest.approx(expect)
    assert res[res.case != "baseline"].p_holds.isna().all()


def test_every_quantity_says_whether_npumoe_used_the_npu_at_the_paper_point():
    """Hand-built rows at the point setting (M2 Ultra, prompt 1024, chunk 512): Qwen3's npumoe plan has no NPU
    group (= anemll), Phi-3.5-MoE's has 3 of 8."""
    from npumoe_lab.sim.papercheck import quantities
    rows = []
    for model, groups in (("qwen3-30b-a3b", 0), ("phi-3.5-moe", 3)):
        for i, v in enumerate(("cpu-only", "naive-npu", "anemll", "npumoe-base", "npumoe-t", "npumoe-tg", "npumoe")):
            rows.append(dict(model=model, platform="m2-ultra", prompt_len=1024, chunk=512, variant=v,
                             ttft_s=10.0 - i, energy_per_token_mj=5.0 - 0.5 * i, cpu_cycles=1e9 / (i + 1),
                             drop_rate=0.01 * i, pad_rate=0.3, n_npu_groups=groups if v == "npumoe" else 4,
                             n_cpu_groups=8 - groups if v == "npumoe" else 4,
                             npu_expert_flop_share=0.25 if groups else 0.0))
    q = quantities(pd.DataFrame(rows), {"npumoe": (1.0, 2.0)})
    assert all(len(v) == 3 for v in q.values())
    assert q["Qwen3-30B-A3B TTFT, NPUMoE (s)"][2] == "no: npumoe = anemll here"
    assert q["Phi-3.5-MoE expert FFN time, npumoe (ms)"][2] == "yes: 3 of 8 groups, 25% of expert FLOPs"
    assert q["ablation npumoe over npumoe-base, Phi-3.5-MoE (x)"][2].startswith("yes")
