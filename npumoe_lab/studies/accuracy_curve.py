"""`npumoe-lab accuracy`: the accuracy-vs-drop curve behind the paper's "< 1.1 % loss" claim (issue 28).

For each task (at its calibrated difficulty, workloads/difficulty.py) and each saliency rule, plans are built at
every tier percentile from one calibration profile; each plan prefills the same n samples and is scored against
the dropless reference on those samples (reference computed once per sample: accuracy_scoring.py). A row per
(task, saliency, percentile) gives the accuracy change with exact bounds and McNemar p (stats.paired_exact), the
prompt-NLL change, top-1 agreement, the MEASURED drop rate of that plan on these samples (dropped / routed
assignments over all prefills), and the TTFT of the very same plan, MODELED on the platform. `random` saliency at
the same percentile (same capacities) is the control for what saliency-aware pruning buys.

Variant: `npumoe-tg` by default (every group resident on the NPU, so the static path really prunes; under the full
`npumoe` cost residency the tiny model's small groups all run dropless on the CPU of m2-max, drop rate 0).
"""
from __future__ import annotations

import math
import time
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from npumoe_lab.core.cpu_features import cpu_model
from npumoe_lab.devices import get_platform
from npumoe_lab.errors import NpuMoeError
from npumoe_lab.execution.calibrate import calibration_profile
from npumoe_lab.execution.experts import attach, detach
from npumoe_lab.results.metrics import bootstrap_ci
from npumoe_lab.models import load_model, model_fingerprint
from npumoe_lab.planning.plan import variant_plan
from npumoe_lab.execution.runtime import PrefillConfig, check_context, run_prefill
from npumoe_lab.core.saliency import check_rule
from npumoe_lab.results.stats import change_statement, paired_exact
from npumoe_lab.utils import progress, with_torch_threads
from npumoe_lab.planning.variants import get_variant
from npumoe_lab.workloads import get_workload
from npumoe_lab.workloads.difficulty import DEFAULT_TASKS, difficulty_for
from npumoe_lab.results.atomic import atomic_open
from npumoe_lab.studies.accuracy_scoring import plan_outcome, reference_record
from npumoe_lab.studies.accuracy_verdict import LOSS_TARGET, accuracy_markdown, loss_upper_bound
from npumoe_lab.viz.accuracy_curve import save_accuracy_curve

DEFAULT_PERCENTILES = (50.0, 70.0, 80.0, 90.0, 95.0, 100.0)
DEFAULT_SALIENCY = ("weight_x_norm", "random")
DEFAULT_N = 300


def check_curve_inputs(percentiles, saliency, n, workloads, variant) -> None:
    """Every argument checked before anything is computed or written (one NpuMoeError naming what to fix)."""
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 1:
        raise NpuMoeError(f"n must be an integer >= 1 (samples per task); got {n!r}")
    if not percentiles:
        raise NpuMoeError("give at least one percentile, e.g. 50,70,80,90,95,100")
    for p in percentiles:
        if not isinstance(p, (int, float)) or isinstance(p, bool) or not 0 < float(p) <= 100:
            raise NpuMoeError(f"percentile {p!r} is outside (0, 100]; tier percentiles are loads' percentiles")
    if not saliency:
        raise NpuMoeError("give at least one saliency rule, e.g. weight_x_norm,random")
    for r in saliency:
        check_rule(r)
    if not workloads:
        raise NpuMoeError(f"give at least one workload, e.g. {','.join(DEFAULT_TASKS)}")
    if get_variant(variant).experts != "plan":
        raise NpuMoeError(f"variant {variant!r} runs without a plan; the curve needs a plan variant "
                          "(npumoe-tg, npumoe, npumoe-t, npumoe-base)")


def curve_samples(tokenizer, model, workloads, prompt_len, difficulty, n, seed):
    """(name, workload, Difficulty, samples) per task; builds every sample up front, so a setting the model's
    context (or the prompt) cannot hold fails before any compute."""
    out = []
    for name in workloads:
        d = difficulty_for(name, prompt_len, **(difficulty or {}).get(name, {}))
        wl = get_workload(name, **d.options)
        if wl.kind not in ("generate", "choice", "next-token"):
            raise NpuMoeError(f"workload {name!r} scores {wl.metric} (not right/wrong per sample); the curve needs "
                              f"a 0/1 task, e.g. lm-next instead of lm-heldout")
        check_context(getattr(model.config, "max_position_embeddings", None), d.prompt_len + wl.max_new_tokens,
                      f"{name} at prompt_len {d.prompt_len} plus {wl.max_new_tokens} new tokens")
        out.append((name, wl, d, wl.samples(tokenizer, d.prompt_len, int(n), seed)))
    return out


@with_torch_threads
def accuracy_curve(model="tiny", workloads=DEFAULT_TASKS, prompt_len=None, difficulty=None,
                   percentiles=DEFAULT_PERCENTILES, saliency=DEFAULT_SALIENCY, n=DEFAULT_N, platform="m2-max",
                   chunk=256, variant="npumoe-tg", seed=0, calib_workload="mixed", calib_tokens=8192,
                   on_task=None, bar=None) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(rows, per-sample outcomes). `difficulty`: {task: {option: value}} over the calibrated settings;
    `on_task(rows, samples)` is called after each task (incremental writes); `bar`: a progress bar to update."""
    percentiles = [float(p) for p in percentiles]
    check_curve_inputs(percentiles, saliency, n, workloads, variant)
    plat = get_platform(platform)
    m, tok = load_model(model) if isinstance(model, str) else model
    name = model if isinstance(model, str) else getattr(m.config, "_name_or_path", "model")
    tasks = curve_samples(tok, m, workloads, prompt_len, difficulty, n, seed)
    v = get_variant(variant)
    profile = calibration_profile(m, tok, calib_workload, chunk, calib_tokens, seed)
    plans = {(r, p): variant_plan(profile, variant, m, platform=plat.name, percentile=p, saliency=r)
             for r in saliency for p in percentiles}
    pad_id = tok.pad_token_id if tok.pad_token_id is not None else (tok.eos_token_id or 0)
    config = PrefillConfig(plat, chunk, attention=v.attention, pad_token_id=pad_id)
    own_bar = bar is None
    bar = bar or progress(total=sum(len(s) for *_, s in tasks) * (1 + len(plans)), desc="accuracy curve")
    rows, per_sample = [], []
    for wname, wl, d, samples in tasks:
        detach(m)
        m.set_experts_implementation("eager")
        refs = []
        for s in samples:
            refs.append(reference_record(m, tok, s, wl, chunk, pad_id))
            bar.update(1)
        task_rows, task_samples = [], []
        for (rule, p), plan in plans.items():
            attach(m, plan, spill=v.spill, npu_dtype=config.npu_dtype)
            outs, ttft, dropped, routed, padded, slots = [], [], 0, 0, 0, 0
            for i, (s, ref) in enumerate(zip(samples, refs)):
                res = run_prefill(m, torch.tensor([s.input_ids]), config)
                o = plan_outcome(m, tok, s, wl, res, ref)
                outs.append(o)
                ttft.append(res.summary["ttft_s"])
                dropped += sum(st.dropped for *_, st in res.stats)
                routed += sum(st.routed for *_, st in res.stats)
                padded += sum(st.padded for *_, st in res.stats)
                slots += sum(st.slots for *_, st in res.stats)
                task_samples.append(dict(workload=wname, saliency=rule, percentile=p, sample=i,
                                         ref_score=ref.score, score=o["score"], ref_nll=ref.nll, nll=o["nll"],
                                         top1_agree=o["top1_agree"]))
                bar.update(1)
            detach(m)
            task_rows.append(_row(name, wname, wl, d, rule, p, plan, plat, chunk, variant, refs, outs, ttft,
                                  dropped, routed, padded, slots, seed))
        rows += task_rows
        per_sample += task_samples
        if on_task is not None:
            on_task(pd.DataFrame(rows), pd.DataFrame(per_sample))
    if own_bar:
        bar.close()
    table = pd.DataFrame(rows)
    table["model_fingerprint"] = model_fingerprint(m)[:16]
    return table, pd.DataFrame(per_sample)


def _row(model, wname, wl, d, rule, p, plan, plat, chunk, variant, refs, outs, ttft, dropped, routed, padded,
         slots, seed) -> dict:
    ref_sc = np.array([r.score for r in refs])
    sc = np.array([o["score"] for o in outs])
    ex = paired_exact(ref_sc, sc)
    n = len(outs)
    dn = np.array([o["nll"] for o in outs]) - np.array([r.nll for r in refs])
    nll_mean, nll_lo, nll_hi = bootstrap_ci(dn, seed=seed)
    ub95 = loss_upper_bound(int(ex["lost"]), n)
    return dict(model=model, workload=wname, difficulty=d.label(), prompt_len=d.prompt_len, chunk=chunk,
                saliency=rule, percentile=p, variant=variant, platform=plat.name, n_samples=n,
                score_name=wl.metric, ref_score=ref_sc.mean(), score=sc.mean(), accuracy_delta=sc.mean() - ref_sc.mean(),
                accuracy_lost=ex["lost"], accuracy_gained=ex["gained"], accuracy_exact_low=ex["exact_low"],
                accuracy_exact_high=ex["exact_high"], accuracy_loss_bound=ex["loss_bound"], loss_ub95=ub95,
                loss_under_target=bool(ub95 < LOSS_TARGET), mcnemar_p=ex["mcnemar_p"],
                statement=change_statement(ex["lost"], ex["gained"], n, ex["loss_bound"], ex["exact_low"],
                                           ex["exact_high"]),
                ref_nll=float(np.mean([r.nll for r in refs])), nll=float(np.mean([o["nll"] for o in outs])),
                nll_delta=nll_mean, nll_delta_ci_low=nll_lo, nll_delta_ci_high=nll_hi,
                top1_agree=float(np.mean([o["top1_agree"] for o in outs])),
                drop_rate=dropped / routed if routed else 0.0, dropped=int(dropped), routed=int(routed),
                pad_rate=padded / slots if slots else 0.0, expected_drop_rate=_expected_drop(plan),
                plan_hash=plan.hash, ttft_s=float(np.mean(ttft)), ttft_s_lo=math.nan, ttft_s_hi=math.nan,
                timing_source="modeled" if plat.kind != "measured" else "measured", accuracy_source="measured",
                seed=seed, cpu=cpu_model(), created=time.strftime("%Y-%m-%dT%H:%M:%S%z"))


def _expected_drop(plan) -> float:
    """The plan's drop rate on its calibration text (routed-load weighted over layers): the prediction the
    measured drop rate is compared with."""
    num = den = 0.0
    for lp in plan.layers:
        w = float(sum(g.get("expected_tokens", 0.0) for g in lp["groups"])) or 1.0
        num, den = num + lp["expected_drop_rate"] * w, den + w
    return num / den


# -- writing and CLI ------------------------------------------------------------------------------------------
def run_curve(out, show_progress: bool = True, **kwargs) -> tuple[pd.DataFrame, pd.DataFrame]:
    """accuracy_curve, writing into `out` as it goes: curve.csv and samples.csv after every task (a killed run
    keeps the finished tasks), then ACCURACY.md and the figure accuracy_curve.png/.pdf."""
    folder = Path(out) if out is not None else None
    prepared = {}

    def write(rows, samples):
        if folder is None:
            return
        folder.mkdir(parents=True, exist_ok=True)
        for name, df in (("curve.csv", rows), ("samples.csv", samples)):
            with atomic_open(folder / name, "w") as fh:
                df.to_csv(fh, index=False)

    t0 = time.perf_counter()
    rows, samples = accuracy_curve(on_task=write, bar=None if show_progress else _NoBar(), **kwargs)
    prepared["elapsed"] = time.perf_counter() - t0
    if folder is not None:
        write(rows, samples)
        with atomic_open(folder / "ACCURACY.md", "w") as fh:
            fh.write(accuracy_markdown(rows, samples, prepared["elapsed"]))
        save_accuracy_curve(rows, folder)
    return rows, samples


class _NoBar:
    def update(self, k=1):
        pass

    def close(self):
        pass
