"""The baselines and ablations (names fixed: CLI, results and figures use them).

Each variant says where attention runs, how experts run, and which knobs its plan is built with from the
same calibration profile, so variants differ only in what the paper's ablation toggles (PAPER.md 4.4, 5.5).
"""
from __future__ import annotations

from dataclasses import dataclass, field

from npumoe_lab.errors import NpuMoeError


@dataclass(frozen=True)
class Variant:
    name: str
    description: str
    attention: str                 # role running attention/dense parts: "npu" | "cpu"
    experts: str                   # "hf" (HF's own, detached) | "dynamic" (workbench dropless, CPU) | "plan"
    plan_overrides: dict = field(default_factory=dict)   # build_plan knobs forced by the variant
    spill: bool = False


VARIANTS: dict[str, Variant] = {v.name: v for v in [
    Variant("reference", "HF's own dropless experts, all on the CPU: the accuracy baseline", "cpu", "hf"),
    Variant("cpu-only", "everything on the CPU, dropless (the paper's Core ML CPU baseline)", "cpu", "dynamic"),
    Variant("naive-npu", "attention on CPU; each expert its own static NPU graph at its max observed capacity, "
            "one dispatch+sync per expert", "cpu", "plan",
            dict(capacity_rule="max_observed", group_size=1, residency="all")),
    Variant("anemll", "attention on the NPU, experts on the CPU (dropless): ANEMLL-style", "npu", "dynamic"),
    # no tiers = one tier: every expert gets the capacity covering the busiest expert's calibrated load, so base
    # drops what the tiered plans drop but pads far more (the static-shape cost tiers remove)
    Variant("npumoe-base", "operator partitioning only: one NPU graph per expert, one uniform capacity tier",
            "npu", "plan", dict(capacity_rule="tiered", tiers=1, group_size=1, residency="all")),
    Variant("npumoe-t", "+ static capacity tiers (one graph per expert)", "npu", "plan",
            dict(capacity_rule="tiered", group_size=1, residency="all")),
    Variant("npumoe-tg", "+ grouped expert execution (one graph per group of same-tier experts)", "npu", "plan",
            dict(capacity_rule="tiered", residency="all")),
    # residency: build_plan's default, the makespan rule (threshold when a hot_threshold knob is given: the ablation)
    Variant("npumoe", "+ load-aware residency: the resident groups that give the shortest modeled layer-chunk, "
            "the NPU queue overlapping the CPU's cold experts, the rest on the CPU (full NPUMoE)",
            "npu", "plan", dict(capacity_rule="tiered")),
    Variant("npumoe-spill", "NPUMoE, but overflow assignments are computed on the CPU instead of dropped", "npu",
            "plan", dict(capacity_rule="tiered"), spill=True),
]}
ABLATION = ("npumoe-base", "npumoe-t", "npumoe-tg", "npumoe")
PAPER_ABLATION_SPEEDUP = {"npumoe-base": 1.00, "npumoe-t": 1.48, "npumoe-tg": 2.11, "npumoe": 2.89}  # PAPER.md 5.5


def get_variant(name: str) -> Variant:
    if name not in VARIANTS:
        raise NpuMoeError(f"unknown variant {name!r}; valid variants: {', '.join(VARIANTS)}")
    return VARIANTS[name]


def parse_variants(spec: str | list[str]) -> list[Variant]:
    """'npumoe,anemll' or 'all' -> variants (each validated)."""
    names = spec if isinstance(spec, (list, tuple)) else [s.strip() for s in spec.split(",") if s.strip()]
    if names == ["all"]:
        names = list(VARIANTS)
    if not names:
        raise NpuMoeError(f"no variant given; valid variants: {', '.join(VARIANTS)}")
    return [get_variant(n) for n in names]
