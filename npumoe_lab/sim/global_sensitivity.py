"""Global sensitivity of the modeled conclusions (`npumoe-lab sensitivity --method morris`): every numeric device
parameter moved together (SALib Morris elementary effects), under each NPU cost structure, and the probability each
conclusion holds.

Ranges: a fitted platform's posterior (5-95 % of its draws) for the parameters it fitted; otherwise a parameter's
sourced alternatives (min..max with its value); otherwise a band by confidence (H: x/÷1.1, M: x/÷1.3, L: x/÷2).
High-confidence parameters are included. Sampled on a log scale. Structures: `curve` (per-op roofline with the
measured GEMM-rate curve), `flat` (one flat NPU rate: the curve set aside), `graph` (graph-level cost, graph_cost.py).
P(holds) = the share of sampled points where the conclusion's ratio > 1: over the stated ranges (uniform in log), and
for a fitted platform also over its posterior draws (the probability under the posterior). Plans (grouping,
residency) are the baseline platform's: every sampled parameter set re-prices the same op streams (StreamPricer,
equal to runtime.finish's summary; tested) rather than re-planning.
"""
from __future__ import annotations

import math

import numpy as np
import pandas as pd

from npumoe_lab.devices import get_platform
from npumoe_lab.devices.graph_cost import npu_energy_j
from npumoe_lab.errors import NpuMoeError
from npumoe_lab.planning.variants import parse_variants
from npumoe_lab.sim.run import WEIGHT_FORMATS, iter_simulation
from npumoe_lab.sim.array_replay import stream_metrics
from npumoe_lab.sim.claim_sobol import settle_gains, settle_line, sobol_indices
from npumoe_lab.sim.pricing import parameter_draws
from npumoe_lab.sim.sensitivity import CONCLUSIONS, VARIANTS, score

STRUCTURES = {"curve": {"npu_graph_model": "roofline"}, "graph": {"npu_graph_model": "graph"}, "flat": None}
BANDS = {"H": 1.1, "M": 1.3, "L": 2.0}
# counts, switches and plan-shaping limits: not continuous device rates (plans are held fixed here)
EXCLUDED = {"max_dim", "weight_bytes", "host_cores", "cores", "clusters", "graph_model", "graph_limit_bytes",
            "throughput_curve", "spill_factor", "sram_bytes"}


class StreamPricer:
    """One variant's op stream (a PrefillResult's ops), priced on any modeled platform fast: each distinct
    (role, cost) once, then the same queue schedule and row metrics as timeline.schedule / summarize."""

    def __init__(self, res, n_tokens: int):
        keys, self.idx, self.role, self.deps, self.calls = {}, [], [], [], []
        for op, deps, _ in res.ops:
            self.idx.append(keys.setdefault((op.role, op.cost), len(keys)))
            self.role.append(op.role)
            self.deps.append(deps)
            self.calls.append(op.cost.calls)
        if not self.idx:
            raise NpuMoeError("a stream without ops cannot be priced; simulate with this version (ops recorded)")
        self.keys, self.n_tokens = list(keys), n_tokens
        self.is_npu = np.array([r == "npu" for r in self.role])
        self.calls_arr = np.array(self.calls, float)
        self.idx_arr = np.array(self.idx)

    def summary(self, platform) -> dict:
        price = np.array([platform.device(r).estimate(c) for r, c in self.keys])
        npu_j_key = np.array([npu_energy_j(platform.npu, c.flops, t) if r == "npu" else 0.0
                              for (r, c), t in zip(self.keys, price)])
        dur = price[self.idx_arr]
        shared = platform.npu_shares_cpu
        free, ends, d = {"npu": 0.0, "cpu": 0.0}, [], dur.tolist()
        for j, deps in enumerate(self.deps):
            q = "cpu" if shared else self.role[j]
            start = free[q]
            for k in deps:
                if ends[k] > start:
                    start = ends[k]
            ends.append(start + d[j])
            free[q] = ends[-1]
        ttft = max(ends)
        busy_npu, busy_cpu = float(dur[self.is_npu].sum()), float(dur[~self.is_npu].sum())
        if shared:
            core_s = platform.cpu.cores * busy_cpu + platform.npu.host_cores * busy_npu
        else:
            core_s = platform.cpu.cores * busy_cpu + platform.npu.host_call_s * float(self.calls_arr[self.is_npu].sum())
        npu, cpu = platform.npu, platform.cpu
        host_busy = busy_cpu + (busy_npu if shared else 0.0)
        npu_j = 0.0 if shared else float(npu_j_key[self.idx_arr].sum()) + npu.idle_power_w * max(ttft - busy_npu, 0.0)
        energy = npu_j + cpu.active_power_w / cpu.cores * core_s + cpu.idle_power_w * max(ttft - host_busy, 0.0)
        return {"ttft_s": ttft, "energy_per_token_mj": energy / self.n_tokens * 1e3, "cpu_cycles": core_s * cpu.freq_hz}


def factors(platform) -> list[tuple[str, float, float, str]]:
    """(override knob, low, high, where the range comes from) for every continuous parameter (see module doc)."""
    post = platform.posterior or {}
    drawn = {}
    if post.get("draws"):
        d = np.asarray(post["draws"], float)
        for j, k in enumerate(post["params"]):
            lo, hi = np.percentile(d[:, j], [5, 95])
            if hi > lo > 0:
                drawn[k] = (float(lo), float(hi))
    out = []
    for role in ("npu", "cpu"):
        for key, e in sorted(platform.params[role].items()):
            knob, v = f"{role}_{key}", e.get("value")
            if key in EXCLUDED or isinstance(v, bool) or not isinstance(v, (int, float)) or not v > 0:
                continue
            if knob in drawn:
                out.append((knob, *drawn[knob], "posterior 5-95 %"))
                continue
            alts = [a for a in (e.get("alternatives") or {}).values() if isinstance(a, (int, float))
                    and not isinstance(a, bool) and a > 0]
            lo, hi = min([v, *alts]), max([v, *alts])
            if hi > lo:
                out.append((knob, float(lo), float(hi), "sourced alternatives"))
            else:
                b = BANDS.get(e.get("confidence"), 2.0)
                out.append((knob, v / b, v * b, f"confidence {e.get('confidence')} band x/÷{b:g}"))
    return out


def _structure_overrides(platform, name: str) -> dict:
    if name == "flat":      # one flat NPU rate: the throughput curve set aside (platform.py's override rule)
        return {"npu_graph_model": "roofline", "npu_throughput_flops": platform.params["npu"]["throughput_flops"]["value"]}
    return dict(STRUCTURES[name])


def _conclusions(pricers: dict, platform) -> dict:
    rows = [dict(variant=v, **p.summary(platform)) for v, p in pricers.items()]
    return score(pd.DataFrame(rows))


def run_global(spec: str, geometry="qwen3-30b-a3b", routing="synthetic:gini=0.6", prompt_len=1024, chunk=512,
               weights="fp16", trajectories: int = 4, levels: int = 4, posterior_draws: int = 100, seed: int = 0):
    """(effects, probabilities) DataFrames for one platform spec (a name or a platform YAML such as a fit)."""
    from SALib.analyze import morris as morris_analyze      # lazy: SALib only for this method
    from SALib.sample import morris as morris_sample
    if weights not in WEIGHT_FORMATS:
        raise NpuMoeError(f"--weights {weights!r}: use one of {', '.join(WEIGHT_FORMATS)}")
    if isinstance(trajectories, bool) or not isinstance(trajectories, int) or trajectories < 2:
        raise NpuMoeError(f"--trajectories must be an integer >= 2 (Morris needs several), got {trajectories!r}")
    base = get_platform(spec, **WEIGHT_FORMATS[weights])
    fs = factors(base)
    if not fs:
        raise NpuMoeError(f"platform {spec!r} has no continuous parameters to vary")
    names = [f[0] for f in fs]
    problem = {"num_vars": len(fs), "names": names, "bounds": [[math.log(lo), math.log(hi)] for _, lo, hi, _ in fs]}
    vlist = parse_variants(",".join(VARIANTS))
    pricers = {r["variant"]: StreamPricer(res, prompt_len) for r, res in
               iter_simulation(geometry, routing, [base], ",".join(v.name for v in vlist), prompt_len, chunk,
                               weights, seed, engine="ops")}     # StreamPricer reads the per-op records
    X = morris_sample.sample(problem, trajectories, num_levels=levels, seed=seed)
    effects, probs = [], []
    for struct in STRUCTURES:
        fixed = _structure_overrides(base, struct)
        ys = []
        for x in X:
            sampled = {k: float(math.exp(v)) for k, v in zip(names, x)}
            if struct != "flat":    # overriding the flat rate sets the curve aside: it varies in `flat` only
                sampled.pop("npu_throughput_flops", None)
            over = {**WEIGHT_FORMATS[weights], **fixed, **sampled}
            ys.append(_conclusions(pricers, get_platform(spec, **over)))
        ydf = pd.DataFrame(ys)
        for c in ydf.columns:
            y = np.log(ydf[c].to_numpy(float))
            si = morris_analyze.analyze(problem, X, y, num_levels=levels, print_to_console=False, seed=seed)
            for j, k in enumerate(names):
                effects.append(dict(platform=base.label, structure=struct, conclusion=c, factor=k, low=fs[j][1],
                                    high=fs[j][2], range_from=fs[j][3], mu_star=float(si["mu_star"][j]),
                                    sigma=float(si["sigma"][j])))
            probs.append(dict(platform=base.label, structure=struct, over="ranges (Morris points)", conclusion=c,
                              p_holds=float((ydf[c] > 1).mean()), n=len(ydf), ratio_median=float(ydf[c].median())))
    post = base.posterior or {}
    if post.get("draws"):
        d = np.asarray(post["draws"], float)
        pick = np.random.default_rng(seed).choice(len(d), size=min(posterior_draws, len(d)), replace=False)
        ys = [_conclusions(pricers, get_platform(spec, **WEIGHT_FORMATS[weights],
                                                 **{k: float(v) for k, v in zip(post["params"], d[i])}))
              for i in pick]
        ydf = pd.DataFrame(ys)
        for c in ydf.columns:
            probs.append(dict(platform=base.label, structure="as fitted", over="posterior draws", conclusion=c,
                              p_holds=float((ydf[c] > 1).mean()), n=len(ydf), ratio_median=float(ydf[c].median())))
    return pd.DataFrame(effects), pd.DataFrame(probs)


def run_sobol(spec: str, geometry="qwen3-30b-a3b", routing="synthetic:gini=0.6", prompt_len=1024, chunk=512,
              weights="fp16", n_base: int = 128, draws: int = 2000, seed: int = 0):
    """(effects, probabilities) like run_global, by the same Sobol machinery as paper-check's claims
    (claim_sobol.py): SALib Sobol S1 / ST of each conclusion's log ratio over the platform's draws (posterior, prior
    for the rest, predictive noise), P(holds) under the joint draws, and the measurement that would settle it."""
    if weights not in WEIGHT_FORMATS:
        raise NpuMoeError(f"--weights {weights!r}: use one of {', '.join(WEIGHT_FORMATS)}")
    base = get_platform(spec, **WEIGHT_FORMATS[weights])
    variants = sorted({v for num, den, _ in CONCLUSIONS.values() for v in (num, den)})
    streams = {r["variant"]: res.stream for r, res in
               iter_simulation(geometry, routing, [base], ",".join(variants), prompt_len, chunk, weights, seed)}

    def evaluate(params):
        m = {v: stream_metrics(st, params, base.npu_shares_cpu) for v, st in streams.items()}
        return {c: m[num][metric] / m[den][metric] for c, (num, den, metric) in CONCLUSIONS.items()}
    joint = parameter_draws(base, draws, seed)
    y = evaluate(joint)
    sob = sobol_indices(joint, evaluate, n_base, seed)
    effects, probs = [], []
    for c, s in sob.items():
        gains = settle_gains(joint, y[c])
        for j, k in enumerate(s["names"]):
            effects.append(dict(platform=base.label, structure="as given", conclusion=c, factor=k,
                                S1=float(s["S1"][j]), ST=float(s["ST"][j]), S1_conf=float(s["S1_conf"][j]),
                                ST_conf=float(s["ST_conf"][j]), settle_gain=gains.get(k, 0.0)))
        probs.append(dict(platform=base.label, structure="as given", over="joint draws", conclusion=c,
                          p_holds=float(np.mean(y[c] > 1)), n=draws, ratio_median=float(np.median(y[c])),
                          settle=settle_line(c, base.chip, gains)))
    return pd.DataFrame(effects), pd.DataFrame(probs)


def sobol_report(effects: pd.DataFrame, probs: pd.DataFrame) -> str:
    """Per platform and conclusion: P(holds), the largest total Sobol indices, and the 'to settle' line."""
    lines = []
    for r in probs.itertuples():
        e = effects[(effects.platform == r.platform) & (effects.conclusion == r.conclusion)]
        top = e.sort_values("ST", ascending=False).head(3)
        lines.append(f"- **{r.conclusion}** on `{r.platform}`: P(holds) = {r.p_holds:.2f} (median ratio "
                     f"{r.ratio_median:.2f}, n = {r.n}); Sobol S1 / ST: "
                     + ", ".join(f"{x.factor} {x.S1:.2f} / {x.ST:.2f}" for x in top.itertuples())
                     + f". {r.settle[0].upper() + r.settle[1:]}.")
    return "\n".join(lines)


def report(effects: pd.DataFrame, probs: pd.DataFrame) -> str:
    """Per platform and conclusion: P(holds) per structure (and under the posterior) and the top factors."""
    lines = []
    for (plat, c), g in probs.groupby(["platform", "conclusion"], sort=False):
        ps = "; ".join(f"{r.structure} ({r.over}): P = {r.p_holds:.2f} (median ratio {r.ratio_median:.2f}, "
                       f"n = {r.n})" for r in g.itertuples())
        e = effects[(effects.platform == plat) & (effects.conclusion == c)]
        top = (e.groupby("factor").mu_star.max().sort_values(ascending=False).head(3))
        lines.append(f"- **{c}** on `{plat}`: {ps}. Largest effects (Morris mu*, log ratio): "
                     + ", ".join(f"{k} {v:.3f}" for k, v in top.items() if v > 0) + ".")
    return "\n".join(lines)


__all__ = ["run_global", "run_sobol", "sobol_report", "factors", "report", "StreamPricer", "STRUCTURES"]
