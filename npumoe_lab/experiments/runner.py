"""`npumoe-lab run`: model x workload x variant x platform x prompt length x chunk -> tidy result rows.

For each variant the same calibration profile yields the variant's plan; each sample is prefilled in static
chunks through that plan, timed on every platform (measured on this host, modeled elsewhere), and scored
against the `reference` variant (HF's own dropless experts) on the same samples.
"""
from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

import pandas as pd
import torch

from npumoe_lab.execution.calibrate import CalibrationProfile, calibrate, calibration_profile
from npumoe_lab.core.cpu_features import resolve_dtype, row_fields
from npumoe_lab.devices import get_platform
from npumoe_lab.devices.hostload import HostLoad, warn_if_busy
from npumoe_lab.execution.drift import DriftMonitor
from npumoe_lab.errors import NpuMoeError
from npumoe_lab.execution.experts import attach, detach, dropless_executor, set_executor
from npumoe_lab.execution.footprint import plan_columns
from npumoe_lab.execution.geometry import ModelGeometry
from npumoe_lab.planning.knobs import PlanKnobs, add_knob_arguments, knobs_from_args
from npumoe_lab.planning.layout import ExecutionLayout
from npumoe_lab.results.metrics import ReferenceLogits, bootstrap_ci, logit_agreement
from npumoe_lab.models import describe, load_model, model_fingerprint
from npumoe_lab.planning.plan import Plan, variant_plan
from npumoe_lab.execution.runtime import PrefillConfig, check_context, chunked_prefill, run_prefill
from npumoe_lab.results.stats import change_statement, paired_exact
from npumoe_lab.execution.timeline import to_frame
from npumoe_lab.utils import progress, provenance, with_torch_threads
from npumoe_lab.planning.variants import ABLATION, PAPER_ABLATION_SPEEDUP, parse_variants
from npumoe_lab.workloads import get_workload
from npumoe_lab.workloads.scoring import evaluate_sample
from npumoe_lab.experiments import interleave
from npumoe_lab.experiments.shared_numerics import Numerics, numerics_key, remodel
from npumoe_lab.results.store import write_rows, write_timeline

MEASURED_REPEATS = 3   # default repeats of a measured platform (median and IQR need several); modeled: 1
PLAN_KNOBS = PlanKnobs.names()      # every build_plan knob is a run knob (and a sweep key of the notebooks)


def check_model_dtype(model, dtype) -> None:
    """A loaded model runs in its own dtype: asking for another one is an error, not a silent cast."""
    have = next(model.parameters()).dtype
    if dtype not in (None, "auto") and resolve_dtype(dtype) != have:
        raise NpuMoeError(f"dtype={dtype!r} asked, but the given model is {have}; load it with "
                          f"load_model(..., dtype={dtype!r}) or pass the model by name")


def _attach_variant(model, variant, specs, profile, config: PrefillConfig, knobs, plan, npu_backend=None):
    """Put the model in the variant's configuration; returns the plan used (or None)."""
    detach(model)
    if variant.experts == "hf":
        model.set_experts_implementation("eager")
        return None
    if variant.experts == "dynamic":
        attach(model, ExecutionLayout.dropless(specs), cold="dynamic")
        return None
    if plan is not None and variant.name in ("npumoe", "npumoe-spill"):
        used = plan
    else:      # the variant's forced knobs over the given ones (plan.variant_plan: what `simulate` builds too)
        used = variant_plan(profile, variant.name, model, platform=config.platform.name,
                            **{k: v for k, v in knobs.items() if v is not None})
    attach(model, used, spill=variant.spill, npu_dtype=config.npu_dtype, npu_backend=npu_backend)
    return used


@with_torch_threads
def run_experiment(model="tiny", workload="ruler-multikey", variants="all", platforms="cpu,m2-max",
                   prompt_len=1024, chunk=256, plan=None, repeats=None, n_samples=4, seed=0, out=None,
                   calib_workload="mixed", calib_tokens=8192, timeline=False, model_name=None, warmup=1,
                   npu_backend=None, dtype=None, share_numerics=True, drift=False, **plan_knobs) -> pd.DataFrame:
    """Run every (variant, platform) on the workload's samples; returns (and writes to `out`) result rows.
    `repeats=None`: MEASURED_REPEATS on a measured platform (variants interleaved, host load recorded, median
    and IQR stored, rows flagged `host_busy` with one warning when the host was not quiet), 1 on a modeled one.
    `threads=N` sets torch's intra-op threads for the run (rows record `torch_threads` either way). `dtype`: the
    model's dtype when loaded by name (None/"auto": this CPU's fast dtype, cpu_features.py); rows record it with
    the CPU's flags. A modeled platform reuses the forward of a run with the same numerics (shared_numerics.py;
    `share_numerics=False`: every row from its own forward). `drift=True`: plan variants run with a drift monitor
    against the calibration profile (drift.py; columns drift_*); each row then comes from its own forward."""
    share_numerics = share_numerics and not drift     # a monitor observes the forward it is attached to
    PlanKnobs.check_names(plan_knobs)
    vlist = parse_variants(variants)
    plats = [get_platform(p.strip()) for p in (platforms.split(",") if isinstance(platforms, str) else platforms)]
    if (repeats is not None and repeats < 1) or n_samples < 1:
        raise NpuMoeError(f"repeats and n_samples must be >= 1; got {repeats} and {n_samples}")
    if isinstance(model, tuple):
        model_obj, tok = model
        name = model_name or getattr(model_obj.config, "_name_or_path", "model")
        check_model_dtype(model_obj, dtype)
    else:
        model_obj, tok = load_model(model, dtype=resolve_dtype(dtype))
        name = model_name or str(model)
    numerics_fields = row_fields(next(model_obj.parameters()).dtype)   # dtype, cpu_flags, cpu_model
    check_context(getattr(model_obj.config, "max_position_embeddings", None), prompt_len, "--prompt-len")
    wl = get_workload(workload)
    samples = wl.samples(tok, prompt_len, n_samples, seed)
    specs, fingerprint = describe(model_obj), model_fingerprint(model_obj)
    if isinstance(plan, (str, Path)):
        plan = Plan.load(plan, model=model_obj)
    profile = None
    if any(v.experts == "plan" for v in vlist):
        profile = calibration_profile(model_obj, tok, calib_workload, chunk, calib_tokens, seed)
    pad_id = tok.pad_token_id if tok.pad_token_id is not None else (tok.eos_token_id or 0)

    def score(sample, res):
        """Score from an existing prefill; decoding runs the normal (dropless) path."""
        attached = getattr(model_obj, "_npumoe", None) is not None
        prev = set_executor(model_obj, dropless_executor) if attached else None
        try:
            return evaluate_sample(model_obj, tok, sample, wl,
                                   prefill_fn=lambda m, ids: (res.logits, res.past_key_values))
        finally:
            if attached:
                set_executor(model_obj, prev)

    # the reference: HF's own experts, unchunked numerics aside from the chunking itself
    detach(model_obj)
    model_obj.set_experts_implementation("eager")
    # timed on a modeled platform when the reference variant is asked for: its rows there reuse this forward
    ref_v = next((v for v in vlist if v.name == "reference"), None)
    ref_plat = next((p for p in plats if p.kind != "measured"), None) if ref_v else None
    ref_config = PrefillConfig(ref_plat, chunk, attention=ref_v.attention, pad_token_id=pad_id) if ref_plat else None
    refs, ref_numerics = [], []
    for s in progress(samples, desc="reference", leave=False):
        ids = torch.tensor([s.input_ids])
        if ref_config is None:
            res = chunked_prefill(model_obj, ids, chunk, pad_token_id=pad_id)
        else:
            res = run_prefill(model_obj, ids, ref_config, measure_hf_experts=True)
        refs.append((ReferenceLogits(res.logits), score(s, res)))   # prepared once for every variant's agreement
        ref_numerics.append(Numerics(ref_plat.name if ref_plat else None, res.ops, res.stats, res.wall_s,
                                     refs[-1][1], logit_agreement(refs[-1][0], res.logits)))
    rows, tl_frames = [], []
    prov = provenance()
    geometry, shared = ModelGeometry.from_config(model_obj.config), {}   # numerics key -> per sample Numerics
    if ref_config is not None:
        shared[numerics_key(ref_v, None, ref_config)] = ref_numerics
    reps_of = {p.name: repeats or (MEASURED_REPEATS if p.kind == "measured" else 1) for p in plats}
    bar = progress(total=len(vlist) * len(samples) * sum(reps_of.values()), desc=f"run {workload}")
    for plat in plats:
        if npu_backend not in (None, "torch") and plat.kind != "measured":
            raise NpuMoeError(f"--npu-backend {npu_backend} runs real graphs: use it with a measured platform "
                              f"(e.g. cpu), not the modeled {plat.name!r}")
        reps, configs, layouts = reps_of[plat.name], {}, {}
        n_experts = sum(s.n_experts for s in specs)
        for v in vlist:
            config = PrefillConfig(plat, chunk, attention=v.attention, pad_token_id=pad_id)
            used = _attach_variant(model_obj, v, specs, profile, config, plan_knobs, plan, npu_backend)
            if config.measured:   # untimed: first calls pay allocator/thread-pool start-up (one static chunk)
                for _ in range(warmup):
                    chunked_prefill(model_obj, torch.tensor([samples[0].input_ids[:chunk]]), chunk,
                                    pad_token_id=pad_id)
            mon = None
            if drift and used is not None:     # after the warm-up: only the samples' routing is monitored
                mon = model_obj._npumoe.executor.monitor = DriftMonitor(used, profile)
            layouts[v.name] = ExecutionLayout.dropless(specs) if v.experts == "dynamic" else \
                (used.compile() if used is not None else None)
            key = numerics_key(v, used, config)
            configs[v.name] = (interleave.snapshot(model_obj), used, config, mon, key,
                               shared.get(key) if share_numerics else None)
        per_rep = {v.name: [[] for _ in range(reps)] for v in vlist}
        acc = {v.name: [] for v in vlist}
        mine = {v.name: [] for v in vlist}
        loads = {v.name: HostLoad() for v in vlist}
        for r in range(reps):       # variants interleaved: a slow spell of the host hits every variant alike
            for i, s in enumerate(samples):
                ids = torch.tensor([s.input_ids])
                for v in vlist:
                    snap, used, config, mon, key, prior = configs[v.name]
                    if share_numerics and not config.measured and (prior or r > 0):   # numerics ran already
                        src = prior[i] if prior else mine[v.name][i]
                        res = remodel(src, config, geometry, n_tokens=len(s.input_ids))
                        res.summary["numerics_from"] = src.platform
                    else:
                        interleave.restore(model_obj, snap)
                        with loads[v.name].measuring():
                            res = run_prefill(model_obj, ids, config, measure_hf_experts=v.experts == "hf")
                    res.summary.update(plan_columns(layouts[v.name], res.events, plat, n_experts))   # what the plan did
                    per_rep[v.name][r].append(res.summary)
                    if timeline and r == 0:
                        tl = to_frame(res.events).assign(variant=v.name, platform=plat.name, sample=i)
                        tl_frames.append(tl)
                    if r == 0:
                        if prior:
                            sc, agree = prior[i].score, prior[i].agreement
                        else:
                            sc, agree = score(s, res), logit_agreement(refs[i][0], res.logits)
                        mine[v.name].append(Numerics(plat.name, res.ops, res.stats, res.wall_s, sc, agree))
                        acc[v.name].append(dict(score=sc["score"], ref_score=refs[i][1]["score"], nll=sc.get("nll"),
                                                **agree))
                    bar.update(1)
        for v in vlist:
            _, used, config, mon, key, _ = configs[v.name]
            shared.setdefault(key, mine[v.name])
            deltas = [a["score"] - a["ref_score"] for a in acc[v.name]]
            d_mean, d_lo, d_hi = bootstrap_ci(deltas, seed=seed)
            accdf = pd.DataFrame(acc[v.name])
            exact = paired_exact(accdf["ref_score"], accdf["score"])
            ttfts = [pd.DataFrame(reps_r)["ttft_s"].mean() for reps_r in per_rep[v.name]]
            host = loads[v.name].columns(ttfts) if plat.kind == "measured" else {}
            for r, reps_r in enumerate(per_rep[v.name]):
                m = pd.DataFrame(reps_r)
                row = dict(model=name, workload=workload, variant=v.name, platform=plat.name,
                           prompt_len=prompt_len, chunk=chunk, repeat=r, n_samples=len(samples),
                           score_name=wl.metric, score=accdf["score"].mean(), ref_score=accdf["ref_score"].mean(),
                           accuracy_delta=d_mean, accuracy_ci_low=d_lo, accuracy_ci_high=d_hi,
                           accuracy_lost=exact["lost"], accuracy_gained=exact["gained"],
                           accuracy_exact_low=exact["exact_low"], accuracy_exact_high=exact["exact_high"],
                           accuracy_loss_bound=exact["loss_bound"], mcnemar_p=exact["mcnemar_p"],
                           nll=accdf["nll"].mean() if accdf["nll"].notna().any() else None,
                           top1_agree=accdf["top1_agree"].mean(), kl=accdf["kl"].mean(),
                           platform_profile=plat.name, platform_hash=plat.hash, platform_kind=plat.kind,
                           model_fingerprint=fingerprint, plan_hash=getattr(used, "hash", None),
                           npu_backend=(npu_backend or "torch") if v.experts == "plan" else None,
                           torch_threads=torch.get_num_threads(), **numerics_fields,
                           created=time.strftime("%Y-%m-%dT%H:%M:%S%z"), **host, **prov,
                           **(mon.summary() if mon else {}))
                for k in plan_knobs:            # swept knobs become columns (the figures read them)
                    row["n_tiers" if k == "tiers" else k] = plan_knobs[k]
                for col in m.columns:
                    row[col] = m[col].mean() if pd.api.types.is_numeric_dtype(m[col]) else m[col].iloc[0]
                rows.append(row)
    warn_if_busy(rows)
    bar.close()
    detach(model_obj)
    df = pd.DataFrame(rows)
    if out is not None:
        write_rows(df, out)            # content-hash file name: a re-run never replaces earlier rows
        if tl_frames:
            write_timeline(pd.concat(tl_frames, ignore_index=True), Path(out) / "timelines")
    return df


def ablation_report(df: pd.DataFrame) -> str:
    """Speedups of the ablation variants vs npumoe-base per (platform, prompt_len, chunk), next to the paper."""
    lines = []
    sub = df[df.variant.isin(ABLATION)]
    for (plat, p, c), g in sub.groupby(["platform", "prompt_len", "chunk"]):
        t = g.groupby("variant").ttft_s.median()
        if "npumoe-base" not in t:
            continue
        src = g.timing_source.iloc[0]
        drop = g.groupby("variant").drop_rate.median() if "drop_rate" in g else {}
        # each speedup at its own drop rate: steps that drop different shares are different accuracy points
        parts = [f"{v} {t['npumoe-base'] / t[v]:.2f}x at drop {100 * drop.get(v, float('nan')):.1f}% "
                 f"(paper {PAPER_ABLATION_SPEEDUP[v]:.2f}x)" for v in ABLATION if v in t]
        lines.append(f"[{src} {plat}] prompt {p}, chunk {c}: " + ", ".join(parts))
    return "\n".join(lines)


def median_table(df: pd.DataFrame, cols) -> str:
    """One line per (variant, platform): the median over repeats of each number (what the ablation line uses)."""
    keys = ["variant", "platform"]
    g = df.groupby(keys, sort=False)
    num = [c for c in cols if c not in keys and pd.api.types.is_numeric_dtype(df[c]) and df[c].dtype != bool]
    other = [c for c in cols if c not in keys and c not in num]
    t = g[num].median().join(g[other].first()).reset_index()[cols]
    with pd.option_context("display.width", 200, "display.max_columns", 20):
        return f"(median over repeats; measured rows: {int(df.groupby(keys).size().max())} repeats)\n" + \
            t.to_string(index=False)


def register_cli(sub):
    p = sub.add_parser("run", help="run variants on a workload and write result rows")
    p.add_argument("--model", default="tiny")
    p.add_argument("--workload", required=True)
    p.add_argument("--variant", default="all", help="comma list or 'all'")
    p.add_argument("--platform", default="cpu,m2-max", help="comma list; see `npumoe-lab platforms`")
    p.add_argument("--prompt-len", type=int, default=1024)
    p.add_argument("--chunk", type=int, default=256)
    p.add_argument("--plan", default=None, help="a plan JSON for the npumoe variants (else built from calibration)")
    p.add_argument("--repeats", type=int, default=None,
                   help=f"timed repeats per sample (default: {MEASURED_REPEATS} on a measured platform, 1 modeled)")
    p.add_argument("--samples", type=int, default=4)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--calib-workload", default="mixed")
    p.add_argument("--calib-tokens", type=int, default=8192)
    add_knob_arguments(p, with_defaults=False)       # unset: the plan's / variant's own knobs
    p.add_argument("--timeline", action="store_true", help="also write the per-op timeline")
    p.add_argument("--npu-backend", default=None, choices=["torch", "onnxruntime", "coreml"],
                   help="what runs resident groups on a measured platform (default: torch in process)")
    p.add_argument("--threads", type=int, default=None,
                   help="torch intra-op threads for the run (default: torch's own choice); recorded per row")
    p.add_argument("--dtype", default="auto",
                   help="model dtype: auto (this CPU's fast dtype: bf16 with avx512_bf16/AMX, else fp32), fp32, bf16")
    p.add_argument("--drift", action="store_true", help="monitor routing drift of the plan variants (drift_* columns)")
    p.add_argument("--out", required=True)
    p.set_defaults(func=_cli_run)
    q = sub.add_parser("platforms", help="list the platforms with their sources")
    q.set_defaults(func=lambda a: print(__import__("npumoe_lab.devices.hostcpu", fromlist=["x"]).platforms_report())
                   or 0)


def _cli_run(a: argparse.Namespace) -> int:
    knobs = knobs_from_args(a)
    df = run_experiment(model=a.model, workload=a.workload, variants=a.variant, platforms=a.platform,
                        prompt_len=a.prompt_len, chunk=a.chunk, plan=a.plan, repeats=a.repeats,
                        n_samples=a.samples, seed=a.seed, out=a.out, calib_workload=a.calib_workload,
                        calib_tokens=a.calib_tokens, timeline=a.timeline, npu_backend=a.npu_backend,
                        threads=a.threads, dtype=a.dtype, drift=a.drift, **knobs)
    cols = ["variant", "platform", "timing_source", "ttft_s", "ttft_iqr_s", "host_busy", "energy_per_token_mj",
            "cpu_busy_s", "n_npu_calls", "drop_rate", "pad_rate", "score", "accuracy_delta"]
    print(median_table(df, [c for c in cols if c in df.columns]))
    for r in df.drop_duplicates(["variant", "platform"]).itertuples():
        if r.variant != "reference" and pd.notna(getattr(r, "accuracy_lost", None)):
            print(f"  {r.variant} @ {r.platform}: " + change_statement(
                r.accuracy_lost, r.accuracy_gained, r.n_samples, r.accuracy_loss_bound, r.accuracy_exact_low,
                r.accuracy_exact_high))
    report = ablation_report(df)
    if report:
        print("\nablation (TTFT speedup vs npumoe-base):\n" + report)
    print(f"\nrows written to {a.out}")
    return 0
