"""The plan knobs, defined once: a validated dataclass (after MegaBlocks' `Arguments`) from which `build_plan`'s
defaults, the CLI flags of `plan`, `run` and `simulate`, and the sweep keys they accept are all generated."""
from __future__ import annotations

import math
from dataclasses import dataclass, field, fields, replace

from npumoe_lab.errors import NpuMoeError
from npumoe_lab.core.saliency_rules import SALIENCY_RULES
from npumoe_lab.planning.choices import CAPACITY_RULES, ORDERS, RESIDENCY_MODES

PROGRAM_BUDGET_OFF = "off"       # npu_program_budget: no program budget (the unbounded plan, kept for comparison)


def knob(default, help: str, choices=None, minimum=None):
    return field(default=default, metadata={"help": help, "choices": choices, "minimum": minimum})


@dataclass(frozen=True)
class PlanKnobs:
    tiers: int = knob(3, "number of static capacity tiers", minimum=1)
    percentile: float = knob(90, "per-chunk load percentile a tier's capacity covers (0-100]", minimum=0)
    align: int = knob(8, "capacities rounded up to a multiple of this", minimum=1)
    min_capacity: int = knob(8, "smallest capacity of any expert", minimum=1)
    capacity_rule: str = knob("tiered", "how capacities are chosen", CAPACITY_RULES)
    multipliers: tuple | None = knob(None, "tier multipliers relative to the base tier, e.g. 4,2,1")
    top_fraction: float = knob(0.25, "share of experts in the top tier bucket", minimum=0)
    uniform_slack: int = knob(16, "slack over T*k/E of the uniform rule", minimum=0)
    group_size: int = knob(8, "experts per static group (one NPU graph each)", minimum=1)
    order: str = knob("popularity", "how experts are ordered into groups", ORDERS)
    strict: bool = knob(False, "error when the group size exceeds a tier")
    residency: str | None = knob(None, "which groups stay on the NPU (default: makespan, or threshold "
                                       "when hot_threshold is given or there is no platform; cost: the old "
                                       "group-by-group rule)", RESIDENCY_MODES)
    hot_threshold: float | None = knob(None, "expected tokens per chunk for a resident group (threshold rule; "
                                             "default chunk*top_k/n_experts)", minimum=0)
    npu_memory_budget_bytes: int | None = knob(None, "bytes of expert weights allowed on the NPU", minimum=0)
    npu_program_budget: int | str | None = knob(None, "resident expert-group programs allowed on the NPU over all "
                                                      "layers (default: what the platform's max_resident_programs "
                                                      "and max_compiles leave after the NPU attention graphs; 'off': "
                                                      "unbounded, for comparison)", minimum=0)
    saliency: str = knob("weight_x_norm", "which overflow assignments are kept", SALIENCY_RULES)
    renormalize: bool = knob(False, "renormalise the kept top-k weights after drops")
    dtype_bytes: int = knob(2, "bytes per weight element on the NPU (graph size limits)", minimum=1)

    def __post_init__(self):
        for f in fields(self):
            v, meta = getattr(self, f.name), f.metadata
            if v is None:
                if f.default is not None:   # a knob whose default is None may be None (resolved by build_plan)
                    raise NpuMoeError(f"plan knob {f.name} cannot be None; give a value or leave the default "
                                      f"{f.default!r}")
                continue
            if f.name == "npu_program_budget" and v == PROGRAM_BUDGET_OFF:
                continue
            if meta["choices"] and v not in meta["choices"]:
                raise NpuMoeError(f"plan knob {f.name}={v!r} is not one of {', '.join(meta['choices'])}")
            if meta["minimum"] is not None and (isinstance(v, bool) or not isinstance(v, (int, float))
                                                or not math.isfinite(v) or v < meta["minimum"]):
                raise NpuMoeError(f"plan knob {f.name}={v!r} must be a number >= {meta['minimum']}")
        b = self.npu_program_budget
        if b is not None and b != PROGRAM_BUDGET_OFF and (isinstance(b, float) and not b.is_integer()):
            raise NpuMoeError(f"plan knob npu_program_budget={b!r}: give a whole number of programs, or 'off'")
        if not 0 < self.percentile <= 100:
            raise NpuMoeError(f"plan knob percentile={self.percentile} must be in (0, 100]")
        if self.multipliers is not None:
            object.__setattr__(self, "multipliers", tuple(float(m) for m in self.multipliers))

    @staticmethod
    def names() -> tuple[str, ...]:
        return tuple(f.name for f in fields(PlanKnobs))

    @staticmethod
    def check_names(names, where: str = "plan knob") -> None:
        unknown = sorted(set(names) - set(PlanKnobs.names()))
        if unknown:
            raise NpuMoeError(f"unknown {where}(s) {unknown}; valid: {', '.join(PlanKnobs.names())}")

    @staticmethod
    def of(knobs=None, **overrides) -> "PlanKnobs":
        """The one way knobs enter a plan: `knobs` (a PlanKnobs, a dict of knob values such as a plan's `.knobs`,
        or None: the defaults) with `overrides` on top; unknown names are an error, values are checked here."""
        if isinstance(knobs, PlanKnobs):
            PlanKnobs.check_names(overrides)
            return replace(knobs, **overrides) if overrides else knobs
        given = {**(knobs or {}), **overrides}
        PlanKnobs.check_names(given)
        return PlanKnobs(**given)

    @staticmethod
    def given(values: dict) -> dict:
        """The knobs a caller set (a None value = not given: the plan's or the variant's own default decides)."""
        PlanKnobs.check_names(values)
        return {n: v for n, v in values.items() if v is not None}

    def as_dict(self) -> dict:
        return {f.name: (list(v) if isinstance(v := getattr(self, f.name), tuple) else v) for f in fields(self)}


__all__ = ["PlanKnobs", "PROGRAM_BUDGET_OFF"]
