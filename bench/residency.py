"""Old vs new residency at the paper grid: 3 geometries x M2 Max / M2 Ultra x prompts 1024, 4096 x chunks
256, 512, 1024 = 36 settings, npumoe built with residency="cost" (the old group-by-group rule) and with the default
"makespan" rule (residency as scheduling), beside anemll and npumoe-tg, on the same default routing (the measured
defaults of data/routing/tiny-defaults.yaml). Prints a markdown table: modeled TTFT of each rule, how many settings
put at least one expert group on the NPU, and where the old rule was slower than anemll or npumoe-tg. Every time is
modeled (platform cost model); the wall time of the bench itself is measured on this host."""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import pandas as pd
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from npumoe_lab.sim.run import simulate  # noqa: E402  (after the path insert)
from npumoe_lab.utils import host_description  # noqa: E402

GRID = dict(geometry="qwen3-30b-a3b,phi-3.5-moe,phi-tiny-moe", platforms="m2-max,m2-ultra", prompt_len="1024,4096",
            chunk="256,512,1024")
KEYS = ["model", "platform", "prompt_len", "chunk"]


def compare(routing: str = "synthetic:gini=0.6", grid: dict = GRID) -> pd.DataFrame:
    """One row per setting: TTFT of anemll, npumoe-tg, npumoe (cost rule) and npumoe (makespan rule), and each
    rule's NPU expert groups."""
    base = simulate(grid["geometry"], routing, grid["platforms"], "anemll,npumoe-tg,npumoe", grid["prompt_len"],
                    grid["chunk"])
    old = simulate(grid["geometry"], routing, grid["platforms"], "npumoe", grid["prompt_len"], grid["chunk"],
                   residency="cost")
    t = base.pivot_table(index=KEYS, columns="variant", values="ttft_s")
    new_groups = base[base.variant == "npumoe"].set_index(KEYS).n_npu_groups
    old = old.set_index(KEYS)
    return pd.DataFrame({"anemll_s": t["anemll"], "npumoe_tg_s": t["npumoe-tg"], "cost_rule_s": old.ttft_s,
                         "makespan_rule_s": t["npumoe"], "cost_rule_npu_groups": old.n_npu_groups,
                         "makespan_rule_npu_groups": new_groups}).reset_index()


def markdown(df: pd.DataFrame) -> str:
    lines = ["| model | platform | prompt | chunk | anemll (s) | npumoe-tg (s) | npumoe, cost rule (s) | npumoe, makespan "
             "rule (s) | NPU groups cost / makespan |", "|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    for r in df.itertuples():
        lines.append(f"| {r.model} | {r.platform} | {r.prompt_len} | {r.chunk} | {r.anemll_s:.4g} | "
                     f"{r.npumoe_tg_s:.4g} | {r.cost_rule_s:.4g} | {r.makespan_rule_s:.4g} | "
                     f"{int(r.cost_rule_npu_groups)} / {int(r.makespan_rule_npu_groups)} |")
    n = len(df)
    eps = 1e-9
    worse_old = int(((df.cost_rule_s > df.anemll_s * (1 + eps)) | (df.cost_rule_s > df.npumoe_tg_s * (1 + eps))).sum())
    worse_new = int(((df.makespan_rule_s > df.anemll_s * (1 + eps)) |
                     (df.makespan_rule_s > df.npumoe_tg_s * (1 + eps))).sum())
    lines += ["", f"Settings whose npumoe puts at least one expert group on the NPU: cost rule "
                  f"{int((df.cost_rule_npu_groups > 0).sum())} of {n}, makespan rule "
                  f"{int((df.makespan_rule_npu_groups > 0).sum())} of {n}. Slower than anemll or npumoe-tg: cost rule "
                  f"{worse_old} of {n}, makespan rule {worse_new} of {n}. TTFT makespan / cost rule: median "
                  f"{(df.makespan_rule_s / df.cost_rule_s).median():.3f}, range "
                  f"{(df.makespan_rule_s / df.cost_rule_s).min():.3f}-{(df.makespan_rule_s / df.cost_rule_s).max():.3f}"
                  " (all modeled)."]
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--routing", default="synthetic:gini=0.6")
    a = ap.parse_args(argv)
    torch.set_num_threads(1)
    t0 = time.perf_counter()
    df = compare(a.routing)
    print(markdown(df))
    print(f"\n(bench wall time {time.perf_counter() - t0:.0f} s, measured on {host_description()}, one thread)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
