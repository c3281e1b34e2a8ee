"""`npumoe-lab run`: model x workload x variant x platform x prompt length x chunk -> tidy result rows.

For each variant the same calibration profile yields the variant's plan; each sample is prefilled in static
chunks through that plan, timed on every platform (measured on this host, modeled elsewhere), and scored
against the `reference` variant (HF's own dropless experts) on the same samples.
"""
from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd
import torch

from npumoe_lab.execution.calibrate import calibration_profile
from npumoe_lab.core.cpu_features import resolve_dtype, row_fields
from npumoe_lab.core.host_memory import keep_freed_memory
from npumoe_lab.devices import as_platform
from npumoe_lab.devices.hostload import HostLoad, warn_if_busy
from npumoe_lab.devices.hostspeed import probe_s
from npumoe_lab.execution.drift import DriftMonitor
from npumoe_lab.errors import NpuMoeError
from npumoe_lab.execution.experts import attach, detach, dropless_executor, set_executor
from npumoe_lab.execution.footprint import plan_columns
from npumoe_lab.execution.geometry import ModelGeometry
from npumoe_lab.planning.knobs import PlanKnobs
from npumoe_lab.planning.layout import ExecutionLayout
from npumoe_lab.results.metrics import ReferenceLogits, bootstrap_ci, logit_agreement
from npumoe_lab.models import describe, load_model, model_fingerprint
from npumoe_lab.planning.plan import Plan, variant_plan
from npumoe_lab.execution.runtime import (PrefillConfig, check_chunk, check_context, check_lengths, chunked_prefill,
                                         run_prefill)
from npumoe_lab.sim.array_replay import mean_interval, ops_draw_metrics
from npumoe_lab.sim.pricing import draws_source, parameter_draws
from npumoe_lab.results.stats import paired_exact
from npumoe_lab.execution.timeline import to_frame
from npumoe_lab.utils import progress, provenance, with_torch_threads
from npumoe_lab.planning.variants import ABLATION, PAPER_ABLATION_SPEEDUP, parse_variants
from npumoe_lab.workloads import get_workload
from npumoe_lab.workloads.scoring import evaluate_sample
from npumoe_lab.experiments import interleave
from npumoe_lab.experiments.shared_numerics import Numerics, numerics_key, remodel
from npumoe_lab.experiments.speed_anchor import anchor_s, is_anchor_geometry
from npumoe_lab.execution.decode import reprice_decode, run_decode
from npumoe_lab.execution.decode_policy import DEFAULT_DECODE_TOKENS, check_decode
from npumoe_lab.sim.decode import e2e_columns, e2e_draws, e2e_interval
from npumoe_lab.results.store import knob_columns, write_rows, write_timeline

MEASURED_REPEATS = 3   # default repeats of a measured platform (median and IQR need several); modeled: 1
PLAN_KNOBS = PlanKnobs.names()      # every build_plan knob is a run knob (and a sweep key of the notebooks)


def check_model_dtype(model, dtype) -> None:
    """A loaded model runs in its own dtype: asking for another one is an error, not a silent cast."""
    have = next(model.parameters()).dtype
    if dtype not in (None, "auto") and resolve_dtype(dtype) != have:
        raise NpuMoeError(f"dtype={dtype!r} asked, but the given model is {have}; load it with "
                          f"load_model(..., dtype={dtype!r}) or pass the model by name")


def _attach_variant(model, variant, specs, profile, config: PrefillConfig, knobs: dict, plan, npu_backend=None):
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
        used = variant_plan(profile, variant.name, model, config.platform, knobs)
    attach(model, used, spill=variant.spill, npu_dtype=config.npu_dtype, npu_backend=npu_backend)
    return used


@dataclass
class _Variant:
    """One variant made ready on one platform: its model configuration, plan, prefill config and numerics."""
    variant: object                  # variants.Variant
    snapshot: tuple                  # interleave.snapshot of the model in this configuration
    plan: object                     # the Plan used, or None
    config: PrefillConfig
    monitor: object                  # DriftMonitor or None
    key: tuple                       # shared_numerics.numerics_key
    prior: list | None               # per sample Numerics of an equal-numerics run already done (to reuse)
    per_rep: list = field(default_factory=list)    # per repeat: per sample summary dicts
    per_draw: list = field(default_factory=list)   # per repeat: per sample metrics under the parameter draws
    per_e2e: list = field(default_factory=list)    # per repeat: per sample e2e metrics under the draws (decode)
    acc: list = field(default_factory=list)        # per sample: score, ref_score, nll, agreement
    mine: list = field(default_factory=list)       # per sample Numerics of this run
    load: HostLoad = field(default_factory=HostLoad)
    layout: object = None            # the ExecutionLayout the variant runs (None: HF's experts): what the plan did


@dataclass
class _Run:
    """A run's inputs resolved once (objects, checked) and what its steps share."""
    model: object
    tok: object
    name: str
    variants: list                   # variants.Variant
    platforms: list                  # devices.Platform
    workload: object
    samples: list
    specs: list
    fingerprint: str
    numerics_fields: dict            # dtype, cpu_flags, cpu_model
    pad_id: int
    chunk: int
    plan: object                     # a given Plan or None
    knobs: dict                      # the plan knobs given (None values dropped for building plans)
    prompt_len: int = 0
    refs: list = field(default_factory=list)        # per sample (ReferenceLogits, reference score)
    shared: dict = field(default_factory=dict)      # numerics key -> per sample Numerics
    drawn: dict | None = None                       # this platform's parameter draws (modeled), or None
    decode_tokens: int = 0                          # greedy decode steps after each prefill (0: prefill only)
    decode_policy: str = "pipeline"
    decoded: dict = field(default_factory=dict)     # (numerics key, sample) -> the decode's (ops, stats)
    run_id: str | None = None                       # this call's id on its rows and timelines

    @staticmethod
    def resolve(model, workload, variants, platforms, prompt_len, chunk, plan, repeats, n_samples, seed, model_name,
                dtype, plan_knobs) -> "_Run":
        """Step 1: every argument checked and turned into the object the later steps use (platforms, variants,
        model and tokenizer, samples, plan)."""
        vlist = parse_variants(variants)
        plats = [as_platform(p.strip() if isinstance(p, str) else p)
                 for p in (platforms.split(",") if isinstance(platforms, str) else platforms)]
        if repeats is not None and repeats < 1:
            raise NpuMoeError(f"repeats (--repeats) must be >= 1; got {repeats}")
        if n_samples < 1:
            raise NpuMoeError(f"n_samples (--n-samples) must be >= 1; got {n_samples}")
        check_chunk(chunk)
        check_lengths(prompt_len, chunk)
        keep_freed_memory()             # before the model's weights and row_fields (core/host_memory.py)
        if isinstance(model, tuple):
            model_obj, tok = model
            name = model_name or getattr(model_obj.config, "_name_or_path", "model")
            check_model_dtype(model_obj, dtype)
        else:
            model_obj, tok = load_model(model, dtype=resolve_dtype(dtype))
            name = model_name or str(model)
        numerics_fields = row_fields(next(model_obj.parameters()).dtype)   # dtype, cpu_flags, cpu_model, malloc
        check_context(getattr(model_obj.config, "max_position_embeddings", None), prompt_len, "--prompt-len")
        wl = get_workload(workload)
        samples = wl.samples(tok, prompt_len, n_samples, seed)
        if isinstance(plan, (str, Path)):
            plan = Plan.load(plan, model=model_obj)
        pad_id = tok.pad_token_id if tok.pad_token_id is not None else (tok.eos_token_id or 0)
        return _Run(model_obj, tok, name, vlist, plats, wl, samples, describe(model_obj), model_fingerprint(model_obj),
                    numerics_fields, pad_id, chunk, plan, plan_knobs, prompt_len)

    def score(self, sample, res) -> dict:
        """Score from an existing prefill; decoding runs the normal (dropless) path."""
        model = self.model
        attached = getattr(model, "_npumoe", None) is not None
        prev = set_executor(model, dropless_executor) if attached else None
        try:
            return evaluate_sample(model, self.tok, sample, self.workload,
                                   prefill_fn=lambda m, ids: (res.logits, res.past_key_values))
        finally:
            if attached:
                set_executor(model, prev)

    def calibrate(self, calib_workload, calib_tokens, seed):
        """Step 2: the calibration profile every plan variant's plan is built from (None: no plan variant)."""
        if not any(v.experts == "plan" for v in self.variants):
            return None
        return calibration_profile(self.model, self.tok, calib_workload, self.chunk, calib_tokens, seed)

    def reference(self) -> None:
        """Step 3: HF's own experts on every sample (the accuracy reference). Timed on a modeled platform when the
        reference variant is asked for: its rows there reuse this forward."""
        detach(self.model)
        self.model.set_experts_implementation("eager")
        ref_v = next((v for v in self.variants if v.name == "reference"), None)
        ref_plat = next((p for p in self.platforms if p.kind != "measured"), None) if ref_v else None
        config = PrefillConfig(ref_plat, self.chunk, attention=ref_v.attention, pad_token_id=self.pad_id) \
            if ref_plat else PrefillConfig.untimed(self.chunk, self.pad_id)
        numerics = []
        for s in progress(self.samples, desc="reference", leave=False):
            ids = torch.tensor([s.input_ids])
            if ref_plat is None:
                res = chunked_prefill(self.model, ids, config)
            else:
                res = run_prefill(self.model, ids, config, measure_hf_experts=True)
                if self.decode_tokens:        # before scoring: the decode crops the cache back to the prompt
                    d = run_decode(self.model, res, config, self.decode_tokens, self.decode_policy, True)
                    self.decoded[(numerics_key(ref_v, None, config), len(self.refs))] = (d.ops, d.stats)
            self.refs.append((ReferenceLogits(res.logits), self.score(s, res)))   # prepared once for every variant
            numerics.append(Numerics(ref_plat.name if ref_plat else None, res.ops, res.stats, res.wall_s,
                                     self.refs[-1][1], logit_agreement(self.refs[-1][0], res.logits)))
        if ref_plat is not None:
            self.shared[numerics_key(ref_v, None, config)] = numerics

    def prepare(self, plat, profile, npu_backend, warmup, drift, share_numerics) -> list[_Variant]:
        """Step 4: each variant's plan and model configuration on `plat` (warmed up when measured)."""
        if npu_backend not in (None, "torch") and plat.kind != "measured":
            raise NpuMoeError(f"--npu-backend {npu_backend} runs real graphs: use it with a measured platform "
                              f"(e.g. cpu), not the modeled {plat.name!r}")
        out = []
        for v in self.variants:
            config = PrefillConfig(plat, self.chunk, attention=v.attention, pad_token_id=self.pad_id)
            used = _attach_variant(self.model, v, self.specs, profile, config, PlanKnobs.given(self.knobs), self.plan,
                                   npu_backend)
            if config.measured:   # untimed: first calls pay allocator/thread-pool start-up (one static chunk)
                for _ in range(warmup):
                    chunked_prefill(self.model, torch.tensor([self.samples[0].input_ids[:self.chunk]]),
                                    PrefillConfig.untimed(self.chunk, self.pad_id))
            mon = None
            if drift and used is not None:     # after the warm-up: only the samples' routing is monitored
                mon = self.model._npumoe.executor.monitor = DriftMonitor(used, profile)
            layout = ExecutionLayout.dropless(self.specs) if v.experts == "dynamic" else \
                (used.compile() if used is not None else None)
            key = numerics_key(v, used, config)
            out.append(_Variant(v, interleave.snapshot(self.model), used, config, mon, key,
                                self.shared.get(key) if share_numerics else None, layout=layout))
        return out

    def prefill(self, plat, prepared: list[_Variant], reps, share_numerics, geometry, timeline, tl_frames,
                bar) -> None:
        """Step 5: every repeat x sample x variant prefilled (or priced from an equal-numerics run), variants
        interleaved: a slow spell of the host hits every variant alike."""
        n_experts = sum(s.n_experts for s in self.specs)
        for p in prepared:
            p.per_rep = [[] for _ in range(reps)]
            p.per_draw = [[] for _ in range(reps)]
            p.per_e2e = [[] for _ in range(reps)]
        measured = [p for p in prepared if p.config.measured]
        for r in range(reps):
            if measured:                # the host's speed now, once per repeat (every variant shares it)
                t = probe_s()
                for p in measured:
                    p.load.probes.append(t)
            for i, s in enumerate(self.samples):
                ids = torch.tensor([s.input_ids])
                if measured:            # the speed anchor before each sample's prefills (validate-device scales by it)
                    a = anchor_s()
                    for p in measured:
                        p.load.anchors.append(a)
                for p in prepared:
                    v, config, prior = p.variant, p.config, p.prior
                    if share_numerics and not config.measured and (prior or r > 0):   # numerics ran already
                        src = prior[i] if prior else p.mine[i]
                        res = remodel(src, config, geometry, n_tokens=len(s.input_ids))
                        res.summary["numerics_from"] = src.platform
                        ops = src.ops
                        dec = self._decode(p, i, res, geometry, plat, None) if self.decode_tokens else {}
                    else:
                        interleave.restore(self.model, p.snapshot)
                        with p.load.measuring():
                            res = run_prefill(self.model, ids, config, measure_hf_experts=v.experts == "hf")
                            dec = self._decode(p, i, res, geometry, plat, self.model) if self.decode_tokens else {}
                        ops = res.ops
                    res.summary.update(plan_columns(p.layout, res.events, plat, n_experts))   # what the plan did
                    p.per_rep[r].append(res.summary)
                    pre = ops_draw_metrics(ops, plat, len(s.input_ids), self.drawn)
                    p.per_draw[r].append(pre)
                    if self.decode_tokens:
                        res.summary.update(e2e_columns(res.summary, dec["summary"], self.decode_tokens,
                                                       self.decode_policy))
                        p.per_e2e[r].append(e2e_draws(pre, dec["draws"], self.decode_tokens))
                    if timeline and r == 0:
                        tl_frames.append(to_frame(res.events, res.ops).assign(
                            variant=v.name, platform=plat.label, sample=i, model=self.name,
                            prompt_len=self.prompt_len, run_chunk=self.chunk, run_id=self.run_id))
                    if r == 0:
                        if prior:
                            sc, agree = prior[i].score, prior[i].agreement
                        else:
                            sc, agree = self.score(s, res), logit_agreement(self.refs[i][0], res.logits)
                        p.mine.append(Numerics(plat.name, res.ops, res.stats, res.wall_s, sc, agree))
                        p.acc.append(dict(score=sc["score"], ref_score=self.refs[i][1]["score"], nll=sc.get("nll"),
                                          **agree))
                    bar.update(1)
        for p in prepared:
            self.shared.setdefault(p.key, p.mine)

    def _decode(self, p, i, res, geometry, plat, model) -> dict:
        """The decode after sample i's prefill: run for real (`model`, the prefill's cache) or, sharing numerics,
        its recorded ops repriced on `plat`; {summary, draws (metrics under the platform's draws or None)}."""
        key = (p.key, i)
        if model is not None:
            d = run_decode(model, res, p.config, self.decode_tokens, self.decode_policy, p.variant.experts == "hf")
            self.decoded.setdefault(key, (d.ops, d.stats))
            summary, ops = d.summary, d.ops
        else:
            summary, ops = reprice_decode(*self.decoded[key], p.config, geometry, self.decode_tokens)
        return dict(summary=summary, draws=ops_draw_metrics(ops, plat, self.decode_tokens, self.drawn))

    def rows(self, plat, prepared: list[_Variant], workload, prompt_len, npu_backend, seed, prov) -> list[dict]:
        """Step 6: one result row per variant and repeat (accuracy over the samples, timing per repeat)."""
        rows = []
        for p in prepared:
            v, used, mon = p.variant, p.plan, p.monitor
            deltas = [a["score"] - a["ref_score"] for a in p.acc]
            d_mean, d_lo, d_hi = bootstrap_ci(deltas, seed=seed)
            accdf = pd.DataFrame(p.acc)
            exact = paired_exact(accdf["ref_score"], accdf["score"])
            ttfts = [pd.DataFrame(reps_r)["ttft_s"].mean() for reps_r in p.per_rep]
            host = p.load.columns(ttfts) if plat.kind == "measured" else {}
            if host:                  # validate-device --runs scales only runs of the anchor's geometry by it
                host["anchor_geometry"] = is_anchor_geometry(self.model.config)
            for r, reps_r in enumerate(p.per_rep):
                m = pd.DataFrame(reps_r)
                row = dict(model=self.name, workload=workload, variant=v.name, platform=plat.label,
                           platform_base=plat.name, platform_chip=plat.chip,
                           prompt_len=prompt_len, chunk=self.chunk, repeat=r, n_samples=len(self.samples),
                           score_name=self.workload.metric, score=accdf["score"].mean(),
                           ref_score=accdf["ref_score"].mean(),
                           accuracy_delta=d_mean, accuracy_ci_low=d_lo, accuracy_ci_high=d_hi,
                           accuracy_lost=exact["lost"], accuracy_gained=exact["gained"],
                           accuracy_exact_low=exact["exact_low"], accuracy_exact_high=exact["exact_high"],
                           accuracy_loss_bound=exact["loss_bound"], mcnemar_p=exact["mcnemar_p"],
                           nll=accdf["nll"].mean() if accdf["nll"].notna().any() else None,
                           top1_agree=accdf["top1_agree"].mean(), kl=accdf["kl"].mean(),
                           platform_profile=plat.name, platform_hash=plat.hash, platform_kind=plat.kind,
                           model_fingerprint=self.fingerprint, plan_hash=getattr(used, "hash", None),
                           npu_backend=(npu_backend or "torch") if v.experts == "plan" else None,
                           torch_threads=torch.get_num_threads(), **self.numerics_fields,
                           created=time.strftime("%Y-%m-%dT%H:%M:%S%z"), run_id=self.run_id, **host, **prov,
                           **(mon.summary() if mon else {}))
                row.update(knob_columns(self.knobs))      # swept knobs become columns (the figures read them)
                for col in m.columns:
                    row[col] = m[col].mean() if pd.api.types.is_numeric_dtype(m[col]) else m[col].iloc[0]
                if self.drawn is not None:
                    row.update(mean_interval(p.per_draw[r]), interval_source=draws_source(plat))
                    if self.decode_tokens:
                        row.update(e2e_interval(p.per_e2e[r]))
                rows.append(row)
        return rows


@with_torch_threads
def run_experiment(model="tiny", workload="ruler-multikey", variants="all", platforms="cpu,m2-max",
                   prompt_len=1024, chunk=256, plan=None, repeats=None, n_samples=4, seed=0, out=None,
                   calib_workload="mixed", calib_tokens=8192, timeline=False, model_name=None, warmup=1,
                   npu_backend=None, dtype=None, share_numerics=True, drift=False, draws: int = 0,
                   decode_tokens: int = DEFAULT_DECODE_TOKENS, decode_policy: str = "pipeline",
                   **plan_knobs) -> pd.DataFrame:
    """Run every (variant, platform) on the workload's samples; returns (and writes to `out`) result rows.
    `repeats=None`: MEASURED_REPEATS on a measured platform (variants interleaved, host load recorded, median
    and IQR stored, rows flagged `host_busy` with one warning when the host was not quiet), 1 on a modeled one.
    `threads=N` sets torch's intra-op threads for the run (rows record `torch_threads` either way). `dtype`: the
    model's dtype when loaded by name (None/"auto": this CPU's fast dtype, cpu_features.py); rows record it with
    the CPU's flags. A modeled platform reuses the forward of a run with the same numerics (shared_numerics.py;
    `share_numerics=False`: every row from its own forward). `drift=True`: plan variants run with a drift monitor
    against the calibration profile (drift.py; columns drift_*); each row then comes from its own forward.
    `decode_tokens` N >= 1: after each prefill N greedy decode steps under `decode_policy` (execution/decode.py;
    the e2e columns, sim/decode.py); 0: prefill-only rows.

    The steps: resolve the inputs -> calibrate -> the reference prefill per sample -> per platform: each variant's
    plan and configuration, then every sample x variant x repeat prefilled -> rows."""
    share_numerics = share_numerics and not drift     # a monitor observes the forward it is attached to
    PlanKnobs.check_names(plan_knobs)
    check_decode(decode_tokens, decode_policy)
    run = _Run.resolve(model, workload, variants, platforms, prompt_len, chunk, plan, repeats, n_samples, seed,
                       model_name, dtype, plan_knobs)
    run.decode_tokens, run.decode_policy = decode_tokens, decode_policy
    # one id on this call's rows and timelines: runs into one folder keep content-hashed files side by side, and
    # validate-device --runs pairs each run's rows with its own op streams by it
    run.run_id = uuid.uuid4().hex[:16]
    profile = run.calibrate(calib_workload, calib_tokens, seed)
    run.reference()
    rows, tl_frames = [], []
    prov = provenance()
    geometry = ModelGeometry.from_config(run.model.config)
    reps_of = {p.name: repeats or (MEASURED_REPEATS if p.kind == "measured" else 1) for p in run.platforms}
    bar = progress(total=len(run.variants) * len(run.samples) * sum(reps_of.values()), desc=f"run {workload}")
    for plat in run.platforms:
        prepared = run.prepare(plat, profile, npu_backend, warmup, drift, share_numerics)
        # modeled platforms: each sample's ops priced under parameter draws too (the rows' 90 % intervals)
        run.drawn = parameter_draws(plat, draws, seed) if draws and plat.kind != "measured" else None
        run.prefill(plat, prepared, reps_of[plat.name], share_numerics, geometry, timeline, tl_frames, bar)
        rows += run.rows(plat, prepared, workload, prompt_len, npu_backend, seed, prov)
    warn_if_busy(rows)
    bar.close()
    detach(run.model)
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
    """One line per (variant, platform): the median over repeats of each number (what the ablation line uses).
    Columns the rows do not have are left out (modeled-only runs have no IQR or host_busy columns)."""
    keys = ["variant", "platform"]
    cols = [c for c in cols if c in df.columns]
    g = df.groupby(keys, sort=False)
    num = [c for c in cols if c not in keys and pd.api.types.is_numeric_dtype(df[c]) and df[c].dtype != bool]
    other = [c for c in cols if c not in keys and c not in num]
    t = g[num].median().join(g[other].first()).reset_index()[cols]
    with pd.option_context("display.width", 200, "display.max_columns", 20):
        return f"(median over repeats; measured rows: {int(df.groupby(keys).size().max())} repeats)\n" + \
            t.to_string(index=False)
