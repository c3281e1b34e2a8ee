"""`npumoe-lab paper-check`: every number of the paper's results (PAPER.md section 5) the device model can predict,
at the paper's setting, beside the paper's value, with the two device parameters each is most sensitive to.

Settings the paper does not state are chosen here and printed with the table: routing is synthetic (Gini 0.6: the
paper reports no routing statistics; its per-document and per-chunk variation and hot-set shift between the
calibration mix and the prompt's workload are the measured defaults of data/routing/tiny-defaults.yaml, so the
drop and padding rows follow from the bundled model's routing), "point" numbers are taken at prompt 1024 and chunk 512 on M2 Ultra, the
breakdown (PAPER.md 5.3, "probably Phi-3.5-MoE, M2 Ultra") on Phi-3.5-MoE, headline ranges over the paper's grid
(3 models x M2 Max / M2 Ultra x prompts 1024, 4096 x chunks 256, 512, 1024) against cpu-only, naive-npu and anemll.
End-to-end speedups are compared with end-to-end ratios (e2e_s: TTFT + 8 greedy decode steps under the decode
policy, sim/decode.py; with decode_tokens=0 with TTFT ratios), TTFT claims with TTFT ratios. No parameter is fitted: the
platforms are used as sourced (a fitted profile would be a separate platform, fitted on a declared half).

Probabilities: each quantity is recomputed under every parameter draw (the platform's posterior when it has one, a
fitted YAML; else the prior of its sourced alternatives) for its 90 % interval and P(within 0.8-1.25x of the paper);
the paper's claims "npumoe faster than cpu-only / naive-npu / anemll" (at every setting of the grid, per platform:
the lowest baseline / npumoe TTFT > 1) get P(holds), the share of draws where they hold. These are probabilities
under the model's parameter uncertainty (and its predictive noise where the posterior carries one), not
measurements.
"""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd

from npumoe_lab.devices import get_platform
from npumoe_lab.errors import NpuMoeError
from npumoe_lab.sim.claim_sobol import claims_sensitivity
from npumoe_lab.sim.array_replay import INTERVAL_METRICS, expert_ffn_and_scatter_s
from npumoe_lab.sim.pricing import INTERVAL, draws_source, parameter_draws, price_stream
from npumoe_lab.sim.report import BASELINES, PAPER_END_TO_END, PAPER_RANGES
from npumoe_lab.sim.run import iter_simulation
from npumoe_lab.sim.stream import KIND
from npumoe_lab.sim.sensitivity import VARIANTS, cases, report, score

GRID = dict(geometry="qwen3-30b-a3b,phi-3.5-moe,phi-tiny-moe", platforms="m2-max,m2-ultra", prompt_len="1024,4096",
            chunk="256,512,1024")
POINT = dict(prompt_len=1024, chunk=512, platform="m2-ultra")
E2E = ("e2e_s",)                                  # the per-draw e2e metric paper-check reads (decode rows)
FFN_EVENTS = ("cold", "spill", "experts")          # + every "group<i>": the expert FFN time of PAPER.md 5.3


def _ffn_and_scatter_ms(res) -> tuple[float, float]:
    """Expert FFN and scatter milliseconds of one simulated prefill (an array-path StreamResult, or per-op
    events)."""
    if hasattr(res, "stream"):
        ffn, sc = expert_ffn_and_scatter_s(res.stream, res.platform)
        return 1e3 * ffn, 1e3 * sc
    events = res.events
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
    e2e = "e2e_s" in df.columns and df["e2e_s"].notna().any()    # with decode steps: e2e claims against e2e ratios
    pe = df.pivot_table(index=["model", "platform", "prompt_len", "chunk"], columns="variant", values="e2e_s") \
        if e2e else piv["ttft_s"]
    for b, v in PAPER_END_TO_END.items():
        r = pe[b] / pe["npumoe"]
        name = f"end-to-end speedup vs {b}, highest (x)" if e2e else f"speedup vs {b}, highest (x; paper end to end)"
        q[name] = (v, float(r.max()), say(r.idxmax()))
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


def claim_name(baseline: str, platform: str) -> str:
    return f"claim: npumoe faster than {baseline} on {platform} (lowest {baseline} / npumoe TTFT over the grid)"


def claims(df: pd.DataFrame) -> dict:
    """Claim -> the lowest baseline / npumoe TTFT over a platform's grid settings (> 1: npumoe is faster than that
    baseline at every setting, as the paper claims), for each platform and baseline in the rows."""
    t = df.pivot_table(index=["platform", "model", "prompt_len", "chunk"], columns="variant", values="ttft_s")
    if "npumoe" not in t:
        return {}
    out = {}
    for plat in sorted(set(t.index.get_level_values(0))):
        tp = t.xs(plat, level=0)
        for b in BASELINES:
            if b in tp:
                out[claim_name(b, plat)] = float((tp[b] / tp["npumoe"]).min())
    return out


def _breakdown_draws(res, draws: dict) -> np.ndarray:
    """(D, 2) expert FFN and scatter milliseconds of one prefill under each parameter draw."""
    d = price_stream(draws, res.stream)
    k = res.stream.cols["kind"]
    ffn = np.isin(k, [KIND["expert_group"], KIND["experts_dynamic"], KIND["experts_hf"]])
    return 1e3 * np.stack([d[:, ffn].sum(1), d[:, k == KIND["scatter"]].sum(1)], axis=1)


def _intervals(df: pd.DataFrame, metrics: list, breakdown: dict, table: pd.DataFrame) -> pd.DataFrame:
    """The table with each row's 90 % interval over the parameter draws (modeled_lo / _hi), for a quantity the
    share of draws that put it within 0.8-1.25x of the paper (p_within_25pct), for a claim the share under which it
    holds (p_holds): every quantity and claim recomputed per draw."""
    D = len(next(iter(metrics[0].values())))
    per = {q: [] for q in table.quantity}
    for i in range(D):
        dfi = df.assign(**{m: [x[m][i] for x in metrics] for m in INTERVAL_METRICS + E2E if m in metrics[0]})
        for q, (_, v, _used) in quantities(dfi, {k: tuple(b[i]) for k, b in breakdown.items()}).items():
            per[q].append(v)
        for q, v in claims(dfi).items():
            per[q].append(v)
    lo_hi = {q: np.nanpercentile(v, INTERVAL) if len(v) else (math.nan, math.nan) for q, v in per.items()}
    paper = dict(zip(table.quantity, table.paper))
    within = {q: float(np.mean([(0.8 <= x / paper[q] <= 1.25) for x in v])) if paper[q] and v else math.nan
              for q, v in per.items()}
    kind = dict(zip(table.quantity, table.kind))
    holds = {q: float(np.mean(np.asarray(v) > 1)) if kind[q] == "claim" and v else math.nan for q, v in per.items()}
    return table.assign(modeled_lo=table.quantity.map(lambda q: lo_hi[q][0]),
                        modeled_hi=table.quantity.map(lambda q: lo_hi[q][1]),
                        p_within_25pct=table.quantity.map(within), p_holds=table.quantity.map(holds),
                        interval_draws=D)


def fitted_platforms(grid_platforms: str, fitted_dir) -> dict:
    """{sourced name: fitted platform YAML} for the grid's platforms that have a `<name>-fit.yaml` in fitted_dir."""
    folder = Path(fitted_dir)
    if not folder.is_dir():
        raise NpuMoeError(f"--fitted {fitted_dir}: not a folder; pass the --out folder of fit-device (e.g. data/fits)")
    found = {n: str(folder / f"{n}-fit.yaml") for n in grid_platforms.split(",") if (folder / f"{n}-fit.yaml").is_file()}
    if not found:
        raise NpuMoeError(f"--fitted {fitted_dir}: no <platform>-fit.yaml for any of {grid_platforms}")
    return found


def paper_check(routing: str = "synthetic:gini=0.6", seed: int = 0, sensitivity: bool = True, grid: dict = GRID,
                platform_map: dict | None = None, draws: int = 100, sobol: int = 0, decode_tokens: int = 8,
                decode_policy: str = "pipeline", with_metrics: bool = False, operating_point: str = "default"):
    """(table, sensitivity rows of the point setting, simulated grid rows): one table row per predictable paper
    number. `grid`: the simulated grid (default the paper's; tests pass a smaller one). `platform_map`: {grid
    platform name: platform spec to simulate instead} (e.g. its fit, fitted_platforms); rows keep the grid name.
    `draws`: parameter draws (the platforms' posterior, else the sourced prior) for each quantity's 90 % interval
    (0: none). `sobol`: Saltelli base sample N of the claims' Sobol indices and "to settle" lines (claim_sobol.py;
    0: none): in the claim rows' `sobol_top` / `settle` columns and `table.attrs["claims_sobol"]`. `decode_tokens` /
    `decode_policy`: the decode steps of every row (end-to-end claims are compared with e2e_s ratios; 0: with TTFT
    ratios, as before). `with_metrics`: also return the rows' per-draw metrics (papercheck_e2e.e2e_table's
    intervals). `operating_point` "paper": every plan at the percentile that puts npumoe's drop at the paper's
    (sim/operating_point.py; where none reaches the band, the closest, said in the rows)."""
    rows, breakdown, metrics, bdraws, drawn, entries = [], {}, [], {}, {}, {}
    platform_map = platform_map or {}
    specs = [platform_map.get(n, n) for n in grid["platforms"].split(",")]
    back = {get_platform(s).name: n for n, s in zip(grid["platforms"].split(","), specs)}
    for row, res in iter_simulation(grid["geometry"], routing, ",".join(specs), "all", grid["prompt_len"],
                                    grid["chunk"], seed=seed, draws=draws, decode_tokens=decode_tokens,
                                    decode_policy=decode_policy, operating_point=operating_point,
                                    off_band="closest"):
        row = {**row, "platform": back.get(row["platform"], row["platform"]), "platform_spec": row["platform"]}
        rows.append(row)
        if sobol and hasattr(res, "stream") and row["variant"] in (*BASELINES, "npumoe"):
            entries.setdefault(row["platform"], (res.platform, []))[1].append((row, res.stream))
        metrics.append(getattr(res, "draws", None))     # None on the per-op engine (a graph-level NPU)
        if (row["model"], row["platform"], row["prompt_len"], row["chunk"]) == \
                ("phi-3.5-moe", POINT["platform"], POINT["prompt_len"], POINT["chunk"]) and \
                row["variant"] in ("naive-npu", "npumoe"):
            breakdown[row["variant"]] = _ffn_and_scatter_ms(res)
            if draws and hasattr(res, "stream"):
                if row["platform"] not in drawn:
                    drawn[row["platform"]] = parameter_draws(res.platform, draws, seed)
                bdraws[row["variant"]] = _breakdown_draws(res, drawn[row["platform"]])
    df = pd.DataFrame(rows)
    table = pd.DataFrame([dict(quantity=k, kind="quantity", paper=p, modeled=m, ratio=m / p if p else math.nan,
                               timing_source="modeled", npumoe_used_npu=use)
                          for k, (p, m, use) in quantities(df, breakdown).items()]
                         + [dict(quantity=k, kind="claim", paper=math.nan, modeled=m, ratio=math.nan,
                                 timing_source="modeled", npumoe_used_npu="-", holds=bool(m > 1))
                            for k, m in claims(df).items()])
    srcs = sorted({f"{draws_source(get_platform(s_))} ({get_platform(s_).label})" for s_ in specs}) if draws else []
    table = table.assign(interval_source="; ".join(srcs) or "-")
    if draws and metrics and all(m is not None for m in metrics):
        table = _intervals(df, metrics, bdraws, table)
    if sobol and entries:
        table = _with_claim_sobol(table, entries, sobol, seed)
    sens = pd.DataFrame()
    if sensitivity:
        table, sens = _with_sensitivity(table, routing, seed, grid["geometry"], decode_tokens, decode_policy)
    return (table, sens, df, metrics) if with_metrics else (table, sens, df)


def _with_claim_sobol(table: pd.DataFrame, entries: dict, n_base: int, seed: int) -> pd.DataFrame:
    """The claim rows with their largest Sobol indices and the measurement that would settle them."""
    rows = [r for plat, es in entries.values()
            for r in claims_sensitivity(es, plat, BASELINES, claim_name, n_base=n_base, seed=seed)]
    top = {r["claim"]: ", ".join(f"{n} S1 {a:.2f} ST {b:.2f}" for n, a, b in r["sobol"][:3]) for r in rows}
    settle = {r["claim"]: r["settle"] for r in rows}
    out = table.assign(sobol_top=table.quantity.map(top), settle=table.quantity.map(settle))
    out.attrs["claims_sobol"] = rows
    return out


def _with_sensitivity(table: pd.DataFrame, routing: str, seed: int, geometry: str, decode_tokens: int = 0,
                      decode_policy: str = "pipeline"):
    """The two parameters each quantity moves most (|log change| at the point setting, M2 Ultra alternatives)."""
    cs = cases(POINT["platform"])
    by_hash = {}
    for c in cs:
        by_hash.setdefault(c["platform"].hash, []).append(c)
    per_case, breakdown, srows = {}, {}, []
    for row, res in iter_simulation(geometry, routing, [c["platform"] for c in cs], VARIANTS,
                                    POINT["prompt_len"], POINT["chunk"], seed=seed, decode_tokens=decode_tokens,
                                    decode_policy=decode_policy):
        for c in by_hash[row["platform_hash"]]:
            per_case.setdefault(c["case"], []).append(row)
            if row["model"] == "phi-3.5-moe" and row["variant"] in ("naive-npu", "npumoe"):
                breakdown.setdefault(c["case"], {})[row["variant"]] = _ffn_and_scatter_ms(res)
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


def _cell(r, pre: str = "") -> str:
    """'value [lo-hi]' of a table row (the 90 % interval when it has one)."""
    v, lo, hi = getattr(r, f"modeled{pre}"), getattr(r, f"modeled_lo{pre}", math.nan), getattr(r, f"modeled_hi{pre}",
                                                                                               math.nan)
    return f"{v:.4g}" + ("" if lo is None or math.isnan(lo) else f" [{lo:.3g}-{hi:.3g}]")


def _pct(x) -> str:
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.0%}"


def side_by_side(sourced: pd.DataFrame, fitted: pd.DataFrame, fits: dict) -> str:
    """The paper's numbers beside the sourced and the fitted platforms' (every value modeled), each with its 90 %
    interval and the probability under its draws (sourced: the prior of the sourced alternatives; fitted: the fit's
    posterior) that it lies within 0.8-1.25x of the paper; then the paper's claims with P(holds) under each."""
    cols = [c for c in ("quantity", "modeled", "ratio", "modeled_lo", "modeled_hi", "p_within_25pct", "p_holds")
            if c in fitted.columns]
    t = sourced.merge(fitted[cols], on="quantity", suffixes=("", "_fitted"), how="left")
    for c in ("modeled_lo", "modeled_hi", "p_within_25pct", "p_holds", "modeled_lo_fitted", "modeled_hi_fitted",
              "p_within_25pct_fitted", "p_holds_fitted"):
        if c not in t:
            t[c] = math.nan
    kind = t["kind"] if "kind" in t else pd.Series("quantity", index=t.index)
    q, c = t[kind == "quantity"], t[kind == "claim"]
    src = lambda tab: tab.interval_source.iloc[0] if "interval_source" in tab and len(tab) else "-"  # noqa: E731
    lines = ["", f"## Sourced and fitted platforms side by side (fits: {', '.join(fits.values())})", "",
             f"Every value is modeled. Intervals (90 %) and probabilities are over parameter draws: sourced = "
             f"{src(sourced)}; fitted = {src(fitted)}. P(0.8-1.25x) = the share of draws that put the quantity within "
             "0.8-1.25x of the paper.", "",
             "| quantity | paper | sourced [90 %] | sourced / paper | P(0.8-1.25x) sourced | fitted [90 %] | "
             "fitted / paper | P(0.8-1.25x) fitted |", "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for r in q.itertuples():
        lines.append(f"| {r.quantity} | {r.paper:.4g} | {_cell(r)} | {r.ratio:.2f} | {_pct(r.p_within_25pct)} | "
                     f"{_cell(r, '_fitted')} | {r.ratio_fitted:.2f} | {_pct(r.p_within_25pct_fitted)} |")

    def within(x):
        return int(((x >= 0.8) & (x <= 1.25)).sum())
    lines += ["", f"Within 0.8-1.25x of the paper at the point values: sourced {within(q.ratio)}, fitted "
              f"{within(q.ratio_fitted)} of {len(q)}; off by more than 2x: sourced "
              f"{int(((q.ratio < 0.5) | (q.ratio > 2)).sum())}, fitted "
              f"{int(((q.ratio_fitted < 0.5) | (q.ratio_fitted > 2)).sum())}. Expected number within under the draws "
              f"(sum of the probabilities): sourced {q.p_within_25pct.sum():.1f}, fitted "
              f"{q.p_within_25pct_fitted.sum():.1f}. The fits use micro-benchmark rows only (never a paper number)."]
    if len(c):
        lines += ["", "The paper's claims (npumoe faster than the baseline at every setting of the grid; value = the "
                  "lowest baseline / npumoe TTFT, > 1: it holds):", "",
                  "| claim | sourced [90 %] | P(holds) sourced | fitted [90 %] | P(holds) fitted |",
                  "|---|---:|---:|---:|---:|"]
        for r in c.itertuples():
            name = r.quantity.removeprefix("claim: ")
            lines.append(f"| {name} | {_cell(r)} | {_pct(r.p_holds)} | {_cell(r, '_fitted')} | "
                         f"{_pct(r.p_holds_fitted)} |")
    return "\n".join(lines) + "\n"


def markdown(table: pd.DataFrame, sens: pd.DataFrame, routing: str) -> str:
    lines = [f"# The device model against the paper (every modeled value from the unfitted platforms; routing "
             f"`{routing}`)", "", __doc__.split("\n\n", 1)[1].strip(), "",
             f"Parameter draws of the intervals and probabilities: "
             f"{table.interval_source.iloc[0] if 'interval_source' in table and len(table) else '-'}.", "",
             "| quantity | paper | modeled | 90 % interval | P(within 0.8-1.25x) | modeled / paper | npumoe's plan used the NPU "
             "| most sensitive to |",
             "|---|---:|---:|---:|---:|---:|---|---|"]
    kind = table["kind"] if "kind" in table else pd.Series("quantity", index=table.index)
    claim_rows, table = table[kind == "claim"], table[kind == "quantity"]
    for r in table.itertuples():
        lo, hi, pw = getattr(r, "modeled_lo", math.nan), getattr(r, "modeled_hi", math.nan), \
            getattr(r, "p_within_25pct", math.nan)
        lines.append(f"| {r.quantity} | {r.paper:.4g} | {r.modeled:.4g} | "
                     f"{'-' if math.isnan(lo) else f'{lo:.4g}-{hi:.4g}'} | {'-' if math.isnan(pw) else f'{pw:.0%}'} | "
                     f"{r.ratio:.2f} | {getattr(r, 'npumoe_used_npu', '-')} | {getattr(r, 'most_sensitive_to', '-')} |")
    off = table[(table.ratio < 0.5) | (table.ratio > 2)]
    lines += ["", f"Within 0.8-1.25x of the paper: {int(((table.ratio >= 0.8) & (table.ratio <= 1.25)).sum())} of "
              f"{len(table)}; off by more than 2x: {len(off)} ("
              + "; ".join(f"{r.quantity}: {r.ratio:.2f}x" for r in off.itertuples()) + ")."]
    if len(claim_rows):
        src = claim_rows.interval_source.iloc[0] if "interval_source" in claim_rows else "-"
        lines += ["", f"The paper's claims (value: the lowest baseline / npumoe TTFT over the grid, > 1: npumoe is "
                  f"faster at every setting; P(holds) over the parameter draws: {src}):", "",
                  "| claim | modeled | 90 % interval | holds at the point values | P(holds) |", "|---|---:|---:|---|---:|"]
        for r in claim_rows.itertuples():
            lo, hi = getattr(r, "modeled_lo", math.nan), getattr(r, "modeled_hi", math.nan)
            lines.append(f"| {r.quantity.removeprefix('claim: ')} | {r.modeled:.3g} | "
                         f"{'-' if math.isnan(lo) else f'{lo:.3g}-{hi:.3g}'} | {'yes' if r.modeled > 1 else 'no'} | "
                         f"{_pct(getattr(r, 'p_holds', math.nan))} |")
    if not sens.empty:
        lines += ["", f"## Conclusions and the parameter values over which they hold (prompt {POINT['prompt_len']}, "
                  f"chunk {POINT['chunk']}, {POINT['platform']}, each sourced alternative one at a time + corners)"]
        for geo, g in sens.groupby("geometry"):
            lines += ["", f"### {geo}", "", report(g)]
    return "\n".join(lines) + "\n"


__all__ = ["paper_check", "quantities", "claims", "markdown", "side_by_side"]
