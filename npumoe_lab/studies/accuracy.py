"""Accuracy harness: a variant against `reference` on each workload.

For every workload it reports the task score of both, the change with a paired bootstrap 95% CI and exact bounds
from the discordant pairs (McNemar / Clopper-Pearson, with a plain statement when no sample changed), next-token
top-1 agreement and KL divergence of the prefill logits vs the reference (the measures that still move when
task scores saturate), the drop and padding rates, and the TTFT (median over repeats) of the very same plan
(same percentile, same plan hash): speed and accuracy are never quoted for two different plans.
Decoding after prefill runs the normal path (NPUMoE applies to prefill only).
"""
from __future__ import annotations

import warnings

import pandas as pd

from npumoe_lab.errors import NpuMoeError
from npumoe_lab.execution.calibrate import calibration_profile
from npumoe_lab.experiments.runner import run_experiment
from npumoe_lab.models import load_model
from npumoe_lab.planning.knobs import PlanKnobs
from npumoe_lab.planning.plan import build_plan
from npumoe_lab.results.stats import change_statement

DEFAULT_WORKLOADS = ("ruler-multikey", "ruler-vt", "fewshot-cls", "lm-heldout")
COLUMNS = ["workload", "variant", "platform", "prompt_len", "chunk", "n_samples", "score_name", "ref_score", "score",
           "accuracy_delta", "accuracy_ci_low", "accuracy_ci_high", "accuracy_lost", "accuracy_gained",
           "accuracy_exact_low", "accuracy_exact_high", "accuracy_loss_bound", "mcnemar_p", "statement",
           "top1_agree", "kl", "nll", "drop_rate", "pad_rate", "percentile", "plan_hash", "ttft_s", "ttft_iqr_s",
           "timing_source", "host_busy"]


def plan_drop_rate(plan) -> float:
    """Expected drop rate of a plan on its calibration data (mean over layers, weighted by routed load)."""
    num = den = 0.0
    for lp in plan.layers:
        rate = lp.get("expected_drop_rate")
        if rate is None:
            raise NpuMoeError("this plan does not record expected_drop_rate; rebuild it with npumoe_lab.build_plan")
        w = float(sum(g.get("expected_tokens", 0.0) for g in lp["groups"])) or 1.0
        num, den = num + rate * w, den + w
    return num / den


def percentile_for_drop_rate(profile, model, target=(0.10, 0.22), candidates=(95, 90, 80, 70, 60, 50, 40, 30, 20),
                             **knobs) -> tuple[float, float]:
    """The highest load percentile whose plan's expected drop rate falls in `target` (the paper's 10-22%),
    else the one closest to the range. Returns (percentile, expected drop rate)."""
    lo, hi = target
    best = None
    for p in candidates:
        rate = plan_drop_rate(build_plan(profile, model, percentile=p, **knobs))
        if lo <= rate <= hi:
            return p, rate
        gap = lo - rate if rate < lo else rate - hi
        if best is None or gap < best[2]:
            best = (p, rate, gap)
    return best[0], best[1]


def accuracy_report(model="tiny", workloads=DEFAULT_WORKLOADS, variant="npumoe", platform="cpu", prompt_len=1024,
                    chunk=256, n_samples=16, seed=0, out=None, target_drop=None, repeats=None,
                    **plan_knobs) -> pd.DataFrame:
    """One row per workload: `variant` vs `reference` on the same samples (see module docstring).

    target_drop=(lo, hi): pick the tier percentile whose calibrated drop rate falls in that range first.
    """
    loaded = load_model(model) if isinstance(model, str) else model
    name = model if isinstance(model, str) else None
    if target_drop is not None:
        m, tok = loaded
        profile = calibration_profile(m, tok, "mixed", chunk, plan_knobs.pop("calib_tokens", 8192), seed)
        p, rate = percentile_for_drop_rate(profile, m, target_drop,
                                           **{k: v for k, v in plan_knobs.items() if k != "percentile"})
        plan_knobs["percentile"] = p
    frames = []
    for wl in workloads:
        df = run_experiment(model=loaded, workload=wl, variants=variant, platforms=platform, prompt_len=prompt_len,
                            chunk=chunk, n_samples=n_samples, seed=seed, out=out, model_name=name, repeats=repeats,
                            **plan_knobs)
        frames.append(_same_plan_row(df))
    table = pd.concat(frames, ignore_index=True)
    table["percentile"] = plan_knobs.get("percentile", PlanKnobs().percentile)   # the plan's, default or given
    if target_drop is not None:
        outside = table[(table.drop_rate < target_drop[0]) | (table.drop_rate > target_drop[1])]
        if len(outside):
            # the percentile was chosen on the calibration text; a workload's own routing can drop more or less
            rates = ", ".join(f"{w} {d:.1%}" for w, d in zip(outside.workload, outside.drop_rate))
            warnings.warn(f"measured drop rates {rates} fall outside target_drop {target_drop} (percentile "
                          f"{plan_knobs['percentile']:g} was chosen on the calibration text); pass percentile= "
                          "explicitly to place these workloads in range", stacklevel=2)
    cols = [c for c in COLUMNS if c in table.columns]
    return table[cols + [k for k in plan_knobs if k in table.columns and k not in cols]]


def _same_plan_row(df: pd.DataFrame) -> pd.DataFrame:
    """One row per (variant, platform): accuracy (identical in every repeat) with the median TTFT over the
    repeats of the same run, so speed and accuracy describe one plan; plus the exact-bound statement."""
    keys = ["variant", "platform"]
    first = df[df.repeat == 0].set_index(keys)
    first["ttft_s"] = df.groupby(keys)["ttft_s"].median()
    first = first.reset_index()
    if "accuracy_lost" in first.columns:
        first["statement"] = [change_statement(r.accuracy_lost, r.accuracy_gained, r.n_samples,
                                               r.accuracy_loss_bound, r.accuracy_exact_low, r.accuracy_exact_high)
                              for r in first.itertuples()]
    return first
