"""The plan: per MoE layer, each expert's static capacity and tier, the groups, and which groups stay on the NPU.
Built from a CalibrationProfile (`build_plan`), stored as versioned, hashed JSON (DESIGN.md "Planning").

Variants (variants.py) are plans built with forced knobs: `variant_plan(profile, "npumoe-tg", **plan.build_kwargs())`
rebuilds any variant from the same profile and knobs (npumoe-base: uniform capacity, G=1, all resident;
npumoe-t: tiers, G=1, all resident; npumoe-tg: tiers + groups, all resident; npumoe: + residency;
naive-npu: max observed capacity per expert, G=1, all resident). With a platform, npumoe's residency is
the `makespan` rule, so the same variant name gives different plans on different platforms (rows say it:
n_npu_groups, n_cpu_groups, npu_expert_flop_share).
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace

import numpy as np

from npumoe_lab.planning.profile import CalibrationProfile
from npumoe_lab.devices import as_platform
from npumoe_lab.errors import NpuMoeError
from npumoe_lab.planning.grouping import make_groups_with_notes
from npumoe_lab.planning.knobs import PlanKnobs
from npumoe_lab.planning.layout import ExecutionLayout, LayerLayout, check_model
from npumoe_lab.models import describe, model_fingerprint
from npumoe_lab.planning.makespan import LayerCase, LayerMakespan, fit_program_budget
from npumoe_lab.planning.plan_json import LayerPieces, plan_digest
from npumoe_lab.planning.residency import assign_residency, fit_budget, program_budget
from npumoe_lab.core.saliency_rules import check_rule
from npumoe_lab.planning.tiers import (assign_tiers, expected_drop_rate, expected_kept_tokens, expected_padding,
                                      percentile_need)
from npumoe_lab.utils import sha256_json
from npumoe_lab.planning.variants import get_variant

PLAN_VERSION = 1


@dataclass
class Plan:
    model_fingerprint: str
    chunk: int
    saliency: str
    renormalize: bool
    platform: str | None
    knobs: dict
    layers: list[dict]
    calibration: dict = field(default_factory=dict)   # where the counts came from (workload, tokens, created)
    limits: dict = field(default_factory=dict)        # the NPU program budget it was searched under, and why
    version: int = PLAN_VERSION
    hash: str = ""

    def __post_init__(self):
        if self.version != PLAN_VERSION:
            raise NpuMoeError(f"plan version {self.version} is not supported (this workbench reads version "
                              f"{PLAN_VERSION}); rebuild the plan with `npumoe-lab plan`")
        check_rule(self.saliency)
        for lp in self.layers:
            _check_layer(lp)
        digest = sha256_json(self._body())
        if self.hash and self.hash != digest:
            raise NpuMoeError(f"plan hash {self.hash[:12]} does not match its content ({digest[:12]}): the file was "
                              "edited; rebuild it with `npumoe-lab plan` instead of editing")
        self.hash = digest

    def _body(self) -> dict:
        return {"version": self.version, "model_fingerprint": self.model_fingerprint, "chunk": self.chunk,
                "saliency": self.saliency, "renormalize": self.renormalize, "platform": self.platform,
                "knobs": self.knobs, "calibration": self.calibration, "layers": self.layers,
                **({"limits": self.limits} if self.limits else {})}     # absent: the hashes of older plans hold

    def to_dict(self) -> dict:
        return {**self._body(), "hash": self.hash}

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=1, sort_keys=True)

    def save(self, path) -> Path:
        p = Path(path)
        p.parent.mkdir(parents=True, exist_ok=True)
        tmp = p.with_suffix(p.suffix + ".tmp")
        tmp.write_text(self.to_json())
        tmp.replace(p)
        return p

    @classmethod
    def from_dict(cls, d: dict) -> "Plan":
        keys = ("model_fingerprint", "chunk", "saliency", "renormalize", "platform", "knobs", "layers")
        missing = [k for k in keys if k not in d]
        if missing:
            raise NpuMoeError(f"plan lacks {missing}; it is not a plan file, build one with `npumoe-lab plan`")
        return cls(**{k: d[k] for k in (*keys, "calibration", "limits", "version", "hash") if k in d})

    @classmethod
    def _built(cls, layer_texts: list[str], **fields) -> "Plan":
        """build_plan's plan: each layer was checked when its JSON pieces were made (`_StaticLayer.pieces`) and
        the hash is taken from the layers' texts (plan_json.py: the same digest as the whole body's)."""
        plan = cls.__new__(cls)
        plan.__dict__.update(version=PLAN_VERSION, **fields)
        check_rule(plan.saliency)
        plan.hash = plan_digest({k: v for k, v in plan._body().items() if k != "layers"}, layer_texts)
        return plan

    @classmethod
    def load(cls, path, model=None) -> "Plan":
        p = Path(path)
        if not p.is_file():
            raise NpuMoeError(f"no plan at {p}; build one with `npumoe-lab plan --profile DIR --out {p}`")
        try:
            d = json.loads(p.read_text())
        except json.JSONDecodeError as exc:
            raise NpuMoeError(f"{p} is not valid JSON ({exc}); rebuild the plan") from exc
        plan = cls.from_dict(d)
        if model is not None:
            plan.check_model(model)
        return plan

    def check_model(self, model_or_fingerprint) -> None:
        fp = model_or_fingerprint if isinstance(model_or_fingerprint, str) else _fingerprint(model_or_fingerprint)
        planned = self.calibration.get("dtype")
        have = None if isinstance(model_or_fingerprint, str) else _dtype_of(model_or_fingerprint)
        hint = (f" (calibrated in {planned}, this model is loaded in {have}: an fp16 load of an fp32/bf16 "
                "checkpoint rounds its weights differently; load it in fp32 or bf16)"
                if planned and have == "fp16" and planned != have else "")
        check_model(self.model_fingerprint, fp, hint)

    def build_kwargs(self) -> dict:
        """The build_plan keyword arguments this plan was built with (for variant_plan / rebuilding)."""
        return {**self.knobs, "saliency": self.saliency, "renormalize": self.renormalize, "platform": self.platform}

    def compile(self):
        """The frozen execution layout the engine consumes (layout.ExecutionLayout)."""
        return ExecutionLayout.from_plan(self)

    # -- lookups for the engine and reports --------------------------------------------------------------
    def layer_plan(self, layer: int) -> dict:
        for lp in self.layers:
            if lp["layer"] == layer:
                return lp
        raise NpuMoeError(f"layer {layer} is not in the plan; its layers are {[lp['layer'] for lp in self.layers]}")

    def resident_mask(self, layer: int) -> np.ndarray:
        """[E] bool: the expert runs on the NPU."""
        lp = self.layer_plan(layer)
        out = np.zeros(lp["n_experts"], dtype=bool)
        for g in lp["groups"]:
            out[g["experts"]] = g["resident"]
        return out

    def summary(self) -> str:
        k = self.knobs
        head = (f"plan {self.hash[:12]}  model {self.model_fingerprint[:12]}  chunk {self.chunk}  saliency "
                f"{self.saliency}{' (renormalized)' if self.renormalize else ''}  platform {self.platform}\n"
                f"knobs: {', '.join(f'{n}={v}' for n, v in sorted(k.items()))}\n")
        rows = [("layer", "tier capacities", "experts/tier", "groups (sizes)", "resident", "NPU tokens", "pad",
                 "drop")]
        for lp in self.layers:
            gs = lp["groups"]
            res = [g for g in gs if g["resident"]]
            tok = sum(g["expected_tokens"] for g in gs)
            rows.append((str(lp["layer"]), "/".join(map(str, lp["tier_capacities"])),
                         "/".join(str(lp["tier"].count(t)) for t in range(len(lp["tier_capacities"]))),
                         f"{len(gs)} ({','.join(str(len(g['experts'])) for g in gs)})",
                         f"{len(res)}/{len(gs)} ({sum(len(g['experts']) for g in res)} exp)",
                         f"{sum(g['expected_tokens'] for g in res) / tok:.0%}" if tok else "-",
                         _pct(lp.get("expected_padding")), _pct(lp.get("expected_drop_rate"))))
        widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
        table = "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows)
        notes = [f"layer {lp['layer']}: {n}" for lp in self.layers for n in lp.get("notes", [])]
        return head + table + ("\nnotes:\n  " + "\n  ".join(notes) if notes else "") + \
            "\n(pad/drop: expected on the calibration counts; NPU tokens: share of kept tokens in resident groups)"


def _pct(x) -> str:
    return "-" if x is None else f"{x:.1%}"


def _check_layer(lp: dict) -> None:
    """What a plan layer holds beyond its execution layout (whose own checks, every expert in exactly one group of
    capacity >= 1, run in layout.LayerLayout): per-expert capacities and tiers that agree with the groups."""
    name = f"plan layer {lp.get('layer')}"
    E, cap, tier, tc = lp["n_experts"], lp["capacity"], lp["tier"], lp["tier_capacities"]
    # a grid's plans repeat a layer's capacities and groups (only residency differs): their content checked once
    # (keyed where the tiers are ints: 1.0 == 1 would let a float tier, which cannot index, pass on a kept key)
    key = None
    if set(map(type, tier)) == {int}:
        try:
            key = (E, tuple(cap), tuple(tier), tuple(tc),
                   tuple((tuple(g["experts"]), g["capacity"]) for g in lp["groups"]))
        except TypeError:
            key = None
    if key is not None and key in _CHECKED:
        LayerLayout.from_plan_layer(lp)      # the layout's own checks (its residency may be new)
        return
    _check_layer_content(lp, name, E, cap, tier, tc)
    if key is not None:
        if len(_CHECKED) >= 8192:
            _CHECKED.clear()
        _CHECKED.add(key)


_CHECKED: set = set()        # content keys of plan layers that passed _check_layer_content


def _check_layer_content(lp, name, E, cap, tier, tc) -> None:
    if len(cap) != E or len(tier) != E:
        raise NpuMoeError(f"{name}: capacity and tier need {E} entries, got {len(cap)} and {len(tier)}")
    if any(cap[e] != tc[tier[e]] for e in range(E)):
        raise NpuMoeError(f"{name}: an expert's capacity differs from its tier's capacity")
    LayerLayout.from_plan_layer(lp)
    for g in lp["groups"]:
        if any(cap[e] != g["capacity"] for e in g["experts"]):
            raise NpuMoeError(f"{name}: group {g['id']} holds experts of another capacity")


def _fingerprint(model) -> str:
    return model_fingerprint(model)


def _specs(profile, model_or_specs) -> list:
    if model_or_specs is None:
        if not profile.meta.get("layers"):
            raise NpuMoeError("the profile stores no layer specs; pass the model or describe(model)")
        return [SimpleNamespace(**d) for d in profile.meta["layers"]]
    if isinstance(model_or_specs, (list, tuple)):
        return list(model_or_specs)
    fp = _fingerprint(model_or_specs)
    if fp != profile.meta["model_fingerprint"]:
        raise NpuMoeError(f"the calibration profile is of model {profile.meta['model_fingerprint'][:12]} but this "
                          f"model is {fp[:12]}: other weights (the fingerprint does not depend on the dtype); calibrate this model "
                          "first (npumoe-lab calibrate)")
    return describe(model_or_specs)


def _residency_rule(k: PlanKnobs, platform) -> str:
    """The residency rule a plan uses: the knob's, else "makespan", or "threshold" with a hot_threshold or no
    platform."""
    if k.residency is None:
        return "threshold" if k.hot_threshold is not None or platform is None else "makespan"
    if k.residency in ("cost", "makespan") and k.hot_threshold is not None:
        raise NpuMoeError(f"hot_threshold={k.hot_threshold} applies to residency 'threshold' only; pass "
                          f"residency='threshold' with it, or drop it for the {k.residency} rule")
    return k.residency


def _memo(profile, key, make):
    """`make()` once per calibration profile and key (the profile's counts are what every part is computed from)."""
    memo = profile.__dict__.setdefault("_plan_parts", {})
    if key not in memo:
        if len(memo) >= 4096:          # a long sweep over knobs on one profile: keep memory bounded
            memo.clear()
        memo[key] = make()
    return memo[key]


def _tiers(counts, chunk, spec, k, need=None):
    assign = assign_tiers(counts, chunk, spec.top_k, spec.n_experts, tiers=k.tiers, percentile=k.percentile,
                          align=k.align, min_capacity=k.min_capacity, multipliers=k.multipliers, rule=k.capacity_rule,
                          uniform_slack=k.uniform_slack, top_fraction=k.top_fraction, need=need)
    return assign, expected_kept_tokens(assign, counts)


def _shape(spec) -> tuple:
    return spec.layer, spec.n_experts, spec.top_k, spec.hidden, spec.intermediate


@dataclass
class _StaticLayer:
    """A plan layer but its residency: what every plan of these counts and knobs shares (read only)."""
    spec: object
    counts: np.ndarray          # [E, chunks] routed per expert and calibration chunk (never-routed experts padded)
    groups: list
    notes: tuple
    loads: list                 # expected routed tokens per chunk of each group (the CPU's load)
    entry: dict                 # the layer's JSON content but residency
    _pieces: LayerPieces | None = None
    # LayerMakespan's platform-free parts (loads, rows, candidate sets): filled by the first plan's model
    makespan_parts: dict = field(default_factory=dict)

    def pieces(self, lp: dict) -> LayerPieces:
        """The layer's JSON pieces, made from the first plan layer built on it (`lp`), which is checked then, as
        Plan's own construction checks a loaded one; kept for the plans after it (they differ in residency)."""
        if self._pieces is None:
            _check_layer(lp)
            self._pieces = LayerPieces(lp)
        return self._pieces


def _static_layer(profile, spec, k, tier_args, group_args, weight_size, limit, max_dim) -> _StaticLayer:
    """One layer's _StaticLayer; its parts (percentile need, tiers, groups) also kept one by one, so plans that
    share only some knobs (group sizes over the same tiers) share those."""
    if spec.layer not in profile.layers:
        raise NpuMoeError(f"MoE layer {spec.layer} is not in the calibration profile (layers {profile.layers}); "
                          "calibrate this model")
    counts = profile.count_matrix(spec.layer)
    if counts.shape[0] > spec.n_experts:
        raise NpuMoeError(f"layer {spec.layer}: the profile has {counts.shape[0]} experts, the model "
                          f"{spec.n_experts}; calibrate this model")
    counts = np.pad(counts, ((0, spec.n_experts - counts.shape[0]), (0, 0))) if counts.shape[0] < \
        spec.n_experts else counts.copy()        # never-routed experts (np.pad's own copy where none is missing)
    shape = _shape(spec)
    # the percentile need (a sort per expert) is the same for every tier count: kept apart from the tiers
    need = (_memo(profile, ("need", shape, k.percentile), lambda: percentile_need(counts, k.percentile))
            if k.capacity_rule in ("tiered", "optimal") else None)
    assign, kept = _memo(profile, ("tiers", shape, tier_args), lambda: _tiers(counts, profile.chunk, spec, k, need))
    groups, notes = _memo(profile, ("groups", shape, tier_args, group_args), lambda: make_groups_with_notes(
        assign.tier, assign.capacity, kept, k.group_size, k.order,
        profile.coactivation_matrix(spec.layer) if k.order == "coactivation" else None, hidden=spec.hidden,
        intermediate=spec.intermediate, dtype_bytes=weight_size, graph_limit_bytes=limit, max_dim=max_dim,
        strict=k.strict))
    # expected routed tokens per chunk per expert (the CPU's load), as Python floats: the same sums, without a
    # NumPy scalar per expert
    routed_ = _memo(profile, ("routed", shape), lambda: counts.mean(axis=1).tolist())
    loads = [float(routed_[g.experts[0]]) if len(g.experts) == 1 else float(sum(routed_[e] for e in g.experts))
             for g in groups]             # one expert: its load (0 + x is x: loads are never -0.0)
    entry = dict(capacity=assign.capacity.tolist(), tier=assign.tier.tolist(),
                 tier_capacities=list(assign.tier_capacities),
                 groups=[g.to_dict() | {"expected_tokens": round(g.expected_tokens, 4)} for g in groups],
                 expected_padding=round(expected_padding(assign, counts), 6),
                 expected_drop_rate=round(expected_drop_rate(assign, counts), 6))
    return _StaticLayer(spec, counts, groups, tuple(notes), loads, entry)


def build_plan(profile, model_or_specs=None, platform="m2-max", knobs: PlanKnobs | dict | None = None,
               npu_attention_graphs: int | None = None, **overrides) -> Plan:
    """Plan for every calibrated MoE layer. `profile`: a CalibrationProfile or its directory. `model_or_specs`:
    the model (its fingerprint must match the profile's), a list of MoELayerSpec, or None (specs stored in the
    profile). `platform` (a Platform, or a name resolved here) gives the graph limits and the cost model; None = no
    device limits and no cost model. `knobs`: a `knobs.PlanKnobs` (or a dict of knob values; None: the defaults),
    `overrides` single knobs on top (tiers=3, percentile=90, group_size=8, ...: defaults and checks live in
    PlanKnobs). `residency=None`: "makespan" (the resident set with the shortest modeled layer-chunk, NPU and
    CPU queues overlapping; "cost" is the old group-by-group rule), or "threshold"
    when a hot_threshold is given (the ablation knob) or there is no platform; `hot_threshold=None` in threshold
    mode = one balanced expert's load, chunk * top_k / n_experts. The graph byte budget counts the NPU's stored
    weight size (platform npu.weight_bytes, e.g. 1 for int8), else dtype_bytes. The NPU program budget
    (residency.program_budget; knob npu_program_budget, default the platform's limits) reserves
    `npu_attention_graphs` programs for attention (None: one per MoE layer, NPUMoE's attention on the NPU)."""
    if not isinstance(profile, CalibrationProfile):
        profile = CalibrationProfile.load(profile)
    k = PlanKnobs.of(knobs, **overrides)
    specs, plat = _specs(profile, model_or_specs), as_platform(platform)
    residency = _residency_rule(k, plat)
    budget_, limits = program_budget(k.npu_program_budget, plat, residency,
                                             len(specs) if npu_attention_graphs is None else npu_attention_graphs)
    npu = getattr(plat, "npu", None)
    limit = getattr(npu, "graph_limit_bytes", None)
    max_dim = getattr(npu, "max_dim", None)
    weight_size = getattr(npu, "weight_bytes", None) or k.dtype_bytes    # what the NPU graph stores per weight
    layers, all_groups, flags, budgeted = [], [], [], []
    estimates = None
    if residency == "cost":     # the devices' FFN estimates by shape, kept for equal devices (hashed once a plan)
        try:
            estimates = _memo(profile, ("estimates", plat.npu, plat.cpu), dict)
        except (AttributeError, TypeError):       # a stand-in platform: estimates kept for this plan only
            estimates = {}
    tier_args = (k.tiers, k.percentile, k.align, k.min_capacity, repr(k.multipliers), k.capacity_rule,
                 k.uniform_slack, k.top_fraction)
    group_args = (k.group_size, k.order, weight_size, limit, max_dim, k.strict)
    # what a layer holds but its residency depends on the counts and these knobs only: plans of several variants
    # and platforms from one profile (a simulation's grid, a sweep cell) share it, looked up once a plan
    statics = _memo(profile, ("layers", tuple(_shape(s) for s in specs), tier_args, group_args),
                    lambda: [_static_layer(profile, spec, k, tier_args, group_args, weight_size, limit, max_dim)
                             for spec in specs])
    for st in statics:
        spec, groups, counts = st.spec, st.groups, st.counts
        thr = k.hot_threshold
        if residency == "threshold" and thr is None:
            thr = profile.chunk * spec.top_k / spec.n_experts
        model = None
        if budget_ is not None and groups and residency == "makespan":     # one model: search, then budget
            model = LayerMakespan(LayerCase([(g.experts, g.capacity) for g in groups], counts, spec.hidden,
                                            spec.intermediate, spec.top_k, profile.chunk, k.dtype_bytes,
                                            weight_size), plat, st.makespan_parts)
        layer_flags = assign_residency(groups, residency, thr, plat, spec, None, k.dtype_bytes, loads=st.loads,
                                       counts=counts, chunk=profile.chunk, npu_weight_bytes=weight_size,
                                       makespan_model=model, estimates=estimates)
        if model is not None:
            budgeted.append((model, layer_flags))
        flags += layer_flags
        all_groups += groups
        static = st.entry
        layers.append({"layer": spec.layer, "n_experts": spec.n_experts, "top_k": spec.top_k, "hidden": spec.hidden,
                       "intermediate": spec.intermediate, "capacity": list(static["capacity"]),
                       "tier": list(static["tier"]), "tier_capacities": list(static["tier_capacities"]),
                       "groups": static["groups"],          # replaced by this plan's own dicts below
                       "expected_padding": static["expected_padding"],
                       "expected_drop_rate": static["expected_drop_rate"], "hot_threshold": thr,
                       "notes": list(st.notes)})
    unbounded = list(flags)
    if budget_ is not None and residency == "makespan":   # one budget over all layers, least makespan lost
        flags = [f for layer in fit_program_budget(budgeted, budget_) for f in layer]
    elif budget_ is not None:        # other rules: the groups expecting the most tokens keep their program
        keep = set(sorted((i for i, f in enumerate(flags) if f),
                          key=lambda i: (-all_groups[i].expected_tokens, i))[:budget_])
        flags = [i in keep for i in range(len(flags))]
    if limits:
        limits = {**limits, "resident_groups_unbounded": int(sum(unbounded))}
    flags = fit_budget(all_groups, flags, k.npu_memory_budget_bytes)       # one budget over all layers
    texts, at = [], 0
    for lp, st in zip(layers, statics):     # each plan's own group dicts; the expert lists are shared, read only
        resident = [bool(f) for f in flags[at:at + len(lp["groups"])]]
        at += len(resident)
        lp["groups"] = [dict(g, resident=r) for g, r in zip(lp["groups"], resident)]
        texts.append(st.pieces(lp).text(resident, lp["hot_threshold"]))
    meta = profile.meta
    stored = {n: v for n, v in k.as_dict().items() if n not in ("saliency", "renormalize")} | {"residency": residency}
    return Plan._built(texts, model_fingerprint=meta["model_fingerprint"], chunk=profile.chunk, saliency=k.saliency,
                       renormalize=bool(k.renormalize), platform=getattr(plat, "name", plat), knobs=stored,
                       layers=layers, limits=limits,
                       calibration={n: meta.get(n) for n in ("workload", "n_tokens", "n_chunks", "created", "model",
                                                             "dtype")})


def _dtype_of(model) -> str | None:
    params = getattr(model, "parameters", None)
    p = next(params(), None) if params else None
    return {"torch.float32": "fp32", "torch.bfloat16": "bf16", "torch.float16": "fp16"}.get(str(getattr(p, "dtype", "")))


def variant_plan(profile, variant: str, model_or_specs=None, platform="m2-max",
                 knobs: PlanKnobs | dict | None = None, **overrides) -> Plan:
    """The plan of a variant (variants.py): `knobs` (a PlanKnobs, or a dict such as a plan's .knobs) and
    `overrides` with the variant's forced knobs on top. Raises for variants that run without a plan (reference,
    cpu-only, anemll)."""
    v = get_variant(variant)
    if v.experts != "plan":
        raise NpuMoeError(f"variant {variant!r} runs its experts without a plan ({v.experts}); nothing to build")
    return build_plan(profile, model_or_specs, platform, PlanKnobs.of(knobs, **{**overrides, **v.plan_overrides}),
                      npu_attention_graphs=None if v.attention == "npu" else 0)
