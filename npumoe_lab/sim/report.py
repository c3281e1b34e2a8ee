"""What a paper-scale simulation shows, in words and tables: npumoe's modeled speedups against the baselines beside
the paper's ranges, the ablation at paper scale, and every place NPUMoE loses (a finding, not a bug)."""
from __future__ import annotations

import pandas as pd

from npumoe_lab.planning.variants import ABLATION, PAPER_ABLATION_SPEEDUP
from npumoe_lab.sim.degenerate import equal_to, npu_idle_note

# PAPER.md 5.1 / 5.2 (the paper's measurements on M2 Max / M2 Ultra; what the model is compared with)
PAPER_RANGES = {"latency vs baselines": (1.32, 5.55), "energy vs baselines": (1.81, 7.37),
                "CPU cycles vs baselines": (1.78, 5.54)}
PAPER_END_TO_END = {"naive-npu": 3.86, "cpu-only": 1.26, "anemll": 1.19}     # "up to", end to end
BASELINES = ("cpu-only", "naive-npu", "anemll")
METRICS = {"ttft_s": "TTFT", "energy_per_token_mj": "energy/token", "cpu_cycles": "CPU cycles"}
KEYS = ["model", "platform", "prompt_len", "chunk"]


def ratios(df: pd.DataFrame, metric: str = "ttft_s") -> pd.DataFrame:
    """baseline / npumoe per configuration (> 1: npumoe better) for every baseline present."""
    t = df.pivot_table(index=KEYS, columns="variant", values=metric, aggfunc="median")
    if "npumoe" not in t:
        return pd.DataFrame()
    return pd.DataFrame({b: t[b] / t["npumoe"] for b in BASELINES if b in t}).reset_index()


def _range(s: pd.Series) -> str:
    lo, hi = f"{s.min():.2f}", f"{s.max():.2f}"
    return f"{lo}-{hi}x" if lo != hi else f"{lo}x"


def speedup_markdown(df: pd.DataFrame) -> list[str]:
    """Per model and platform: npumoe's modeled advantage over each baseline (range over prompt and chunk)."""
    lines = ["| model | platform | metric | " + " | ".join(f"vs {b}" for b in BASELINES) + " |",
             "|---|---|---|" + "---:|" * len(BASELINES)]
    for metric, label in METRICS.items():
        r = ratios(df, metric)
        for (m, p), g in r.groupby(["model", "platform"]):
            cells = [_range(g[b]) if b in g else "-" for b in BASELINES]
            lines.append(f"| {m} | {p} | {label} (modeled) | " + " | ".join(cells) + " |")
    lo, hi = PAPER_RANGES["latency vs baselines"]
    lines += ["", f"Paper (measured on M2 Max / M2 Ultra, PAPER.md 5.1-5.2): latency {lo}-{hi}x lower, energy "
              f"{PAPER_RANGES['energy vs baselines'][0]}-{PAPER_RANGES['energy vs baselines'][1]}x better, CPU "
              f"cycles {PAPER_RANGES['CPU cycles vs baselines'][0]}-{PAPER_RANGES['CPU cycles vs baselines'][1]}x "
              "lower against the baselines; end to end up to "
              + ", ".join(f"{v}x vs {k}" for k, v in PAPER_END_TO_END.items()) + "."]
    return lines


def ablation_markdown(df: pd.DataFrame) -> list[str]:
    t = df[df.variant.isin(ABLATION)].pivot_table(index=KEYS, columns="variant", values="ttft_s")
    if "npumoe-base" not in t:
        return []
    same = equal_to(df)
    lines = ["| model | platform | " + " | ".join(ABLATION) + " |", "|---|---|" + "---:|" * len(ABLATION)]
    for (m, p), g in t.groupby(level=["model", "platform"]):
        cells = []
        for v in ABLATION:
            if v not in g:
                cells.append("-")
                continue
            eq = sorted({same[(*i, v)] for i in g.index if (*i, v) in same})
            n_eq = sum((*i, v) in same for i in g.index)
            mark = f" (= {'/'.join(eq)} in {n_eq} of {len(g)})" if eq else ""
            cells.append(_range(g["npumoe-base"] / g[v]) + mark)
        lines.append(f"| {m} | {p} | " + " | ".join(cells) + " |")
    lines.append("| paper | M2 Ultra | " + " | ".join(f"{PAPER_ABLATION_SPEEDUP[v]:.2f}x" for v in ABLATION) + " |")
    lines += ["", "(= X: the step's TTFT equals step X's, or for npumoe its plan leaves no expert group on the NPU "
              "(= anemll): not a speedup of its own.)"]
    return lines


def losses(df: pd.DataFrame) -> list[str]:
    """Every configuration where npumoe is modeled slower, costlier or busier than a baseline, or where an
    ablation step makes TTFT worse than the step before."""
    out = []
    for metric, label in METRICS.items():
        r = ratios(df, metric)
        for b in BASELINES:
            if b not in r:
                continue
            bad = r[r[b] < 1]
            for (m, p), g in bad.groupby(["model", "platform"]):
                where = ", ".join(f"P={int(x['prompt_len'])}/C={int(x['chunk'])} ({x[b]:.2f}x)"
                                  for _, x in g.iterrows())
                out.append(f"- {m} on {p}: npumoe's {label} is worse than {b} at {where}")
    t = df[df.variant.isin(ABLATION)].pivot_table(index=KEYS, columns="variant", values="ttft_s")
    steps = [v for v in ABLATION if v in t]
    for prev, nxt in zip(steps, steps[1:]):
        worse = t[t[nxt] > t[prev]]
        for (m, p), g in worse.groupby(level=["model", "platform"]):
            out.append(f"- {m} on {p}: {nxt} is slower than {prev} at "
                       + ", ".join(f"P={i[2]}/C={i[3]}" for i in g.index))
    return out or ["- nowhere in this grid: npumoe is modeled at least as good as every baseline on every metric"]


def paper_scale_markdown(df: pd.DataFrame) -> str:
    src = df.routing_source.iloc[0] if "routing_source" in df else "?"
    gini = df.routing_gini.iloc[0] if "routing_gini" in df else float("nan")
    lines = [f"Simulated (geometry + routing statistics, no weights; every time, energy and cycle count modeled) "
             f"with routing `{src}` (Gini of the sampled counts {gini:.2f}); prompts "
             f"{sorted(set(df.prompt_len))}, chunks {sorted(set(df.chunk))}. Ratios are baseline / npumoe "
             "(> 1: npumoe better), ranges over prompt and chunk.", ""]
    lines += speedup_markdown(df) + [""] + npu_idle_note(df)
    if "n_npu_groups" in df.columns:
        used = df[df.variant == "npumoe"]
        lines += ["", f"npumoe's residency (makespan rule) differs by platform: NPU expert groups "
                  + ", ".join(f"{m} on {p}: {int(g.n_npu_groups.min())}-{int(g.n_npu_groups.max())} of "
                              f"{int((g.n_npu_groups + g.n_cpu_groups).max())} "
                              f"({100 * g.npu_expert_flop_share.mean():.0f}% of the expert FLOPs)"
                              for (m, p), g in used.groupby(["model", "platform"])) + "."]
    lines += ["", "Ablation (TTFT speedup over npumoe-base, modeled):", ""]
    lines += ablation_markdown(df) + ["", "Where NPUMoE loses in the model:", ""] + losses(df)
    return "\n".join(lines)


__all__ = ["paper_scale_markdown", "ratios", "losses", "PAPER_RANGES"]
