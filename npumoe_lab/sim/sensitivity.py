"""Which conclusions rest on which device parameters (`npumoe-lab sensitivity`).

For every parameter of the platform below high confidence that lists alternatives (sourced values from other
measurements or readings, in the platform YAML), the simulation is rerun with that one parameter at each
alternative, plus a joint corner with every such parameter at its lowest and at its highest value. Each run is
scored on the conclusions below (a ratio > 1 means the conclusion holds); a conclusion *flips* where its ratio
crosses 1. One op stream per plan layout is priced on every parameter set (sim.run), so the cases cost little.
"""
from __future__ import annotations

import math

import numpy as np
import pandas as pd

from npumoe_lab.devices import get_platform
from npumoe_lab.errors import NpuMoeError
from npumoe_lab.planning.variants import ABLATION
from npumoe_lab.sim.run import WEIGHT_FORMATS, iter_simulation

# conclusion -> (numerator variant, denominator variant, metric): holds when numerator / denominator > 1
CONCLUSIONS = {
    "npumoe faster than cpu-only": ("cpu-only", "npumoe", "ttft_s"),
    "npumoe faster than anemll": ("anemll", "npumoe", "ttft_s"),
    "npumoe faster than naive-npu": ("naive-npu", "npumoe", "ttft_s"),
    "npumoe less energy than cpu-only": ("cpu-only", "npumoe", "energy_per_token_mj"),
    "npumoe fewer CPU cycles than cpu-only": ("cpu-only", "npumoe", "cpu_cycles"),
}
ABLATION_CONCLUSION = "ablation ordering base > t > tg > npumoe (TTFT)"
VARIANTS = sorted({v for num, den, _ in CONCLUSIONS.values() for v in (num, den)} | set(ABLATION))


def alternatives(platform) -> list[tuple[str, str, float]]:
    """(override knob, alternative label, value) for each parameter below high confidence with alternatives."""
    out = []
    for role in ("npu", "cpu"):
        for key, entry in sorted(platform.params[role].items()):
            if entry.get("confidence") != "H" and entry.get("alternatives") and key != "throughput_curve":
                out += [(f"{role}_{key}", label, v) for label, v in entry["alternatives"].items()]
    return out


def cases(name: str, weights: dict | None = None) -> list[dict]:
    """[{case, knob, label, value, platform}]: the baseline, one per alternative, and the low / high corners."""
    weights = weights or {}
    base = get_platform(name, **weights)
    out = [dict(case="baseline", knob="", label="", value=math.nan, platform=base)]
    alts = alternatives(base)
    for knob, label, value in alts:
        out.append(dict(case=f"{knob}={label}", knob=knob, label=label, value=value,
                        platform=get_platform(name, **weights, **{knob: label})))
    per_knob = {}
    for knob, _, value in alts:
        role, _, key = knob.partition("_")
        per_knob.setdefault(knob, [base.params[role][key]["value"]]).append(value)
    for corner, pick in (("low corner", min), ("high corner", max)):
        over = {k: pick(vs) for k, vs in per_knob.items() if pick(vs) != vs[0]}
        out.append(dict(case=corner, knob="*", label=corner, value=math.nan,
                        platform=get_platform(name, **weights, **over)))
    return out


def score(rows: pd.DataFrame) -> dict:
    """Conclusion -> ratio (> 1: it holds) for the rows of one case (one geometry, platform, prompt, chunk)."""
    by = rows.set_index("variant")
    out = {c: by.at[num, m] / by.at[den, m] for c, (num, den, m) in CONCLUSIONS.items()
           if num in by.index and den in by.index}
    t = [by.at[v, "ttft_s"] for v in ABLATION if v in by.index]
    if len(t) == len(ABLATION):      # the smallest step speedup: > 1 iff every step makes TTFT shorter
        out[ABLATION_CONCLUSION] = min(a / b for a, b in zip(t, t[1:]))
    return out


def holds_probability(rows: list, draws: list) -> dict:
    """Conclusion -> share of the parameter draws under which it holds: `score` recomputed per draw on the rows of
    one case (`draws[i]`: row i's {metric: (D,) array})."""
    D = len(next(iter(draws[0].values())))
    metrics = ("ttft_s", "energy_per_token_mj", "cpu_cycles")
    held = {}
    for d in range(D):
        g = pd.DataFrame(rows).assign(**{m: [x[m][d] for x in draws] for m in metrics})
        for conclusion, ratio in score(g).items():
            held.setdefault(conclusion, []).append(ratio > 1)
    return {c: float(np.mean(v)) for c, v in held.items()}


def run_sensitivity(geometry="qwen3-30b-a3b", platform="m2-max", routing="synthetic:gini=0.6", prompt_len=1024,
                    chunk=512, weights="fp16", seed=0, draws: int = 0) -> pd.DataFrame:
    """One row per (case, conclusion): ratio, holds, flips (vs the baseline case); with `draws`, the baseline rows'
    p_holds = the share of parameter draws (the platform's posterior, else the sourced prior) under which it holds."""
    if weights not in WEIGHT_FORMATS:
        raise NpuMoeError(f"--weights {weights!r}: use one of {', '.join(WEIGHT_FORMATS)}")
    cs = cases(platform, WEIGHT_FORMATS[weights])
    by_hash = {}
    for c in cs:
        by_hash.setdefault(c["platform"].hash, []).append(c)
    rows = [row for row, _ in iter_simulation(geometry, routing, [c["platform"] for c in cs], VARIANTS, prompt_len,
                                              chunk, weights, seed)]
    df = pd.DataFrame(rows)
    p_holds = {}
    if draws:      # the baseline platform under its parameter draws (a graph-level NPU has none: no probability)
        base = list(iter_simulation(geometry, routing, [cs[0]["platform"]], VARIANTS, prompt_len, chunk, weights,
                                    seed, draws=draws))
        if base and all(getattr(res, "draws", None) is not None for _, res in base):
            p_holds = holds_probability([row for row, _ in base], [res.draws for _, res in base])
    out = []
    for h, g in df.groupby("platform_hash", sort=False):
        for c in by_hash[h]:
            for conclusion, ratio in score(g).items():
                out.append(dict(geometry=g.geometry.iloc[0], platform=platform, prompt_len=prompt_len, chunk=chunk,
                                case=c["case"], knob=c["knob"], alternative=c["label"], value=c["value"],
                                conclusion=conclusion, ratio=ratio, holds=bool(ratio > 1), timing_source="modeled"))
    res = pd.DataFrame(out)
    if p_holds:
        res["p_holds"] = [p_holds.get(c, np.nan) if case == "baseline" else np.nan
                          for case, c in zip(res.case, res.conclusion)]
    base = res[res.case == "baseline"].set_index("conclusion").holds
    return res.assign(flips=res.holds != res.conclusion.map(base))


def report(res: pd.DataFrame) -> str:
    """Per conclusion: whether it holds at the baseline, its ratio range, and the parameter values that flip it."""
    lines = []
    for conclusion, g in res.groupby("conclusion", sort=False):
        base = g[g.case == "baseline"].iloc[0]
        flips = g[g.flips]
        prob = getattr(base, "p_holds", np.nan)
        lines.append(f"- **{conclusion}**: {'holds' if base.holds else 'does NOT hold'} at the platform's values "
                     f"(ratio {base.ratio:.2f}, modeled"
                     + ("" if pd.isna(prob) else f"; holds under {prob:.0%} of the parameter draws")
                     + "); over the alternatives the ratio spans "
                     f"{g.ratio.min():.2f}-{g.ratio.max():.2f}. "
                     + ("Flipped by: " + ", ".join(f"{r.case} ({r.ratio:.2f})" for r in flips.itertuples())
                        if len(flips) else "No single alternative or corner flips it."))
    return "\n".join(lines)
