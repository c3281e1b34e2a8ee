"""`npumoe-lab accuracy`: the accuracy-vs-drop curve behind the paper's "< 1.1 % loss" claim.

For each task (at its calibrated difficulty, workloads/difficulty.py) and each saliency rule, plans are built at
every tier percentile from one calibration profile; each plan prefills the same n samples and is scored against
the dropless reference on those samples (reference computed once per sample: accuracy_scoring.py). A row per
(task, saliency, percentile) gives the accuracy change with exact bounds and McNemar p (stats.paired_exact), the
prompt-NLL change, top-1 agreement, the MEASURED drop rate of that plan on these samples (dropped / routed
assignments over all prefills), and the TTFT of the very same plan, MODELED on the platform, with its 90 % interval
the way `run` gives one (each prefill's op stream priced under the platform's parameter draws, sim/pricing.py; a row
without one says why in `interval_note`). `random` saliency at the same percentile (same capacities) is the control
for what saliency-aware pruning buys. Reference records are kept on disk (accuracy_cache.py): a second curve over the
same samples skips the reference; `reference_scan` computes them alone (the informative-range check).

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
from npumoe_lab.execution.batched import batched_prefill
from npumoe_lab.execution.runtime import PrefillConfig, check_context, run_prefill
from npumoe_lab.core.saliency import check_rule
from npumoe_lab.results.stats import change_statement, clopper_pearson, paired_exact
from npumoe_lab.utils import progress, with_torch_threads
from npumoe_lab.planning.variants import get_variant
from npumoe_lab.workloads import get_workload
from npumoe_lab.workloads.difficulty import DEFAULT_TASKS, difficulty_for
from npumoe_lab.results.atomic import atomic_open
from npumoe_lab.sim.array_replay import mean_interval, ops_draw_metrics
from npumoe_lab.sim.pricing import array_priced, draws_source, parameter_draws
from npumoe_lab.studies.accuracy_cache import ReferenceCache, cached_references, reference_key
from npumoe_lab.studies.accuracy_scoring import plan_outcome, reference_record
from npumoe_lab.studies.accuracy_verdict import LOSS_TARGET, accuracy_markdown, loss_upper_bound
from npumoe_lab.viz.accuracy_curve import save_accuracy_curve

DEFAULT_PERCENTILES = (50.0, 70.0, 80.0, 90.0, 95.0, 100.0)
DEFAULT_SALIENCY = ("weight_x_norm", "random")
DEFAULT_N = 300
DEFAULT_DRAWS = 200          # parameter draws behind the TTFT interval (as `simulate` / `run`)
DEFAULT_BATCH = 8            # prompts prefilled together per plan (bench/accuracy_curve.py measured the choice)


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


def task_references(m, tok, wname, wl, d, samples, seed, chunk, pad_id, ref_cache, bar):
    """(reference records of one task's samples, the ReferenceCache or None): the model back in its reference
    configuration (HF experts, no plan), every record read from the disk cache where present."""
    detach(m)
    m.set_experts_implementation("eager")
    cache = None
    if ref_cache:
        cache = ReferenceCache(reference_key(m, wname, d, seed, chunk), None if ref_cache is True else Path(ref_cache))
    refs = cached_references(samples, cache, lambda s: reference_record(m, tok, s, wl, chunk, pad_id),
                             on_each=lambda: bar.update(1))
    return refs, cache


@with_torch_threads
def reference_scan(model="tiny", workloads=DEFAULT_TASKS, prompt_len=None, difficulty=None, n=DEFAULT_N, chunk=256,
                   seed=0, ref_cache=True, bar=None) -> pd.DataFrame:
    """The dropless reference's score per task at its difficulty setting, on the curve's very samples (and into
    the same cache, so a curve after it skips the reference): the check that a setting lies in the informative
    range (~0.4-0.9), and the scan to re-choose one. One row per task: score, its exact 95 % interval, n."""
    check_curve_inputs([100.0], ["random"], n, workloads, "npumoe-tg")
    m, tok = load_model(model) if isinstance(model, str) else model
    tasks = curve_samples(tok, m, workloads, prompt_len, difficulty, n, seed)
    pad_id = tok.pad_token_id if tok.pad_token_id is not None else (tok.eos_token_id or 0)
    own_bar = bar is None
    bar = bar or progress(total=sum(len(s) for *_, s in tasks), desc="reference scan")
    rows = []
    for wname, wl, d, samples in tasks:
        t0 = time.perf_counter()
        refs, cache = task_references(m, tok, wname, wl, d, samples, seed, chunk, pad_id, ref_cache, bar)
        k = int(sum(r.score for r in refs))
        lo, hi = clopper_pearson(k, len(refs), 0.95)
        rows.append(dict(workload=wname, difficulty=d.label(), prompt_len=d.prompt_len, n=len(refs),
                         ref_score=k / len(refs), ref_score_lo=lo, ref_score_hi=hi,
                         in_range=bool(0.4 <= k / len(refs) <= 0.9), ref_cached=cache.hits if cache else 0,
                         seconds=time.perf_counter() - t0, seed=seed, chunk=chunk,
                         model_fingerprint=model_fingerprint(m)[:16], cpu=cpu_model()))
    if own_bar:
        bar.close()
    return pd.DataFrame(rows)


@with_torch_threads
def accuracy_curve(model="tiny", workloads=DEFAULT_TASKS, prompt_len=None, difficulty=None,
                   percentiles=DEFAULT_PERCENTILES, saliency=DEFAULT_SALIENCY, n=DEFAULT_N, platform="m2-max",
                   chunk=256, variant="npumoe-tg", seed=0, calib_workload="mixed", calib_tokens=8192,
                   draws=DEFAULT_DRAWS, ref_cache=True, on_task=None, bar=None, batch=DEFAULT_BATCH
                   ) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(rows, per-sample outcomes). `batch`: prompts prefilled together per plan (execution/batched.py: every
    outcome equals the one-at-a-time path's; 1: one at a time); `difficulty`: {task: {option: value}} over the calibrated settings;
    `draws`: parameter draws for the modeled TTFT's 90 % interval (0: none); `ref_cache`: read / write the
    reference records on disk (accuracy_cache.py; a folder: there instead of the workbench cache);
    `on_task(rows, samples)` is called after each task (incremental writes); `bar`: a progress bar to update."""
    percentiles = [float(p) for p in percentiles]
    check_curve_inputs(percentiles, saliency, n, workloads, variant)
    if isinstance(batch, bool) or not isinstance(batch, (int, np.integer)) or batch < 1:
        raise NpuMoeError(f"batch must be an integer >= 1 (prompts prefilled together); got {batch!r}")
    if isinstance(draws, bool) or not isinstance(draws, (int, np.integer)) or draws < 0:
        raise NpuMoeError(f"draws must be an integer >= 0 (parameter draws of the TTFT interval); got {draws!r}")
    plat = get_platform(platform)
    m, tok = load_model(model) if isinstance(model, str) else model
    name = model if isinstance(model, str) else getattr(m.config, "_name_or_path", "model")
    tasks = curve_samples(tok, m, workloads, prompt_len, difficulty, n, seed)
    v = get_variant(variant)
    profile = calibration_profile(m, tok, calib_workload, chunk, calib_tokens, seed)
    plans = {(r, p): variant_plan(profile, variant, m, platform=plat, percentile=p, saliency=r)
             for r in saliency for p in percentiles}
    pad_id = tok.pad_token_id if tok.pad_token_id is not None else (tok.eos_token_id or 0)
    config = PrefillConfig(plat, chunk, attention=v.attention, pad_token_id=pad_id)
    # the TTFT interval as `run` gives it (experiments/runner.py): every prefill's ops priced under the same
    # parameter draws of the platform (posterior, else prior), the samples' mean taken per draw
    drawn = parameter_draws(plat, int(draws), seed) if draws and plat.kind != "measured" else None
    no_interval = _no_interval_reason(plat, draws)
    own_bar = bar is None
    bar = bar or progress(total=sum(len(s) for *_, s in tasks) * (1 + len(plans)), desc="accuracy curve")
    rows, per_sample = [], []
    for wname, wl, d, samples in tasks:
        refs, cache = task_references(m, tok, wname, wl, d, samples, seed, chunk, pad_id, ref_cache, bar)
        task_rows, task_samples = [], []
        for (rule, p), plan in plans.items():
            attach(m, plan, spill=v.spill, npu_dtype=config.npu_dtype)
            outs, ttft, per_draw, dropped, routed, padded, slots = [], [], [], 0, 0, 0, 0
            for i, (s, ref, res) in enumerate(_prefills(m, samples, refs, config, batch)):
                o = plan_outcome(m, tok, s, wl, res, ref)
                outs.append(o)
                ttft.append(res.summary["ttft_s"])
                if drawn is not None:
                    per_draw.append(ops_draw_metrics(res.ops, plat, len(s.input_ids), drawn))
                dropped += sum(st.dropped for *_, st in res.stats)
                routed += sum(st.routed for *_, st in res.stats)
                padded += sum(st.padded for *_, st in res.stats)
                slots += sum(st.slots for *_, st in res.stats)
                task_samples.append(dict(workload=wname, saliency=rule, percentile=p, sample=i,
                                         ref_score=ref.score, score=o["score"], ref_nll=ref.nll, nll=o["nll"],
                                         top1_agree=o["top1_agree"]))
                bar.update(1)
            detach(m)
            row = _row(name, wname, wl, d, rule, p, plan, plat, chunk, variant, refs, outs, ttft, dropped, routed,
                       padded, slots, seed)
            row.update(_ttft_interval(per_draw, plat, no_interval), ref_cached=cache.hits if cache else 0)
            task_rows.append(row)
        rows += task_rows
        per_sample += task_samples
        if on_task is not None:
            on_task(pd.DataFrame(rows), pd.DataFrame(per_sample))
    if own_bar:
        bar.close()
    table = pd.DataFrame(rows)
    table["model_fingerprint"] = model_fingerprint(m)[:16]
    return table, pd.DataFrame(per_sample)


def _prefills(m, samples, refs, config, batch: int):
    """(sample, reference, PrefillResult) in sample order: `batch` equally long prompts at a time through
    batched_prefill (each sequence exactly as alone), one at a time where batch = 1, the platform is measured or a
    prompt's length is its own."""
    if batch <= 1 or config.measured:
        for s, ref in zip(samples, refs):
            yield s, ref, run_prefill(m, torch.tensor([s.input_ids]), config)
        return
    i = 0
    while i < len(samples):
        j = i + 1
        while j < len(samples) and j - i < batch and len(samples[j].input_ids) == len(samples[i].input_ids):
            j += 1
        ids = torch.tensor([s.input_ids for s in samples[i:j]])
        results = batched_prefill(m, ids, config) if j - i > 1 else [run_prefill(m, ids, config)]
        for k, res in enumerate(results):
            yield samples[i + k], refs[i + k], res
            results[k] = None              # each sequence's logits and cache freed once scored
        i = j


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
                plan_hash=plan.hash, ttft_s=float(np.mean(ttft)),
                timing_source="modeled" if plat.kind != "measured" else "measured", accuracy_source="measured",
                seed=seed, cpu=cpu_model(), created=time.strftime("%Y-%m-%dT%H:%M:%S%z"))


def _no_interval_reason(plat, draws) -> str | None:
    """Why the platform gives the modeled TTFT no interval (None: it does)."""
    if plat.kind == "measured":
        return f"platform {plat.name} is measured: its TTFT is a measurement, not a model with parameter draws"
    if not draws:
        return "draws = 0 asked: no parameter draws, no interval"
    if not array_priced(plat):
        return (f"platform {plat.name}'s cost structure is not priced on arrays over parameter draws "
                "(sim/pricing.array_priced)")
    return None


def _ttft_interval(per_draw: list, plat, reason: str | None) -> dict:
    """ttft_s_lo / _hi (the 90 % interval of the samples' mean TTFT over the parameter draws), the same for energy
    and CPU cycles, `interval_source` (posterior / prior) and `interval_note` (why there is none, else empty)."""
    cols = mean_interval(per_draw) if reason is None else {}
    if reason is None and not cols:
        reason = "a prefill's op stream is not in the engine's chain / branch / join pattern (sim/stream.py)"
    if reason is not None:
        return dict(ttft_s_lo=math.nan, ttft_s_hi=math.nan, interval_draws=0, interval_source="none",
                    interval_note=reason)
    return dict(cols, interval_source=draws_source(plat), interval_note="")


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
