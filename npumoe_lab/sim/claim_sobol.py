"""Which parameters decide a modeled conclusion, and which measurement would settle it.

Variance-based sensitivity over the parameter draws of a platform (its fit-device posterior, the prior for what it
did not fit, and the predictive noise: `pricing.parameter_draws`): SALib Sobol first-order (S1) and total (ST)
indices of the conclusion's log ratio. Sobol needs independent inputs, so each drawn parameter enters through its
own marginal (the empirical quantiles of its draws); the posterior's correlations are set aside for the indices
(said in the output). The inputs are the log ratios, continuous, not the 0/1 "holds": indices of an indicator are
dominated by the few draws near the threshold.

"To settle X, run Y" (`settle_gains`): for each parameter, the expected change of P(holds) if it were known to the
precision one measurement gives (MEASUREMENT_PRECISION_LOG: +-10 % in log, a median of repeats): the joint draws
(correlations kept) are split into bins of that width along the parameter; E|P(holds | bin) - P(holds)|, weighted
by the bins' shares, is what a measurement is expected to move the probability. `MEASUREMENTS` names the
`npumoe-lab measure` micro-benchmark that pins each parameter on a given chip. Every number here is modeled.
"""
from __future__ import annotations

import math

import numpy as np

from npumoe_lab.errors import NpuMoeError
from npumoe_lab.sim.array_replay import stream_metrics
from npumoe_lab.sim.pricing import parameter_draws

MEASUREMENT_PRECISION_LOG = 0.1
# parameter -> the micro-benchmark (a `npumoe-lab measure` command, run on the chip named) whose rows identify it
CM_TINY, CM_QWEN = "measure --device coreml --geometry tiny --quick", "measure --device coreml --geometry qwen3-30b-a3b"
CPU = "measure --device cpu"
MEASUREMENTS = {     # parameter -> (npumoe-lab command or None, what it measures)
    "npu_dispatch_s": (CM_TINY, "its call_floor row: the smallest graph's Core ML call"),
    "npu_sync_s": (CM_TINY, "its call_floor row: the Core ML round trip"),
    "npu_throughput_flops": (CM_QWEN, "expert-group GEMM chains: the single-graph rate the roofline uses"),
    "npu_direct_dispatch_s": (None, "a direct-path (private API) call floor, e.g. ANEForge's dispatch probe"),
    "npu_direct_rows_half": (None, "a direct-path (private API) 1-row GEMV, e.g. ANEForge's GEMV probe"),
    "npu_direct_bandwidth_bytes_s": (None, "a direct-path (private API) large GEMV, e.g. ANEForge's GEMV sweep"),
    "npu_graph_peak_flops": (CM_QWEN, "expert-group GEMM chains at capacities 8-512: the rate of large groups"),
    "npu_work_half_flops": (CM_QWEN, "groups of 1 and 8 experts: the per-call fill"),
    "npu_rows_half": (CM_QWEN, "capacities 8 vs 512: the row tile"),
    "npu_bandwidth_bytes_s": (CM_QWEN, "capacity-8 groups: weight streaming"),
    "npu_active_power_w": (CM_QWEN, "with sudo -n powermetrics permitted: the ANE rail under large groups"),
    "npu_floor_power_w": (CM_TINY, "with sudo -n powermetrics permitted: the ANE rail of dispatch-bound calls"),
    "npu_idle_power_w": (CM_TINY, "with sudo -n powermetrics permitted: the idle ANE rail"),
    "npu_attention_flops": (None, "an attention-block micro-benchmark (measure --device coreml has none yet; "
                                  "ANEForge's attention probe is one)"),
    "npu_decompress_params_s": (None, "a palettized (LUT) GEMV (measure --device coreml has none yet)"),
    "npu_host_cores": (None, "CPU time of the thread waiting on Core ML calls (an assumption today)"),
    "cpu_throughput_flops": (CPU, "on the Mac: GEMM rows, the Accelerate rate"),
    "cpu_bandwidth_bytes_s": (CPU, "on the Mac: weight-streaming rows"),
    "cpu_op_overhead_s": (CPU, "on the Mac: small-op rows, the per-op floor"),
    "cpu_power_per_core_w": (None, "the CPU rail under load (powermetrics on the Mac)"),
    "cpu_idle_power_w": (None, "the idle CPU rail (powermetrics on the Mac)"),
    "cpu_freq_hz": (None, "the all-core clock under load (powermetrics on the Mac)"),
    "noise_factor": (None, "the model's own error: more fit rows of the kinds a prefill is made of"),
}


def factors_of(draws: dict) -> list[str]:
    """The drawn inputs that vary (not curves, not constants), sorted."""
    out = []
    for k, v in draws.items():
        if k.endswith("_throughput_curve") or k.endswith("_curve_scale"):
            continue
        a = np.asarray(v, dtype=float).reshape(-1)
        if a.size > 1 and np.ptp(a) > 1e-12 * max(abs(a).max(), 1e-300):
            out.append(k)
    return sorted(out)


def _from_unit(draws: dict, names: list, u: np.ndarray) -> dict:
    """A params dict whose named inputs are their marginal quantiles at u (M, P); the rest keep draw 0 (held fixed:
    they do not vary)."""
    m = u.shape[0]
    out = {}
    for k, v in draws.items():
        if k.endswith("_throughput_curve"):
            out[k] = v
            continue
        out[k] = np.full(m, np.asarray(v, dtype=float).reshape(-1)[0])
    for j, k in enumerate(names):
        out[k] = np.quantile(np.asarray(draws[k], dtype=float), np.clip(u[:, j], 0.0, 1.0))
    for role in ("npu", "cpu"):      # a prior-drawn peak rate scales its curve (pricing.parameter_draws)
        key = f"{role}_curve_scale"
        if key in draws and np.ptp(np.asarray(draws[key], dtype=float)) > 0:
            base = np.asarray(draws[f"{role}_throughput_flops"], dtype=float) / np.asarray(draws[key], dtype=float)
            out[key] = out[f"{role}_throughput_flops"] / float(np.median(base))
    return out


def sobol_indices(draws: dict, evaluate, n_base: int = 128, seed: int = 0) -> dict:
    """{output: {"names", "S1", "ST", "S1_conf", "ST_conf", "p_holds_independent"}} of every output of
    `evaluate(params) -> {output: (M,) ratio}` (ratios > 0; indices of their logs), over the inputs that vary in
    `draws` (module doc). n_base: Saltelli's N (points = N x (P + 2))."""
    from SALib.analyze import sobol as sobol_analyze        # lazy: SALib only here
    from SALib.sample import sobol as sobol_sample
    names = factors_of(draws)
    if not names:
        raise NpuMoeError("no drawn parameter varies: nothing for Sobol indices to apportion")
    if isinstance(n_base, bool) or not isinstance(n_base, int) or n_base < 16 or n_base & (n_base - 1):
        raise NpuMoeError(f"Sobol base sample {n_base!r}: use a power of two >= 16 (Saltelli's scheme)")
    problem = {"num_vars": len(names), "names": names, "bounds": [[0.0, 1.0]] * len(names)}
    u = sobol_sample.sample(problem, n_base, calc_second_order=False, seed=seed)
    ys = evaluate(_from_unit(draws, names, u))
    out = {}
    for key, y in ys.items():
        y = np.asarray(y, dtype=float)
        ly = np.log(np.maximum(y, 1e-300))
        if np.ptp(ly) < 1e-12:
            s1 = st = c1 = ct = np.zeros(len(names))
        else:
            si = sobol_analyze.analyze(problem, ly, calc_second_order=False, print_to_console=False, seed=seed)
            s1, st, c1, ct = si["S1"], si["ST"], si["S1_conf"], si["ST_conf"]
        out[key] = {"names": names, "S1": np.asarray(s1), "ST": np.asarray(st), "S1_conf": np.asarray(c1),
                    "ST_conf": np.asarray(ct), "p_holds_independent": float(np.mean(y > 1))}
    return out


def settle_gains(draws: dict, y: np.ndarray, precision_log: float = MEASUREMENT_PRECISION_LOG) -> dict:
    """{param: expected |change of P(holds)|} if `param` were measured to +-precision_log (module doc). `y`: the
    conclusion's ratio under each of the joint draws in `draws` (D,)."""
    y = np.asarray(y, dtype=float)
    p = float(np.mean(y > 1))
    out = {}
    for k in factors_of(draws):
        x = np.log(np.asarray(draws[k], dtype=float))
        if x.size != y.size:
            raise NpuMoeError(f"draws of {k} ({x.size}) and ratios ({y.size}) differ in length")
        bins = max(1, int(math.ceil(np.ptp(x) / (2 * precision_log))))
        edges = np.quantile(x, np.linspace(0, 1, min(bins, max(1, x.size // 20)) + 1))
        idx = np.clip(np.searchsorted(edges, x, side="right") - 1, 0, len(edges) - 2)
        gain = 0.0
        for b in np.unique(idx):
            sel = idx == b
            gain += sel.mean() * abs(float(np.mean(y[sel] > 1)) - p)
        out[k] = gain
    return out


SETTLE_MIN = 0.02      # an expected change below this: the claim is decided at (nearly) every draw


def settle_line(claim: str, chip: str, gains: dict) -> str:
    """"to settle X, run Y" in one line: the parameter whose measurement is expected to move P(holds) most."""
    if not gains or max(gains.values()) < SETTLE_MIN:
        return (f"'{claim}' is decided at nearly every draw: no one measurement is expected to move P(holds) by "
                f"{SETTLE_MIN:.0%} or more")
    k, g = max(gains.items(), key=lambda kv: kv[1])
    cmd, what = MEASUREMENTS.get(k, (None, f"a micro-benchmark of {k}"))
    run = f"run `npumoe-lab {cmd}` on an {chip} ({what})" if cmd else f"measure {what} on an {chip}"
    return f"to settle '{claim}', {run}: it pins {k} (expected |change of P(holds)| {g:.0%})"


def claim_ratios(entries, params: dict, shared: bool, baselines, name) -> dict:
    """{name(baseline, platform): (M,) lowest baseline / npumoe TTFT over the settings} under `params` (M draws).
    `entries`: [(row, stream)] of ONE platform's simulated grid (rows with model, prompt_len, chunk, variant,
    platform)."""
    ttft = {}
    for row, stream in entries:
        key = (row["model"], row["prompt_len"], row["chunk"])
        ttft.setdefault(key, {})[row["variant"]] = stream_metrics(stream, params, shared)["ttft_s"]
    plat = entries[0][0]["platform"]
    out = {}
    for b in baselines:
        ratios = [v[b] / v["npumoe"] for v in ttft.values() if b in v and "npumoe" in v]
        if ratios:
            out[name(b, plat)] = np.min(np.vstack(ratios), axis=0)
    return out


def short_claim(claim: str) -> str:
    """'claim: npumoe faster than X on P (lowest ...)' -> 'npumoe faster than X on P'."""
    return claim.removeprefix("claim: ").split(" (")[0]


def claims_sensitivity(entries, platform, baselines, name, draws: int = 2000, n_base: int = 128,
                       seed: int = 0) -> list[dict]:
    """One dict per claim of one platform: P(holds) under the joint draws, the Sobol indices (module doc), the
    expected change of P(holds) per measured parameter, and the "to settle" line."""
    joint = parameter_draws(platform, draws, seed)
    shared = platform.npu_shares_cpu
    evaluate = lambda p: claim_ratios(entries, p, shared, baselines, name)   # noqa: E731
    y_joint = evaluate(joint)
    sob = sobol_indices(joint, evaluate, n_base, seed)
    chip = platform.chip
    out = []
    for claim, y in y_joint.items():
        s = sob[claim]
        gains = settle_gains(joint, y)
        order = np.argsort(-s["ST"])
        out.append({"claim": claim, "platform": platform.name, "chip": chip, "p_holds": float(np.mean(y > 1)),
                    "p_holds_independent": s["p_holds_independent"], "draws": draws, "n_base": n_base,
                    "sobol_points": n_base * (len(s["names"]) + 2),
                    "sobol": [(s["names"][i], float(s["S1"][i]), float(s["ST"][i])) for i in order],
                    "gains": gains, "settle": settle_line(short_claim(claim), chip, gains)})
    return out


def sobol_lines(rows: list[dict], top: int = 3) -> list[str]:
    """Markdown lines: per claim P(holds), the parameters with the largest total Sobol index (S1 / ST), and the
    measurement that would settle it."""
    if not rows:
        return []
    lines = ["", "## What decides each claim, and the measurement that would settle it", "",
             f"Sobol indices (SALib, Saltelli N = {rows[0]['n_base']}, N x (parameters + 2) points; first "
             "order S1 / total ST) of each claim's log ratio over the platform's draws (posterior, prior for what "
             "was not fitted, predictive noise), each parameter through its own marginal (the posterior's "
             "correlations set aside for the indices). Settle: the expected |change of P(holds)| if one parameter "
             f"were measured to +-{MEASUREMENT_PRECISION_LOG:.0%} (joint draws binned along it). Every number is "
             "modeled.", "",
             "| claim | platform | P(holds) | largest Sobol indices (S1 / ST) | to settle it |", "|---|---|---:|---|---|"]
    for r in rows:
        idx = ", ".join(f"{n} {a:.2f} / {b:.2f}" for n, a, b in r["sobol"][:top])
        lines.append(f"| {short_claim(r['claim'])} | {r['platform']} | {r['p_holds']:.0%} | {idx} | "
                     f"{r['settle']} |")
    return lines


__all__ = ["sobol_indices", "settle_gains", "settle_line", "claim_ratios", "claims_sensitivity", "sobol_lines", "factors_of", "MEASUREMENTS", "MEASUREMENT_PRECISION_LOG"]
