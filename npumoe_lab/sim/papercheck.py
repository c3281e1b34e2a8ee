"""`npumoe-lab paper-check`: every number of the paper's results (PAPER.md section 5) the device model can predict,
at the paper's setting, beside the paper's value, with the two device parameters each is most sensitive to.

Settings the paper does not state are chosen here and printed with the table: routing is synthetic (Gini 0.6: the
paper reports no routing statistics; its per-document and per-chunk variation and hot-set shift between the
calibration mix and the prompt's workload are the measured defaults of data/routing/tiny-defaults.yaml, so the
drop and padding rows follow from the bundled model's routing), "point" numbers are taken at prompt 1024 and chunk 512 on M2 Ultra, the
breakdown (PAPER.md 5.3, "probably Phi-3.5-MoE, M2 Ultra") on Phi-3.5-MoE, headline ranges over the paper's grid
(3 models x M2 Max / M2 Ultra x prompts 1024, 4096 x chunks 256, 512, 1024) against cpu-only, naive-npu and anemll.
End-to-end speedups are compared with prefill (TTFT) ratios: the model has no decode. No parameter is fitted: the
platforms are used as sourced (a fitted profile would be a separate platform, fitted on a declared half).
"""
from __future__ import annotations

import argparse
import math
import time
from pathlib import Path

import pandas as pd

from npumoe_lab.results.store import write_rows
from npumoe_lab.sim.report import BASELINES, PAPER_END_TO_END, PAPER_RANGES
from npumoe_lab.sim.run import iter_simulation
from npumoe_lab.sim.sensitivity import VARIANTS, cases, report, score

GRID = dict(geometry="qwen3-30b-a3b,phi-3.5-moe,phi-tiny-moe", platforms="m2-max,m2-ultra", prompt_len="1024,4096",
            chunk="256,512,1024")
POINT = dict(prompt_len=1024, chunk=512, platform="m2-ultra")
FFN_EVENTS = ("cold", "spill", "experts")          # + every "group<i>": the expert FFN time of PAPER.md 5.3


def _ffn_and_scatter_ms(events) -> tuple[float, float]:
    ffn = sum(e.duration_s for e in events if e.name.startswith("group") or e.name in FFN_EVENTS)
    return 1e3 * ffn, 1e3 * sum(e.duration_s for e in events if e.name == "scatter")


def _npu_use(df: pd.DataFrame):
    """setting (model, platform, prompt, chunk) -> whether npumoe's plan ran expert groups on the NPU, in words."""
    if "n_npu_groups" not in df.columns:
        return lambda key: "-"
    rows = df[df.variant == "npumoe"].set_index(["model", "platform", "prompt_len", "chunk"])

    def say(key) -> str:
        if key not in rows.index:
            return "-"
        r = rows.loc[key]
        r = r.iloc[0] if isinstance(r, pd.DataFrame) else r
        if r.n_npu_groups == 0:
            return "no: npumoe = anemll here"
        return (f"yes: {int(r.n_npu_groups)} of {int(r.n_npu_groups + r.n_cpu_groups)} groups, "
                f"{100 * r.npu_expert_flop_share:.0f}% of expert FLOPs")
    return say


def quantities(df: pd.DataFrame, breakdown: dict) -> dict:
    """Quantity -> (paper value, modeled value, whether npumoe's plan used the NPU there). `df`: simulated rows;
    `breakdown`: (variant) -> (ffn, scatter) ms of Phi-3.5-MoE at the point setting."""
    at = df[(df.prompt_len == POINT["prompt_len"]) & (df.chunk == POINT["chunk"]) & (df.platform == POINT["platform"])]
    t = at.pivot_table(index="model", columns="variant", values="ttft_s")
    say = _npu_use(df)
    point = lambda m: say((m, POINT["platform"], POINT["prompt_len"], POINT["chunk"]))
    q = {}
    if "qwen3-30b-a3b" in t.index:
        q["Qwen3-30B-A3B TTFT, NPUMoE (s)"] = (0.572, t.at["qwen3-30b-a3b", "npumoe"], point("qwen3-30b-a3b"))
        q["Qwen3-30B-A3B TTFT, Core ML CPU baseline (s)"] = (1.139, t.at["qwen3-30b-a3b", "cpu-only"], "-")
    for v, (ffn, sc) in breakdown.items():
        paper = {"naive-npu": (3369.86, 896.76), "npumoe": (530.91, 775.52)}[v]
        use = point("phi-3.5-moe") if v == "npumoe" else "-"
        q[f"Phi-3.5-MoE expert FFN time, {v} (ms)"] = (paper[0], ffn, use)
        q[f"Phi-3.5-MoE scatter time, {v} (ms)"] = (paper[1], sc, use)
    piv = {m: df.pivot_table(index=["model", "platform", "prompt_len", "chunk"], columns="variant", values=m)
           for m in ("ttft_s", "energy_per_token_mj", "cpu_cycles")}
    for (label, (lo, hi)), metric in zip(PAPER_RANGES.items(), piv):
        r = pd.concat([piv[metric][b] / piv[metric]["npumoe"] for b in BASELINES if b in piv[metric]])
        q[f"headline {label}, lowest (x)"] = (lo, float(r.min()), say(r.idxmin()))
        q[f"headline {label}, highest (x)"] = (hi, float(r.max()), say(r.idxmax()))
    for b, v in PAPER_END_TO_END.items():
        r = piv["ttft_s"][b] / piv["ttft_s"]["npumoe"]
        q[f"speedup vs {b}, highest (x; paper end to end)"] = (v, float(r.max()), say(r.idxmax()))
    if "phi-3.5-moe" in t.index:
        for v, paper in (("npumoe-t", 1.48), ("npumoe-tg", 2.11), ("npumoe", 2.89)):
            q[f"ablation {v} over npumoe-base, Phi-3.5-MoE (x)"] = (paper, t.at["phi-3.5-moe", "npumoe-base"]
                                                                   / t.at["phi-3.5-moe", v],
                                                                   point("phi-3.5-moe") if v == "npumoe" else "-")
    npu = df[df.variant == "npumoe"].reset_index(drop=True)
    key = lambda i: tuple(npu.loc[i, ["model", "platform", "prompt_len", "chunk"]])
    for what, col, (lo, hi) in (("drop rate", "drop_rate", (10.0, 22.0)), ("padding", "pad_rate", (31.7, 37.5))):
        q[f"npumoe {what}, lowest (%)"] = (lo, 100 * npu[col].min(), say(key(npu[col].idxmin())))
        q[f"npumoe {what}, highest (%)"] = (hi, 100 * npu[col].max(), say(key(npu[col].idxmax())))
    return q


def paper_check(routing: str = "synthetic:gini=0.6", seed: int = 0, sensitivity: bool = True, grid: dict = GRID):
    """(table, sensitivity rows of the point setting, simulated grid rows): one table row per predictable paper
    number. `grid`: the simulated grid (default the paper's; tests pass a smaller one)."""
    rows, breakdown = [], {}
    for row, res in iter_simulation(grid["geometry"], routing, grid["platforms"], "all", grid["prompt_len"],
                                    grid["chunk"], seed=seed):
        rows.append(row)
        if (row["model"], row["platform"], row["prompt_len"], row["chunk"]) == \
                ("phi-3.5-moe", POINT["platform"], POINT["prompt_len"], POINT["chunk"]) and \
                row["variant"] in ("naive-npu", "npumoe"):
            breakdown[row["variant"]] = _ffn_and_scatter_ms(res.events)
    df = pd.DataFrame(rows)
    table = pd.DataFrame([dict(quantity=k, paper=p, modeled=m, ratio=m / p if p else math.nan, timing_source="modeled",
                               npumoe_used_npu=use) for k, (p, m, use) in quantities(df, breakdown).items()])
    sens = pd.DataFrame()
    if sensitivity:
        table, sens = _with_sensitivity(table, routing, seed, grid["geometry"])
    return table, sens, df


def _with_sensitivity(table: pd.DataFrame, routing: str, seed: int, geometry: str):
    """The two parameters each quantity moves most (|log change| at the point setting, M2 Ultra alternatives)."""
    cs = cases(POINT["platform"])
    by_hash = {}
    for c in cs:
        by_hash.setdefault(c["platform"].hash, []).append(c)
    per_case, breakdown, srows = {}, {}, []
    for row, res in iter_simulation(geometry, routing, [c["platform"] for c in cs], VARIANTS,
                                    POINT["prompt_len"], POINT["chunk"], seed=seed):
        for c in by_hash[row["platform_hash"]]:
            per_case.setdefault(c["case"], []).append(row)
            if row["model"] == "phi-3.5-moe" and row["variant"] in ("naive-npu", "npumoe"):
                breakdown.setdefault(c["case"], {})[row["variant"]] = _ffn_and_scatter_ms(res.events)
    values = {case: quantities(pd.DataFrame(r), breakdown.get(case, {})) for case, r in per_case.items()}
    base = values["baseline"]
    top = {}
    for qname in table.quantity:
        if qname not in base:
            continue
        moves = {}
        for c in cs[1:]:
            v = values[c["case"]].get(qname, (0, math.nan, "-"))[1]
            b = base[qname][1]
            if c["knob"] != "*" and v > 0 and b > 0:
                moves[c["knob"]] = max(moves.get(c["knob"], 0.0), abs(math.log(v / b)))
        top[qname] = ", ".join(k for k, m in sorted(moves.items(), key=lambda kv: -kv[1])[:2] if m > 1e-6) or "-"
    for case, r in per_case.items():
        g = pd.DataFrame(r)
        for geo, gg in g.groupby("model"):
            c = next(x for x in cs if x["case"] == case)
            srows += [dict(geometry=geo, platform=POINT["platform"], case=case, knob=c["knob"], alternative=c["label"],
                           value=c["value"], conclusion=k, ratio=v, holds=bool(v > 1)) for k, v in score(gg).items()]
    sens = pd.DataFrame(srows)
    base_holds = sens[sens.case == "baseline"].set_index(["geometry", "conclusion"]).holds
    sens["flips"] = [h != base_holds[(g, k)] for g, k, h in zip(sens.geometry, sens.conclusion, sens.holds)]
    return table.assign(most_sensitive_to=table.quantity.map(top).fillna("-")), sens


def markdown(table: pd.DataFrame, sens: pd.DataFrame, routing: str) -> str:
    lines = [f"# The device model against the paper (every modeled value from the unfitted platforms; routing "
             f"`{routing}`)", "", __doc__.split("\n\n", 1)[1].strip(), "",
             "| quantity | paper | modeled | modeled / paper | npumoe's plan used the NPU | most sensitive to |",
             "|---|---:|---:|---:|---|---|"]
    for r in table.itertuples():
        lines.append(f"| {r.quantity} | {r.paper:.4g} | {r.modeled:.4g} | {r.ratio:.2f} | "
                     f"{getattr(r, 'npumoe_used_npu', '-')} | {getattr(r, 'most_sensitive_to', '-')} |")
    off = table[(table.ratio < 0.5) | (table.ratio > 2)]
    lines += ["", f"Within 0.8-1.25x of the paper: {int(((table.ratio >= 0.8) & (table.ratio <= 1.25)).sum())} of "
              f"{len(table)}; off by more than 2x: {len(off)} ("
              + "; ".join(f"{r.quantity}: {r.ratio:.2f}x" for r in off.itertuples()) + ")."]
    if not sens.empty:
        lines += ["", f"## Conclusions and the parameter values over which they hold (prompt {POINT['prompt_len']}, "
                  f"chunk {POINT['chunk']}, {POINT['platform']}, each sourced alternative one at a time + corners)"]
        for geo, g in sens.groupby("geometry"):
            lines += ["", f"### {geo}", "", report(g)]
    return "\n".join(lines) + "\n"


def register_cli(sub) -> None:
    p = sub.add_parser("paper-check", help="the device model against every number of the paper's results it can "
                                           "predict (table + figure), with the parameters each is sensitive to")
    p.add_argument("--routing", default="synthetic:gini=0.6")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-sensitivity", action="store_true", help="skip the per-quantity sensitivity runs")
    p.add_argument("--out", required=True)
    p.set_defaults(func=_cli)


def _cli(a: argparse.Namespace) -> int:
    from npumoe_lab.sim.figures import paper_check_figure      # matplotlib only when drawing
    t0 = time.perf_counter()
    table, sens, df = paper_check(a.routing, a.seed, not a.no_sensitivity)
    out = Path(a.out)
    write_rows(df, out / "grid")
    text = markdown(table, sens, a.routing)
    out.mkdir(parents=True, exist_ok=True)
    (out / "PAPERCHECK.md").write_text(text)
    table.to_csv(out / "paper_check.csv", index=False)
    paper_check_figure(table).savefig(out / "paper_check.png", dpi=150, bbox_inches="tight")
    print(text + f"\n{len(table)} quantities in {time.perf_counter() - t0:.0f} s; written to {out} "
                 "(PAPERCHECK.md, paper_check.csv, paper_check.png, grid/)")
    return 0


__all__ = ["paper_check", "quantities", "markdown"]
