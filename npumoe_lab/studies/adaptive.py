"""Drift experiment: calibrate on one domain, prefill held-out text of another with a drift monitor, and compare
with a plan calibrated on the run's domain directly.

Three real prefills of the same prompt (numerics on this CPU; times modeled on the platform): the calibration
domain's plan with the monitor (policy `recalibrate`), the same plan static (recalibrate="off", its drop rates
are the "before"), and the run domain's plan (the target). Drop rates are measured (real routing, real capacity
overflow); TTFT is modeled by replaying the monitored run's recorded routing through the old and the rebuilt plan.
"""
from __future__ import annotations

import json
import warnings
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from npumoe_lab.execution.drift import POLICIES, DriftLimits, DriftMonitor, DriftWarning, as_limits
from npumoe_lab.execution.engine import PlanExecutor
from npumoe_lab.errors import NpuMoeError
from npumoe_lab.execution.calibrate import calibration_profile
from npumoe_lab.execution.experts import attach, detach
from npumoe_lab.execution.geometry import ModelGeometry
from npumoe_lab.models import describe, load_model
from npumoe_lab.planning.plan import build_plan
from npumoe_lab.execution.routing import RoutingRecorder
from npumoe_lab.execution.runtime import PrefillConfig, check_chunk, run_prefill
from npumoe_lab.sim.replay import replay_prefill
from npumoe_lab.workloads.texts import DOMAINS
from npumoe_lab.workloads.lm_heldout import heldout_windows


@dataclass
class DriftReport:
    per_chunk: pd.DataFrame        # chunk, drop_static, drop_adaptive, drop_direct (measured), flagged layers
    drift: pd.DataFrame            # the monitor's records, one per (chunk, layer)
    rebuilds: list                 # drift.Rebuild
    summary: dict                  # result-row columns

    def text(self) -> str:
        s = self.summary
        lines = [f"drift run: plan calibrated on {s['calib_domain']}, prefill of lm-heldout/{s['run_domain']} "
                 f"({s['prompt_len']} tokens, chunk {s['chunk']}), policy {s['drift_policy']}",
                 f"  layers flagged: {s['drift_flagged_layers'] or 'none'} (first flag at chunk "
                 f"{s['first_flag_chunk']})"]
        for r in self.rebuilds:
            lines.append(f"  rebuild after chunk {r.chunk}: build {r.build_s * 1e3:.1f} ms (measured, this host), "
                         f"{len(r.graphs_recompiled)}/{r.graphs_total} static graphs to recompile")
        if self.rebuilds:
            lines.append(f"  drop rate of chunks > {s['rebuild_chunk']} (measured): static {s['drop_static_later']:.2%}"
                         f", adaptive {s['drop_adaptive_later']:.2%}, plan calibrated on {s['run_domain']} "
                         f"{s['drop_direct_later']:.2%} (gap {s['drop_gap_points']:+.2f} points)")
            lines.append(f"  TTFT of this prompt (modeled, {s['platform']}): old plan {s['ttft_old_ms_modeled']:.3f}"
                         f" ms, rebuilt plan {s['ttft_new_ms_modeled']:.3f} ms")
        return "\n".join(lines)


def _chunk_drops(stats) -> pd.Series:
    df = pd.DataFrame([(c, s.routed, s.dropped) for c, _, s in stats], columns=["chunk", "routed", "dropped"])
    g = df.groupby("chunk")[["routed", "dropped"]].sum()
    return g["dropped"] / g["routed"]


def recorded_chunks(records) -> list[dict]:
    """RoutingRecorder records -> [chunk] {layer: (top_k_index, top_k_weights, norms)} (one forward per chunk)."""
    out: dict[int, dict] = {}
    for r in records:
        out.setdefault(r.call, {})[r.layer] = (r.topk_idx, r.topk_weight, r.hidden_norm)
    return [out[c] for c in sorted(out)]


def drift_run(model, tokenizer, calib_domain: str = "scripture", run_domain: str = "code", prompt_len: int = 2048,
              chunk: int = 128, calib_tokens: int = 4096, recalibrate: str = "rebuild", platform: str = "m2-max",
              limits=None, persist: int = 2, window: int = 8, seed: int = 0, **knobs) -> DriftReport:
    for name, d in (("calib_domain", calib_domain), ("run_domain", run_domain)):
        if d not in DOMAINS:
            raise NpuMoeError(f"{name}={d!r} is not a domain; use one of {', '.join(DOMAINS)}")
    check_chunk(chunk)
    if prompt_len % chunk:
        raise NpuMoeError(f"prompt_len={prompt_len} must be a multiple of chunk={chunk} (whole chunks only)")
    if recalibrate not in POLICIES:
        raise NpuMoeError(f"recalibrate={recalibrate!r}: use one of {POLICIES}")
    limits = as_limits(limits)              # bad limits fail before any calibration runs
    # the cost rule keeps every group of the bundled model on the CPU (dropless: nothing for drift to drop);
    # "all" puts every group in a static NPU graph, the paper's setting where capacities matter
    knobs = {"residency": "all", **knobs}
    specs = describe(model)
    config = PrefillConfig(platform, chunk)
    ids = heldout_windows(tokenizer, run_domain, prompt_len, 1)[0]
    profile = calibration_profile(model, tokenizer, calib_domain, chunk, calib_tokens, seed)
    direct_profile = calibration_profile(model, tokenizer, run_domain, chunk, calib_tokens, seed)
    plan = build_plan(profile, model, config.platform, knobs)
    direct = build_plan(direct_profile, model, config.platform, knobs)

    def prefill(p, monitor=None):
        attach(model, p, monitor=monitor, npu_dtype=config.npu_dtype)
        try:
            return run_prefill(model, ids, config)
        finally:
            detach(model)
    monitor = DriftMonitor(plan, profile, limits=limits, recalibrate=recalibrate, persist=persist, window=window,
                           specs=specs)
    with warnings.catch_warnings(record=True) as caught, RoutingRecorder(model) as rec:
        warnings.simplefilter("always", DriftWarning)
        adaptive = prefill(plan, monitor)
    static, target = prefill(plan), prefill(direct)
    per_chunk = pd.DataFrame({"drop_static": _chunk_drops(static.stats), "drop_adaptive": _chunk_drops(adaptive.stats),
                              "drop_direct": _chunk_drops(target.stats)}).rename_axis("chunk").reset_index()
    drift = monitor.frame()
    flags = drift[drift["flagged"] != ""].groupby("chunk")["layer"].apply(lambda s: ",".join(map(str, sorted(s))))
    per_chunk["flagged_layers"] = per_chunk["chunk"].map(flags).fillna("")
    summary = {"calib_domain": calib_domain, "run_domain": run_domain, "prompt_len": prompt_len, "chunk": chunk,
               "platform": platform, "warnings": len(caught), **monitor.summary(),
               "first_flag_chunk": int(flags.index.min()) if len(flags) else None}
    if monitor.rebuilds:
        first = monitor.rebuilds[0]
        later = per_chunk[per_chunk["chunk"] > first.chunk]
        geometry = ModelGeometry.from_config(model.config)
        routing = recorded_chunks(rec.records)
        ttft = [replay_prefill(geometry, PlanExecutor(p, [], npu_dtype=config.npu_dtype), config, routing,
                               prompt_len)[0].summary["ttft_s"] for p in (plan, monitor.rebuilds[-1].plan)]
        summary |= first.row() | {
            "drop_static_later": float(later["drop_static"].mean()),
            "drop_adaptive_later": float(later["drop_adaptive"].mean()),
            "drop_direct_later": float(later["drop_direct"].mean()),
            "drop_gap_points": 100 * float(later["drop_adaptive"].mean() - later["drop_direct"].mean()),
            "ttft_old_ms_modeled": 1e3 * ttft[0], "ttft_new_ms_modeled": 1e3 * ttft[1]}
    return DriftReport(per_chunk, drift, monitor.rebuilds, summary)


def _cli(args) -> int:
    limits = {k: getattr(args, f"limit_{k}") for k in DriftLimits.__dataclass_fields__
              if getattr(args, f"limit_{k}", None) is not None}
    model, tok = load_model(args.model)
    rep = drift_run(model, tok, args.calib, args.run, prompt_len=args.prompt_len, chunk=args.chunk,
                    calib_tokens=args.calib_tokens, recalibrate=args.recalibrate, platform=args.platform,
                    limits=limits, persist=args.persist, window=args.window)
    print(rep.text())
    print(rep.per_chunk.to_string(index=False))
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        rep.per_chunk.to_csv(out / "drift_per_chunk.csv", index=False)
        rep.drift.to_csv(out / "drift_records.csv", index=False)
        (out / "drift_summary.json").write_text(json.dumps(rep.summary, indent=2, default=str))
        print(f"wrote {out}/drift_per_chunk.csv, drift_records.csv, drift_summary.json")
    return 0


def register_cli(sub) -> None:
    p = sub.add_parser("drift", help="routing drift: a plan calibrated on one domain prefilling another's "
                                     "held-out text, with the drift monitor and recalibration")
    p.add_argument("--model", default="tiny")
    p.add_argument("--calib", default="scripture", help=f"calibration domain ({', '.join(DOMAINS)})")
    p.add_argument("--run", default="code", help="domain of the lm-heldout prompt")
    p.add_argument("--prompt-len", type=int, default=2048)
    p.add_argument("--chunk", type=int, default=128)
    p.add_argument("--calib-tokens", type=int, default=4096)
    p.add_argument("--recalibrate", default="rebuild", choices=POLICIES)
    p.add_argument("--persist", type=int, default=2, help="drifting chunks in a row before a rebuild")
    p.add_argument("--window", type=int, default=8, help="live chunks the running profile keeps")
    p.add_argument("--platform", default="m2-max")
    for k in DriftLimits.__dataclass_fields__:
        p.add_argument(f"--limit-{k.replace('_', '-')}", dest=f"limit_{k}", type=int if k == "hot_k" else float,
                       help=f"drift limit {k} (default {getattr(DriftLimits(), k)})")
    p.add_argument("--out", help="directory for drift_per_chunk.csv, drift_records.csv, drift_summary.json")
    p.set_defaults(func=_cli)


__all__ = ["DriftReport", "drift_run", "recorded_chunks"]
