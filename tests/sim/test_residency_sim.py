"""Residency as scheduling, end to end through the simulator: npumoe is never slower than npumoe-tg or anemll on
the routing it was calibrated on, a faster NPU never makes it slower, rows say what each plan did, and the bundled
model's routing statistics reproduce its measured drop and padding rates."""
import dataclasses

import numpy as np
import pandas as pd
import pytest

from npumoe_lab.devices import get_platform
from npumoe_lab.planning.plan import variant_plan
from npumoe_lab.planning.profile import CalibrationProfile
from npumoe_lab.sim.geometries import load_geometry
from npumoe_lab.sim.routing import parse_routing
from npumoe_lab.sim.run import simulate
from npumoe_lab.utils import REPO_ROOT

TINY_DIR = REPO_ROOT / "data" / "models" / "npumoe-tiny"


class SameRouting:
    """The prompt's chunks are the calibration: the plan is chosen on exactly the counts it is run on."""
    def __init__(self, base, specs, prompt_len, chunk, seed=0):
        self.label, self.base = "same:" + base.label, base
        self.routed = base.chunks(specs, prompt_len, chunk, seed)
        rows = []
        for c, per in enumerate(self.routed):
            for s in specs:
                n = np.bincount(np.asarray(per[s.layer][0]).reshape(-1), minlength=s.n_experts)
                rows += [dict(layer=s.layer, expert=e, chunk_id=c, count=int(n[e])) for e in range(s.n_experts)]
        counts = pd.DataFrame(rows)
        stats = counts.groupby(["layer", "expert"], as_index=False)["count"].sum().assign(
            weight_sum=0.0, weight_sq_sum=0.0, norm_sum=0.0)
        self.profile = CalibrationProfile(counts, stats, {"chunk": chunk, "model_fingerprint": "simulated",
                                                          "layers": [dict(vars(s)) for s in specs]})

    def chunks(self, specs, prompt_len, chunk, seed=0):
        return self.routed

    def calibration_profile(self, specs, chunk, seed=0):
        return self.profile

    def gini(self):
        return self.base.gini()


def _short(name, n_layers=6):
    _, _, geo = load_geometry(name)
    moe = [geo.moe_layers[i] for i in sorted(geo.moe_layers)][:n_layers]
    return dataclasses.replace(geo, moe=tuple(moe), n_layers=n_layers)


@pytest.mark.parametrize("geometry", ["qwen3-30b-a3b", "phi-3.5-moe", "phi-tiny-moe"])
@pytest.mark.parametrize("chunk", [256, 1024])
def test_never_slower_than_npumoe_tg_or_anemll_on_its_routing(geometry, chunk, monkeypatch):
    geo = _short(geometry)
    specs = list(geo.moe)
    src = SameRouting(parse_routing("synthetic:gini=0.6", specs), specs, 2 * chunk, chunk)
    monkeypatch.setattr("npumoe_lab.sim.run.load_geometry", lambda g, hf_config=True: (geometry, None, geo))
    plats = [get_platform("m2-max"), get_platform("m2-ultra"), get_platform("m2-max", npu_throughput_curve="flat"),
             get_platform("m2-max", cpu_throughput_flops="sgemm_512"), get_platform("m4-max")]
    df = simulate(geometry, src, plats, "npumoe,npumoe-tg,anemll", 2 * chunk, chunk)
    t = df.pivot_table(index="platform_hash", columns="variant", values="ttft_s")
    assert (t["npumoe"] <= t["npumoe-tg"] * (1 + 1e-9)).all()
    assert (t["npumoe"] <= t["anemll"] * (1 + 1e-9)).all()


def test_rows_say_what_the_plan_did():
    df = simulate("phi-tiny-moe", "synthetic:gini=0.6", "m2-max", "npumoe,npumoe-tg,anemll,reference", 512, 256)
    r = df.set_index("variant")
    E = 16 * 32                                    # phi-tiny-moe: 16 experts x 32 MoE layers
    assert r.at["anemll", "n_npu_groups"] == 0 and r.at["anemll", "n_cpu_groups"] == E
    assert r.at["anemll", "npu_expert_flop_share"] == 0 and r.at["npumoe-tg", "npu_expert_flop_share"] == 1
    assert r.at["npumoe-tg", "n_cpu_groups"] == 0 and r.at["reference", "n_npu_groups"] == 0
    # compile time: one per resident group + one per NPU attention layer and chunk shape, apart from TTFT
    per = get_platform("m2-max").params["npu"]["compile_s"]["value"]
    tg = r.loc["npumoe-tg"]
    assert tg.npu_compiles == tg.n_npu_groups + 32 * 2 and tg.compile_s == pytest.approx(tg.npu_compiles * per)
    assert tg.npu_programs == tg.n_npu_groups + 32 and "resident_programs" in tg.ane_limits
    assert r.at["reference", "compile_s"] == 0


def test_a_faster_npu_gives_npumoe_a_ttft_no_higher():
    """The override of the platform syntax "m2-max[npu_throughput_flops=1.2e+13]", in Python."""
    plain = simulate("qwen3-30b-a3b", "synthetic:gini=0.6", "m2-max", "npumoe,anemll", 1024, 512)
    fast = simulate("qwen3-30b-a3b", "synthetic:gini=0.6", [get_platform("m2-max", npu_throughput_flops=1.2e13)],
                    "npumoe", 1024, 512)
    p = plain.set_index("variant")
    assert fast.ttft_s.iloc[0] <= p.at["npumoe", "ttft_s"]
    assert p.at["npumoe", "n_npu_groups"] > 0 and p.at["npumoe", "ttft_s"] < p.at["anemll", "ttft_s"]
    # the measured routing variation drops tokens (in the resident groups only: 71 under the ANE's program budget)
    assert p.at["npumoe", "drop_rate"] > 0.002


def _measured(plan, profile):
    """Drop and padding of `plan` against a real profile's per-chunk counts (every expert static: npumoe-tg)."""
    routed = dropped = slots = padded = 0
    for lp in plan.layers:
        counts = profile.count_matrix(lp["layer"])
        cap = np.asarray(lp["capacity"])[:, None]
        kept = np.minimum(counts, cap)
        routed, dropped = routed + counts.sum(), dropped + (counts - kept).sum()
        slots, padded = slots + cap.sum() * counts.shape[1], padded + (cap - kept).sum()
    return dropped / routed, padded / slots


@pytest.mark.parametrize("workload", ["code", "pydocs", "fewshot-cls", "ruler-vt"])
def test_the_bundled_models_statistics_reproduce_its_drop_and_padding(workload):
    from npumoe_lab.sim.routing_stats import tiny_profiles
    profiles = tiny_profiles()
    _, _, geo = load_geometry(TINY_DIR)
    specs = list(geo.moe)
    plan = variant_plan(profiles["mixed"], "npumoe-tg", specs, platform="m2-max")
    drop, pad = _measured(plan, profiles[workload])
    df = pd.concat([simulate(str(TINY_DIR), f"tiny:workload={workload}", "m2-max", "npumoe-tg", 2048, 256, seed=s)
                    for s in range(4)])
    assert set(df.plan_hash) == {plan.hash}                    # the same plan
    assert abs(df.drop_rate.mean() - drop) <= 0.03 and abs(df.pad_rate.mean() - pad) <= 0.03
