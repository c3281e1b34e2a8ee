"""The execution layout: the frozen, typed form of a plan that the engine consumes.

A `Plan` (plan.py) is the versioned JSON a researcher saves, edits knobs of and compares; `Plan.compile()` turns it
into an `ExecutionLayout`: per MoE layer the groups of experts with their static capacity and the device that runs
them, plus the saliency rule, renormalisation and the chunk the capacities were sized for. `ExecutionLayout.dropless`
builds the layout of the dynamic, dropless CPU path (cpu-only / anemll) from layer specs alone. The engine never
reads plan dicts: a misspelt key is an error here, not a silent default.
"""
from __future__ import annotations

from dataclasses import dataclass

from npumoe_lab.errors import NpuMoeError

DEVICES = ("npu", "cpu")


@dataclass(frozen=True)
class GroupLayout:
    """One static group: same-capacity experts run as one [G x C, H] graph on `device` (npu = resident). The
    engine places these in its buffer as they are (`core.packing.Layout.from_groups`)."""
    id: int
    experts: tuple[int, ...]
    capacity: int
    device: str
    tier: int | None = None             # the plan's capacity tier (None: a layout made without tiers)

    def __post_init__(self):
        if self.device not in DEVICES:
            raise NpuMoeError(f"group {self.id}: device {self.device!r} is unknown; use one of {DEVICES}")
        if self.capacity < 1 or not self.experts:
            raise NpuMoeError(f"group {self.id}: needs experts and a capacity >= 1, got {len(self.experts)} "
                              f"experts at capacity {self.capacity}")

    @property
    def resident(self) -> bool:
        return self.device == "npu"


@dataclass(frozen=True)
class LayerLayout:
    layer: int
    n_experts: int
    top_k: int
    hidden: int
    intermediate: int
    groups: tuple[GroupLayout, ...]

    def __post_init__(self):
        # the one check that groups partition the experts (a Plan is checked through this too, plan.py)
        seen = sorted(e for g in self.groups for e in g.experts)
        if seen != list(range(self.n_experts)):
            raise NpuMoeError(f"layout layer {self.layer}: groups must hold each of its {self.n_experts} experts "
                              "exactly once; rebuild the plan")

    @staticmethod
    def from_plan_layer(lp: dict) -> "LayerLayout":
        """The typed form of one layer of a Plan's JSON (`Plan.layers[i]`). Layouts are immutable and a grid's
        plans repeat layers and groups (a plan is checked, then compiled; platforms and variants share layers, and
        plans that differ in residency share most groups), so both are kept (bounded) by their content and
        returned again for the same content."""
        try:
            gkeys = tuple((g["id"], tuple(g["experts"]), g["capacity"], bool(g["resident"]), g.get("tier"))
                          for g in lp["groups"])
            key = (lp["layer"], lp["n_experts"], lp["top_k"], lp["hidden"], lp["intermediate"], gkeys)
            hit = _LAYOUTS.get(key)
        except TypeError:                  # unhashable content (a hand-edited plan): built, not kept
            return LayerLayout._from_plan_layer(lp)
        if hit is not None and all(type(g.tier) is type(k[4]) for g, k in zip(hit.groups, gkeys)):
            return hit
        built = LayerLayout(int(lp["layer"]), int(lp["n_experts"]), int(lp["top_k"]), int(lp["hidden"]),
                            int(lp["intermediate"]), tuple(_group(k) for k in gkeys))
        if len(_LAYOUTS) >= MAX_KEPT_LAYOUTS:
            _LAYOUTS.clear()
        _LAYOUTS[key] = built
        return built

    @staticmethod
    def _from_plan_layer(lp: dict) -> "LayerLayout":
        groups = tuple(GroupLayout(int(g["id"]), tuple(int(e) for e in g["experts"]), int(g["capacity"]),
                                   "npu" if g["resident"] else "cpu", g.get("tier")) for g in lp["groups"])
        return LayerLayout(int(lp["layer"]), int(lp["n_experts"]), int(lp["top_k"]), int(lp["hidden"]),
                           int(lp["intermediate"]), groups)

    @property
    def cold_experts(self) -> tuple[int, ...]:
        return tuple(sorted(e for g in self.groups if not g.resident for e in g.experts))


MAX_KEPT_LAYOUTS = 8192
MAX_KEPT_GROUPS = 65536
# content -> layout / group (from_plan_layer). A kept one serves a key only where the tiers (stored as given, not
# cast) have the same types: 1 == 1.0 hashes alike, so a lookup alone could hand back a tier of another type.
_LAYOUTS: dict = {}
_GROUPS: dict = {}


def _group(key: tuple) -> GroupLayout:
    """The GroupLayout of a plan group's (id, experts, capacity, resident, tier), kept by that content."""
    hit = _GROUPS.get(key)
    if hit is not None and type(hit.tier) is type(key[4]):
        return hit
    gid, experts, capacity, resident, tier = key
    built = GroupLayout(int(gid), tuple(map(int, experts)), int(capacity), "npu" if resident else "cpu", tier)
    if len(_GROUPS) >= MAX_KEPT_GROUPS:
        _GROUPS.clear()
    _GROUPS[key] = built
    return built


@dataclass(frozen=True)
class ExecutionLayout:
    layers: tuple[LayerLayout, ...]
    saliency: str
    renormalize: bool
    chunk: int | None                   # the chunk the capacities were sized for (None: any chunk, dropless)
    model_fingerprint: str | None       # the model the plan was calibrated on (None: any model of these specs)
    plan_hash: str | None = None

    def layer(self, layer: int) -> LayerLayout:
        index = self.__dict__.get("_index")
        if index is None:                 # built once: the engine asks for a layer on every call
            index = {lay.layer: lay for lay in self.layers}
            object.__setattr__(self, "_index", index)
        if layer in index:
            return index[layer]
        raise NpuMoeError(f"the plan has no entry for MoE layer {layer} (its layers: "
                          f"{[lay.layer for lay in self.layers]}): it was built for another model")

    def check_chunk(self, chunk: int) -> None:
        if self.chunk is not None and chunk != self.chunk:
            raise NpuMoeError(f"the plan's capacities were sized for prefill chunks of {self.chunk} tokens but the "
                              f"prefill uses {chunk}; prefill with chunk={self.chunk}, or calibrate and plan "
                              f"with --chunk {chunk}")

    def check_model(self, fingerprint: str) -> None:
        check_model(self.model_fingerprint, fingerprint)

    @staticmethod
    def build(specs, groups: dict, saliency: str = "weight_x_norm", renormalize: bool = False,
              chunk: int | None = None, model_fingerprint: str | None = None) -> "ExecutionLayout":
        """A layout made by hand (tests, bench): `groups[layer]` = [(experts, capacity, resident), ...] for each
        spec (anything with layer, n_experts, top_k, hidden, intermediate); group ids in list order."""
        layers = []
        for s in specs:
            if s.layer not in groups:
                raise NpuMoeError(f"no groups given for MoE layer {s.layer}; give groups for every layer of specs")
            gl = tuple(GroupLayout(i, tuple(int(e) for e in experts), int(cap), "npu" if resident else "cpu")
                       for i, (experts, cap, resident) in enumerate(groups[s.layer]))
            layers.append(LayerLayout(s.layer, s.n_experts, s.top_k, s.hidden, s.intermediate, gl))
        return ExecutionLayout(tuple(layers), saliency, renormalize, chunk, model_fingerprint)

    @staticmethod
    def dropless(specs) -> "ExecutionLayout":
        """Every expert cold, one per group: the dynamic dropless CPU path (each expert at its actual load)."""
        return ExecutionLayout(tuple(LayerLayout(s.layer, s.n_experts, s.top_k, s.hidden, s.intermediate,
                                                 tuple(GroupLayout(e, (e,), 1, "cpu") for e in range(s.n_experts)))
                                     for s in specs), "position", False, None, None)

    @staticmethod
    def from_plan(plan) -> "ExecutionLayout":
        return ExecutionLayout(tuple(LayerLayout.from_plan_layer(lp) for lp in plan.layers), plan.saliency,
                               bool(plan.renormalize), int(plan.chunk), plan.model_fingerprint, plan.hash)


def check_model(planned: str | None, fingerprint: str, hint: str = "") -> None:
    """The one model check of plans and layouts: `fingerprint` (the model's) must be the one planned for
    (None: a layout for any model of these specs)."""
    if planned is not None and fingerprint != planned:
        raise NpuMoeError(f"the plan was built for model {planned[:12]} but this model is {fingerprint[:12]}: other "
                          f"weights{hint} (the fingerprint does not depend on the dtype: fp32, bf16 and fp16 loads of one "
                          "checkpoint share it); calibrate and plan this model (npumoe-lab calibrate / plan)")


__all__ = ["ExecutionLayout", "LayerLayout", "GroupLayout", "check_model"]
