"""The experts path timed on its own inside a real prefill: static plan vs HF eager vs HF grouped_mm.

The 2-layer Qwen3-30B-A3B-geometry model (bench/policy.two_layer_setup: same weights and dtype for every row)
prefills the same prompt in chunks of 512 with each experts implementation; forward hooks on every layer's
`mlp.experts` module time what runs inside it (HF's eager loop, HF's grouped_mm, or the attached plan executor:
dispatch, pack, group GEMMs, cold experts, scatter), beside the whole prefill's wall time. Rows rotate each repeat
(interleaved), medians reported. Routing: the same router weights and the same hidden states entering layer 0;
the static plan prunes, so layer 1 sees slightly different hidden states (its routing is the model's own, not
replayed). Target: static >= 1.5x the faster HF implementation at every prompt. The step table splits the static
path by the engine's own measured ops (a measured-clock prefill of the same prompt) and sets each step beside its
roofline: max(FLOPs / dense GEMM peak, bytes / read bandwidth) from the op's own cost record, both measured now.
"""
from __future__ import annotations

import statistics
import time

import torch

TARGET = 1.5
STEPS = ("dispatch", "pack", "groups", "cold", "spill", "scatter")


class ExpertsTimer:
    """Forward hooks on each MoE layer's experts module: seconds spent inside them since the last `take()`."""

    def __init__(self, model):
        from npumoe_lab.models import find_moe_blocks
        self.total, self._t0, self.handles = 0.0, {}, []
        for ref in find_moe_blocks(model):
            mod = ref.experts
            self.handles.append(mod.register_forward_pre_hook(self._pre))
            self.handles.append(mod.register_forward_hook(self._post))

    def _pre(self, mod, args):
        self._t0[id(mod)] = time.perf_counter()

    def _post(self, mod, args, out):
        self.total += time.perf_counter() - self._t0.pop(id(mod))

    def take(self) -> float:
        t, self.total = self.total, 0.0
        return t

    def remove(self):
        for h in self.handles:
            h.remove()


def _step(name: str) -> str | None:
    if name.startswith("group"):
        return "groups"
    return name if name in STEPS else None


def step_table(model, plan, ids, peaks, repeats: int, chunk: int = 512) -> list[str]:
    """Markdown rows: the static path's steps (median over repeats of a measured-clock prefill) vs roofline."""
    import npumoe_lab as nl
    peak, bw = peaks
    nl.attach(model, plan, pad_rows="skip")
    per = {s: [] for s in STEPS}
    roof = dict.fromkeys(STEPS, 0.0)
    try:
        for r in range(repeats + 1):
            res = nl.prefill(model, ids, chunk=chunk, platform="cpu", attention="cpu")
            acc = dict.fromkeys(STEPS, 0.0)
            for e in res.events:
                s = _step(e.name)
                if s is not None:
                    acc[s] += e.duration_s
                    if r == 0:
                        roof[s] += max(e.flops / peak, e.bytes / bw)
            if r:
                for s in STEPS:
                    per[s].append(acc[s])
    finally:
        nl.detach(model)
    med = {s: statistics.median(v) for s, v in per.items()}
    tot, rtot = sum(med.values()) or 1.0, sum(roof.values()) or 1.0
    rows = []
    for s in STEPS:
        if med[s] == 0 and roof[s] == 0:
            continue
        flag = "above its share" if med[s] / tot > roof[s] / rtot + 0.02 else ""
        rows.append(f"| {s} | {1e3 * med[s]:.1f} | {100 * med[s] / tot:.0f} % | {1e3 * roof[s]:.1f} | "
                    f"{100 * roof[s] / rtot:.0f} % | {med[s] / roof[s] if roof[s] else float('inf'):.1f}x | {flag} |")
    return rows


def experts_in_prefill(model, tok, plan, prompts, repeats: int, peaks, checks: list | None = None,
                       chunk: int = 512) -> str:
    """The section of `make bench`: per prompt, whole prefill and experts-path medians of the three rows, the
    ratios, and the static path's step table."""
    import npumoe_lab as nl
    from npumoe_lab.execution.runtime import PrefillConfig, chunked_prefill
    from npumoe_lab.workloads import get_workload
    from policy import record
    setups = {"HF eager": lambda: (nl.detach(model), model.set_experts_implementation("eager")),
              "HF grouped_mm": lambda: (nl.detach(model), model.set_experts_implementation("grouped_mm")),
              "static plan (padding skipped)": lambda: nl.attach(model, plan, pad_rows="skip")}
    lines = ["| prompt | experts path | prefill median s | experts median s | experts % of prefill | "
             "experts: static speedup | prefill: static speedup |", "|---|---|---|---|---|---|---|"]
    steps = []
    for prompt in prompts:
        ids = torch.tensor([get_workload("lm-heldout").samples(tok, prompt, 1, seed=3)[0].input_ids])
        whole, inside = {k: [] for k in setups}, {k: [] for k in setups}
        timer = ExpertsTimer(model)
        try:
            for r in range(repeats + 1):                     # repeat 0: warm-up
                names = list(setups)
                for name in names[r % len(names):] + names[:r % len(names)]:
                    setups[name]()
                    timer.take()
                    t0 = time.perf_counter()
                    chunked_prefill(model, ids, PrefillConfig.untimed(chunk), keep_logits=False)
                    wall, exp = time.perf_counter() - t0, timer.take()
                    if r:
                        whole[name].append(wall)
                        inside[name].append(exp)
        finally:
            timer.remove()
            nl.detach(model)
        med_w = {k: statistics.median(v) for k, v in whole.items()}
        med_e = {k: statistics.median(v) for k, v in inside.items()}
        s = "static plan (padding skipped)"
        hf_best = min(("HF eager", "HF grouped_mm"), key=lambda k: med_e[k])
        for name in setups:
            sp_e = med_e[hf_best] / med_e[s] if name == s else med_e[name] / med_e[s]
            sp_w = (min(med_w["HF eager"], med_w["HF grouped_mm"]) if name == s else med_w[name]) / med_w[s]
            lines.append(f"| {prompt} | {name} | {med_w[name]:.3f} | {med_e[name]:.3f} | "
                         f"{100 * med_e[name] / med_w[name]:.0f} % | {sp_e:.2f}x | {sp_w:.2f}x |")
        ratio = med_e[hf_best] / med_e[s]
        record(checks, f"2-layer prefill {prompt}: experts path, static vs the faster HF ({hf_best})", ratio, ">=",
               TARGET)
        record(checks, f"2-layer prefill {prompt}: whole prefill, static vs the faster HF", min(
            med_w["HF eager"], med_w["HF grouped_mm"]) / med_w[s], ">=", 1.0, info=True)
        if ratio < TARGET:
            steps += [f"| {prompt} " + row for row in step_table(model, plan, ids, peaks, max(2, repeats // 2), chunk)]
        print("\n".join(lines[-len(setups):]), flush=True)
    text = ("Experts path inside the prefill (forward hooks on each layer's `mlp.experts`; 2-layer Qwen3-30B-A3B "
            f"geometry, chunk {chunk}, untimed `chunked_prefill`, {repeats} interleaved repeats, medians, measured). "
            "Speedup rows: HF rows = HF / static; the static row = the faster HF / static (target "
            f">= {TARGET}x on the experts path):\n\n" + "\n".join(lines))
    if steps:
        text += ("\n\nWhere the static path falls short: its steps (measured ops of a measured-clock prefill, "
                 "medians) vs their roofline (max(FLOPs / GEMM peak, bytes / read bandwidth), both measured now):\n\n"
                 "| prompt | step | measured ms | share | roofline ms | roofline share | measured / roofline | |\n"
                 "|---|---|---|---|---|---|---|---|\n" + "\n".join(steps))
    return text
