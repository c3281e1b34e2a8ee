"""What a plan did, as result-row columns: how many expert groups ran on each device, the NPU's share of the expert
FLOPs, and the ANE's per-process limits (platform YAML: max_resident_programs, max_compiles, compile_s).

- n_npu_groups / n_cpu_groups: resident / non-resident expert groups over all layers (a dropless layout: one CPU
  group per expert; HF's own experts: 0 / the experts of every layer); so the same variant name on two platforms
  shows its two plans.
- npu_expert_flop_share: FLOPs of the NPU's expert-group events / FLOPs of every expert event (groups, cold, spill,
  HF experts), padding included (the static graph computes it). 0 = the plan leaves every expert on the CPU
  (`npumoe` = `anemll` there).
- npu_programs: resident expert groups + one attention graph per layer run on the NPU; npu_compiles: one per
  resident group (its shape is static) + one per attention layer and distinct (chunk, past) shape of the prompt;
  compile_s (modeled): npu_compiles x compile_s, the first-run cost, reported apart and never inside TTFT;
  ane_limits: "ok", or which limit the plan breaks (flagged; the plan knob npu_program_budget keeps a plan under
  a program budget; graph bytes and the largest dimension are split by planning/grouping.py before this).
- feasible / infeasible_reason: whether a real ANE could hold the plan: its programs (resident groups + attention
  graphs) within max_resident_programs and within max_compiles at one compile per program (the count the plan's
  budget search uses, planning/residency.program_budget). Per-(chunk, past) attention recompiles stay a flag in
  ane_limits only: a fixed-context KV cache (ANEMLL's deployed graphs) compiles attention once per layer, so they
  are a property of this cost model's attention shapes, not of what a device can hold. Rows over it are still
  priced, and say so here: `infeasible` with the limit broken.
"""
from __future__ import annotations

import numpy as np

from npumoe_lab.execution.ops import OP_KINDS

EXPERT_EVENTS = ("cold", "spill", "experts")
EXPERT_KINDS = ("expert_group", "experts_dynamic", "experts_hf")     # the same ops by kind (an array op stream)


def npu_limit(platform, key: str):
    """A limit of the platform's NPU role (platform YAML npu.<key>), or None where the file states none."""
    entry = (getattr(platform, "params", {}) or {}).get("npu", {}).get(key)
    return None if entry is None or entry.get("value") is None else float(entry["value"])


def plan_columns(layout, events, platform, n_experts_total: int | None = None) -> dict:
    """Columns of one prefill: `layout` its ExecutionLayout (None: HF's own experts), `events` its timeline (or its
    array op stream)."""
    if layout is None:
        n_npu, n_cpu = 0, n_experts_total
    else:
        groups = [g for lay in layout.layers for g in lay.groups]
        n_npu = sum(g.device == "npu" for g in groups)
        n_cpu = len(groups) - n_npu
    npu_f, all_f, attention_layers, shapes = _expert_flops(events)
    programs = n_npu + len(attention_layers)
    compiles = n_npu + len(shapes)
    out = {"n_npu_groups": n_npu, "n_cpu_groups": n_cpu,
           "npu_expert_flop_share": npu_f / all_f if all_f else 0.0,
           "npu_programs": programs, "npu_compiles": compiles}
    per = npu_limit(platform, "compile_s")
    out["compile_s"] = compiles * per if per is not None and not platform.npu_shares_cpu else 0.0
    broken = []
    for key, have in (("max_resident_programs", programs), ("max_compiles", compiles)):
        lim = npu_limit(platform, key)
        if lim is not None and have > lim and not platform.npu_shares_cpu:
            broken.append(f"{key.replace('max_', '')} {have} > {lim:g}")
    out["ane_limits"] = "; ".join(broken) or "ok"
    out.update(feasibility(programs, platform))
    return out


def feasibility(programs: int, platform) -> dict:
    """{feasible, infeasible_reason} of a plan holding `programs` NPU programs on `platform` (module docstring)."""
    if platform.npu_shares_cpu:
        return {"feasible": True, "infeasible_reason": ""}
    why = []
    for key, what in (("max_resident_programs", "resident programs"), ("max_compiles", "compiles")):
        lim = npu_limit(platform, key)
        if lim is not None and programs > lim:
            why.append(f"{what} {programs} > {key} {lim:g}")
    return {"feasible": not why, "infeasible_reason": ("infeasible: " + "; ".join(why)) if why else ""}


def _expert_flops(events):
    """(NPU expert FLOPs, all expert FLOPs, NPU attention layers, NPU attention (layer, chunk) shapes) of a
    timeline's events, or of an array op stream (sim/stream.py columns: kind codes of OP_KINDS, role 0 = npu)."""
    if hasattr(events, "cols"):
        kind, npu = events["kind"], events["role"] == 0
        expert = np.isin(kind, [OP_KINDS.index(k) for k in EXPERT_KINDS])
        attn = (kind == OP_KINDS.index("attention")) & npu
        flops = events["flops"]
        layers, chunks = events["layer"][attn], events["chunk"][attn]
        return (float(flops[expert & npu].sum()), float(flops[expert].sum()), set(layers.tolist()),
                set(zip(layers.tolist(), chunks.tolist())))
    npu_f = all_f = 0.0
    attention_layers, shapes = set(), set()
    for e in events:
        if e.name.startswith("group") or e.name in EXPERT_EVENTS:
            all_f += e.flops
            if e.device == "npu":
                npu_f += e.flops
        elif e.name == "attention" and e.device == "npu":
            attention_layers.add(e.layer)
            shapes.add((e.layer, e.chunk))
    return npu_f, all_f, attention_layers, shapes


__all__ = ["plan_columns", "npu_limit", "feasibility"]
