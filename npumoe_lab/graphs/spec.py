"""What graphs a plan needs: one per resident (layer, group) with its capacity tiers as functions of one package
(multifunction: tiers share weights, ANCHORS 3.4), plus one attention package per layer with one function per
chunk length. Specs are plain data; builders (coreml.py, onnx.py) turn them into artifacts."""
from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from npumoe_lab.errors import NpuMoeError

# ANE tensor-axis limits, right-aligned N D C H W: "N[1-65536] D[1-16384] C[1-65536] H[1-16384] W[1-16384]"
# (ANCHORS 3.8). The 16384 entries come from the platform profile (npu.max_dim).
CHANNEL_LIMIT = 65536
DEFAULT_GRAPH_LIMIT_BYTES = 1_000_000_000  # iOS caps a model file at 1 GB; 1.2 GB fell back to CPU (ANCHORS 3.8)
DEFAULT_MAX_DIM = 16384


@dataclass(frozen=True)
class Limits:
    graph_limit_bytes: int = DEFAULT_GRAPH_LIMIT_BYTES
    max_dim: int = DEFAULT_MAX_DIM
    source: str = "defaults (ANCHORS 3.8)"

    def axis_limits(self, rank: int) -> list[int]:
        right_aligned = [self.max_dim, self.max_dim, CHANNEL_LIMIT, self.max_dim, CHANNEL_LIMIT]  # W H C D N
        return [right_aligned[rank - 1 - i] if rank - 1 - i < 5 else 1 for i in range(rank)]

    @classmethod
    def of(cls, platform=None) -> "Limits":
        """From a platform profile object (`.npu.graph_limit_bytes`, `.npu.max_dim`), a profile name, or None."""
        if platform is None or isinstance(platform, Limits):
            return platform or cls()
        from npumoe_lab.devices import as_platform  # noqa: PLC0415  (the platform registry is optional here)
        platform = as_platform(platform)
        npu = platform.npu
        num = lambda v: float(getattr(v, "value", v))  # noqa: E731  (profile params may be {value, unit, ...})
        return cls(int(num(npu.graph_limit_bytes)), int(num(npu.max_dim)), getattr(platform, "name", "platform"))


@dataclass(frozen=True)
class GroupGraphSpec:
    layer: int
    group: int
    experts: tuple[int, ...]
    capacities: tuple[int, ...]          # the first is the plan's capacity (default function)
    hidden: int
    intermediate: int
    act: str = "swiglu"
    has_bias: bool = False
    decode: bool = False                 # a decode-shaped graph of the group (`npu-decode`): its own program

    @property
    def name(self) -> str:
        return f"L{self.layer}_g{self.group}" + ("_decode" if self.decode else "")

    def weight_bytes(self, itemsize: int = 2) -> int:
        g, h, i = len(self.experts), self.hidden, self.intermediate
        return itemsize * (g * 3 * h * i + (g * (2 * i + h) if self.has_bias else 0))


@dataclass(frozen=True)
class AttentionGraphSpec:
    layer: int
    chunks: tuple[int, ...]
    context: int
    kv: str = "state"

    @property
    def name(self) -> str:
        return f"L{self.layer}_attn"


def subset(weights, experts):
    """ExpertWeights of the group's experts, stacked in group order (checks the plan matches the model)."""
    n = weights.n_experts
    if not experts or min(experts) < 0 or max(experts) >= n:
        raise NpuMoeError(f"group experts {list(experts)} are not all in 0..{n - 1}; the plan does not match the model")
    return weights.select(list(experts))


def canonical(w):
    """(w_gate [G,H,I], w_up, w_down [G,I,H], b_gate, b_up, b_down) of an ExpertWeights (its down is `down`)."""
    down = getattr(w, "w_down", None)
    return w.w_gate, w.w_up, (w.down if down is None else down), w.b_gate, w.b_up, w.b_down


def field_of(obj, key, default=None):
    return obj.get(key, default) if isinstance(obj, dict) else getattr(obj, key, default)


def group_specs(plan, *, all_tiers: bool = False, limits: Limits | None = None, weights: dict | None = None
                ) -> list[GroupGraphSpec]:
    """One spec per resident group of `plan` (a Plan or its JSON dict). all_tiers: also give each group the
    layer's smaller tier capacities as extra functions. weights {layer: ExpertWeights} (optional) supplies the
    activation, biases, and sizes a plan layer lacks. Raises for a group over the graph-size limit."""
    limits, weights = limits or Limits(), weights or {}
    specs = []
    for layer in field_of(plan, "layers", []):
        lid = int(field_of(layer, "layer"))
        w = weights.get(lid)
        hidden = field_of(layer, "hidden", w.hidden if w is not None else None)
        inter = field_of(layer, "intermediate", w.intermediate if w is not None else None)
        act = w.act if w is not None else "swiglu"
        has_bias = w is not None and any(b is not None for b in canonical(w)[3:])
        if hidden is None or inter is None:
            raise NpuMoeError(f"plan layer {lid} has no hidden/intermediate sizes; pass the model (--model) or "
                              "rebuild the plan with this version")
        if w is not None and (int(hidden), int(inter)) != (w.hidden, w.intermediate):
            raise NpuMoeError(f"plan layer {lid} is for hidden {hidden} / intermediate {inter} but the model has "
                              f"{w.hidden} / {w.intermediate}; use the plan built for this model")
        tiers = sorted({int(c) for c in (field_of(layer, "tier_capacities") or [])}, reverse=True)
        for grp in field_of(layer, "groups", []):
            if not field_of(grp, "resident", False):
                continue
            cap = int(field_of(grp, "capacity"))
            caps = [cap] + ([c for c in tiers if c < cap] if all_tiers else [])
            spec = GroupGraphSpec(int(lid), int(field_of(grp, "id")), tuple(int(e) for e in field_of(grp, "experts")),
                                  tuple(caps), int(hidden), int(inter), act, has_bias)
            check_group(spec, limits)
            specs.append(spec)
    return specs


def decode_group_specs(plan, step_tokens: int = 1, *, limits: Limits | None = None, weights: dict | None = None
                       ) -> list[GroupGraphSpec]:
    """The `npu-decode` policy's graphs: one per resident group at capacity = the step's tokens (nothing drops;
    execution.decode_policy.decode_layout), separate programs from the prefill's (decode_programs counts them)."""
    if isinstance(step_tokens, bool) or not isinstance(step_tokens, int) or step_tokens < 1:
        raise NpuMoeError(f"--decode-batch {step_tokens!r}: give the tokens of one decode step, a whole number >= 1")
    limits = limits or Limits()
    specs = [replace(s, capacities=(step_tokens,), decode=True)
             for s in group_specs(plan, limits=limits, weights=weights)]
    for spec in specs:
        check_group(spec, limits)
    return specs


def check_group(spec: GroupGraphSpec, limits: Limits) -> None:
    """Static checks before building: graph size and axis limits (names the group and by how much)."""
    size = spec.weight_bytes()
    if size > limits.graph_limit_bytes:
        over = size - limits.graph_limit_bytes
        raise NpuMoeError(f"group (layer {spec.layer}, group {spec.group}) has {size:,} B of fp16 weights, "
                          f"{over:,} B ({over / limits.graph_limit_bytes:.1%}) over the graph limit "
                          f"{limits.graph_limit_bytes:,} B of {limits.source}; split it into smaller groups")
    g, big = len(spec.experts), max(spec.capacities)
    if g * max(spec.hidden, spec.intermediate) > CHANNEL_LIMIT or max(big, spec.hidden, spec.intermediate) > limits.max_dim:
        raise NpuMoeError(f"group (layer {spec.layer}, group {spec.group}): {g} experts x {max(spec.hidden, spec.intermediate)} "
                          f"channels or capacity {big} exceed the NPU axis limits (channels <= {CHANNEL_LIMIT}, "
                          f"other axes <= {limits.max_dim}); use smaller groups or capacities")


def plan_chunks(plan) -> tuple[int, ...]:
    chunk = field_of(plan, "chunk")
    chunks = chunk if isinstance(chunk, (list, tuple)) else [chunk]
    if not chunks or any(c is None or int(c) <= 0 for c in chunks):
        raise NpuMoeError(f"plan chunk {chunk!r} is not a positive chunk length; rebuild the plan with --chunk")
    return tuple(sorted({int(c) for c in chunks}))


def example_group_input(spec: GroupGraphSpec, capacity: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return rng.standard_normal((len(spec.experts), capacity, spec.hidden)).astype(np.float32)
