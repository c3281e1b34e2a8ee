"""Variants in disguise: npumoe with no NPU group is anemll, an ablation step equal to an earlier one is marked."""
import pandas as pd

from npumoe_lab.sim.degenerate import equal_to, no_npu, npu_idle_note
from npumoe_lab.sim.report import ablation_markdown, paper_scale_markdown


def _rows():
    rows = []
    for plat, npumoe_groups in (("m2-max", 5), ("m2-ultra", 0)):
        t = {"npumoe-base": 8.0, "npumoe-t": 4.0, "npumoe-tg": 4.0, "npumoe": 2.0 if npumoe_groups else 3.0,
             "anemll": 3.0, "cpu-only": 4.0, "naive-npu": 9.0}
        for v, s in t.items():
            rows.append(dict(model="m", platform=plat, prompt_len=1024, chunk=512, variant=v, ttft_s=s,
                             energy_per_token_mj=1.0, cpu_cycles=1e9, routing_source="synthetic", routing_gini=0.6,
                             n_npu_groups=npumoe_groups if v == "npumoe" else (0 if v in ("anemll", "cpu-only") else 8),
                             n_cpu_groups=8 - npumoe_groups if v == "npumoe" else 8,
                             npu_expert_flop_share=0.5 if (v != "npumoe" or npumoe_groups) else 0.0))
    return pd.DataFrame(rows)


def test_equal_steps_and_npumoe_without_npu_groups():
    df = _rows()
    same = equal_to(df)
    assert same[("m", "m2-max", 1024, 512, "npumoe-tg")] == "npumoe-t"          # 4.0 s = 4.0 s
    assert same[("m", "m2-ultra", 1024, 512, "npumoe")] == "anemll"             # no NPU group
    assert ("m", "m2-max", 1024, 512, "npumoe") not in same
    assert no_npu(df).platform.tolist() == ["m2-ultra"]
    assert "in 1 of 2 settings: m on m2-ultra P=1024/C=512" in npu_idle_note(df)[0]


def test_reports_mark_them():
    df = _rows()
    table = "\n".join(ablation_markdown(df))
    assert "(= npumoe-t in 1 of 1)" in table and "(= anemll in 1 of 1)" in table
    text = paper_scale_markdown(df)
    assert "**npumoe = anemll here**" in text and "m on m2-max: 5-5 of 8" in text
