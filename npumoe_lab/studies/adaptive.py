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

from npumoe_lab.execution.drift import POLICIES, DriftMonitor, DriftWarning, as_limits
from npumoe_lab.execution.engine import PlanExecutor
from npumoe_lab.errors import NpuMoeError
from npumoe_lab.execution.calibrate import calibration_profile
from npumoe_lab.execution.experts import attach, detach
from npumoe_lab.execution.geometry import ModelGeometry
from npumoe_lab.models import describe
from npumoe_lab.planning.plan import build_plan
from npumoe_lab.execution.routing import RoutingRecorder
from npumoe_lab.execution.runtime import PrefillConfig, check_lengths, run_prefill
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

    def save(self, out) -> list[Path]:
        """drift_per_chunk.csv, drift_records.csv, drift_summary.json in `out` (created); the paths written."""
        out = Path(out)
        out.mkdir(parents=True, exist_ok=True)
        paths = [out / "drift_per_chunk.csv", out / "drift_records.csv", out / "drift_summary.json"]
        self.per_chunk.to_csv(paths[0], index=False)
        self.drift.to_csv(paths[1], index=False)
        paths[2].write_text(json.dumps(self.summary, indent=2, default=str))
        return paths


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
    check_lengths(prompt_len, chunk, whole_chunks=True)
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


__all__ = ["DriftReport", "drift_run", "recorded_chunks"]
