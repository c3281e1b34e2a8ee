"""The plan explorer: move a knob, see the plan and its modeled prefill (`explore(...)`, notebook 10_explorer).

`PlanLab` holds what does not change while knobs move (layer specs, geometry, calibration, the routing of one
prompt) and turns `Knobs` into an `Evaluation`: the npumoe plan built as `run`/`simulate` build it
(`plan.variant_plan`), timed on the prompt's routing as an op stream of arrays (`sim.stream.build_stream`, the
per-op replay's numbers: a test holds them equal; no numerics, modeled platform; the timeline panel's events are
rebuilt from the stream only when it is drawn), next to the baselines (cpu-only, anemll, naive-npu, npumoe-base at default knobs;
cached per platform and chunk). No model forward per knob move: that is what keeps an update well under a second.

Routing of the prompt: for a model, recorded in one dropless prefill per chunk size (cached; a plan that drops
would change later layers' routing a little: the real-numerics button runs the plan itself); for a geometry,
sampled from the routing source. Calibration at the profile's own chunk is the profile; at another chunk it is
sampled from the profile's per-expert popularity (said in `Evaluation.calibration`).
"""
from __future__ import annotations

import functools
import time
from dataclasses import dataclass, field, replace

from npumoe_lab.planning.profile import CalibrationProfile
from npumoe_lab.execution.engine import PlanExecutor
from npumoe_lab.devices import as_platform
from npumoe_lab.errors import NpuMoeError
from npumoe_lab.execution.calibrate import calibration_profile
from npumoe_lab.execution.experts import attach, detach
from npumoe_lab.execution.geometry import ModelGeometry
from npumoe_lab.results.metrics import logit_agreement
from npumoe_lab.results.store import knob_columns
from npumoe_lab.models import describe, load_model, model_fingerprint
from npumoe_lab.planning.knobs import PlanKnobs
from npumoe_lab.planning.plan import variant_plan
from npumoe_lab.execution.routing import RoutingRecorder
from npumoe_lab.execution.runtime import PrefillConfig, chunked_prefill, run_prefill
from npumoe_lab.sim.geometries import list_geometries, load_geometry
from npumoe_lab.sim.array_replay import stream_events, summarize_stream
from npumoe_lab.sim.routing import PopularityRouting, parse_routing
from npumoe_lab.sim.run import variant_executor
from npumoe_lab.sim.stream import build_stream, routing_counts
from npumoe_lab.sim.operating_point import check_operating_point, solve_percentile
from npumoe_lab.planning.variants import get_variant
from npumoe_lab.workloads import get_workload

BASELINES = ("cpu-only", "anemll", "naive-npu", "npumoe-base")
CHUNKS = (64, 128, 256, 512, 1024)


_DEFAULT = PlanKnobs()


@dataclass(frozen=True)
class Knobs:
    """The explorer's sliders: a thin view of `PlanKnobs` (the plan knobs it moves, defaults and checks PlanKnobs')
    plus where the plan is evaluated (platform, chunk) and the hot threshold in units of a balanced load."""
    tiers: int = _DEFAULT.tiers
    percentile: float = float(_DEFAULT.percentile)
    group_size: int = _DEFAULT.group_size
    residency: str = "makespan"      # the npumoe variant's default (the threshold rule reads hot_scale)
    hot_scale: float = 1.0           # hot threshold in units of one balanced expert's load (chunk * top_k / E)
    platform: str = "m2-max"
    chunk: int = 128

    def __post_init__(self):
        PlanKnobs(tiers=self.tiers, percentile=self.percentile, group_size=self.group_size, residency=self.residency)

    def plan_knobs(self, spec) -> PlanKnobs:
        """The PlanKnobs of this setting (the hot threshold from hot_scale and the layer's balanced load)."""
        thr = self.hot_scale * self.chunk * spec.top_k / spec.n_experts if self.residency == "threshold" else None
        return PlanKnobs(tiers=self.tiers, percentile=self.percentile, group_size=self.group_size,
                         residency=self.residency, hot_threshold=thr)


class StreamResult:
    """A simulated prefill on the array path: its summary, and its per-op events built when first asked for."""

    def __init__(self, stream, platform):
        self.stream, self.platform = stream, platform
        self.summary = summarize_stream(stream, platform)

    @functools.cached_property
    def events(self) -> list:
        return stream_events(self.stream, self.platform)


def _stream(geometry, executor, counts, platform, attention: str):
    config = PrefillConfig(platform, counts.chunk, attention=attention)
    stream = build_stream(geometry, executor, counts, attention=attention, dtype_bytes=config.dtype_bytes,
                          npu_weight_bytes=config.npu_weight_bytes)
    return StreamResult(stream, config.platform)


@dataclass
class Evaluation:
    knobs: Knobs
    plan: object                     # plan.Plan
    profile: object                  # the CalibrationProfile the plan was built from
    result: object                   # StreamResult: .summary now, .events (scheduled) when first read
    baselines: dict                  # variant -> summary (default knobs)
    calibration: str                 # where the plan's calibration came from
    seconds: float = 0.0             # wall time of this evaluation


@dataclass
class PlanLab:
    name: str
    geometry: object                 # geometry.ModelGeometry
    specs: list                      # MoELayerSpec per MoE layer
    source: object                   # sim.routing PopularityRouting (calibration at any chunk)
    prompt_len: int
    model: object = None             # with tokenizer + prompt_ids: recorded routing and the real-numerics button
    prompt_ids: object = None        # torch [1, T]
    seed: int = 0
    _routing: dict = field(default_factory=dict)
    _counts: dict = field(default_factory=dict)
    _platforms: dict = field(default_factory=dict)
    _profiles: dict = field(default_factory=dict)
    _baselines: dict = field(default_factory=dict)
    _reference: dict = field(default_factory=dict)

    # -- cached inputs ---------------------------------------------------------------------------------------
    def profile_at(self, chunk: int):
        """(profile, description) the plans at this chunk are built from."""
        if chunk not in self._profiles:
            prof = self.source.calibration_profile(self.specs, chunk, self.seed)
            real = prof is self.source.profile
            if not real and self.model is not None:      # the model's own fingerprint: attach() accepts its plans
                meta = {**prof.meta, "model_fingerprint": model_fingerprint(self.model), "model": self.name}
                sampled = CalibrationProfile(prof.counts, prof.stats, meta, None)
                sampled._matrices.update(prof._matrices)
                prof = sampled
            what = (f"the profile ({prof.meta.get('workload')}, {prof.meta.get('n_tokens')} tokens, chunk {chunk})"
                    if real else f"sampled from the profile's popularity at chunk {chunk} ({prof.n_chunks} chunks)")
            self._profiles[chunk] = (prof, what)
        return self._profiles[chunk]

    def routing_at(self, chunk: int) -> list:
        """The prompt's routing per chunk ({layer: (top_k_index, top_k_weights, norms)}), computed once."""
        if chunk not in self._routing:
            if self.model is not None:
                self._routing[chunk] = self._record(chunk)
            else:
                self._routing[chunk] = self.source.chunks(self.specs, self.prompt_len, chunk, self.seed)
        return self._routing[chunk]

    def counts_at(self, chunk: int):
        """The prompt's routing at this chunk as per-(chunk, layer) expert counts (stream.routing_counts), once."""
        if chunk not in self._counts:
            self._counts[chunk] = routing_counts(self.routing_at(chunk), self.specs, self.prompt_len, chunk)
        return self._counts[chunk]

    def _platform(self, name: str):
        """The Platform object of a name, loaded once (its plans and streams are priced on the same object)."""
        if not isinstance(name, str):
            return name
        if name not in self._platforms:
            self._platforms[name] = as_platform(name)
        return self._platforms[name]

    @property
    def routing_label(self) -> str:
        if self.model is not None:
            return "recorded in one dropless prefill of the prompt"
        return f"sampled from {self.source.label}"

    def _record(self, chunk: int) -> list:
        """One dropless prefill (HF's own experts) of the prompt with its routing recorded; keeps its logits as the
        reference of the real-numerics button."""
        detach(self.model)
        with RoutingRecorder(self.model) as rec:
            res = chunked_prefill(self.model, self.prompt_ids, chunk)
        self._reference[chunk] = res.logits
        return [{r.layer: (r.topk_idx, r.topk_weight, r.hidden_norm) for r in call} for call in rec.by_call()]

    # -- one knob setting -------------------------------------------------------------------------------------
    def plan(self, knobs: Knobs, platform=None):
        """The npumoe plan of this setting (`platform`: the knobs' platform already resolved)."""
        profile, _ = self.profile_at(knobs.chunk)
        return variant_plan(profile, "npumoe", self.specs, platform or as_platform(knobs.platform),
                            knobs.plan_knobs(self.specs[0]))

    def evaluate(self, knobs: Knobs) -> Evaluation:
        t0 = time.perf_counter()
        self._check(knobs)
        platform = self._platform(knobs.platform)
        plan = self.plan(knobs, platform)
        res = _stream(self.geometry, PlanExecutor(plan, []), self.counts_at(knobs.chunk), platform, "npu")
        profile, what = self.profile_at(knobs.chunk)
        return Evaluation(knobs, plan, profile, res, self.baselines(knobs.platform, knobs.chunk), what,
                          time.perf_counter() - t0)

    def baselines(self, platform: str, chunk: int) -> dict:
        """Summaries of the baseline variants (and npumoe at default knobs) on this platform and chunk."""
        key = (platform, chunk)
        if key not in self._baselines:
            profile, _ = self.profile_at(chunk)
            plat, out = self._platform(platform), {}
            for name in (*BASELINES, "npumoe"):
                v = get_variant(name)
                executor, _ = variant_executor(v, self.specs, profile, plat, {})
                res = _stream(self.geometry, executor, self.counts_at(chunk), plat, v.attention)
                out["npumoe (default knobs)" if name == "npumoe" else name] = res.summary
            self._baselines[key] = out
        return self._baselines[key]

    def real_prefill(self, knobs: Knobs) -> dict:
        """The plan run for real (numerics, modeled timing) on the prompt, against the dropless reference."""
        if self.model is None:
            raise NpuMoeError("real numerics need the model's weights: explore(model) with a model, not a geometry")
        self.routing_at(knobs.chunk)                       # the dropless reference logits at this chunk
        t0 = time.perf_counter()
        platform = as_platform(knobs.platform)
        attach(self.model, self.plan(knobs, platform))
        try:
            res = run_prefill(self.model, self.prompt_ids, PrefillConfig(platform, knobs.chunk, "npu"))
        finally:
            detach(self.model)
        return {**res.summary, **logit_agreement(self._reference[knobs.chunk], res.logits),
                "wall_s": time.perf_counter() - t0}

    def paper_point(self, knobs: Knobs):
        """The paper operating point of this setting (sim/operating_point.solve_percentile on the prompt's
        routing): the percentile at which npumoe drops the paper's 10-22 %, or the closest."""
        profile, _ = self.profile_at(knobs.chunk)
        given = {n: v for n, v in vars(knobs.plan_knobs(self.specs[0])).items() if n != "percentile"}
        return solve_percentile(profile, self.specs, self._platform(knobs.platform), self.counts_at(knobs.chunk).real,
                                {n: v for n, v in given.items() if v is not None and v != getattr(_DEFAULT, n)},
                                labels=dict(model=self.name, routing=self.routing_label))

    def at_operating_point(self, knobs: Knobs, operating_point: str = "default") -> Knobs:
        """`knobs` as they are ("default"), or at the paper point's percentile ("paper"; says what it chose)."""
        check_operating_point(operating_point)
        if operating_point == "default":
            return knobs
        pt = self.paper_point(knobs)
        print(f"operating point paper ({self.name}, chunk {knobs.chunk}, {knobs.platform}): {pt.note}")
        return replace(knobs, percentile=pt.percentile)

    def _check(self, knobs: Knobs):
        if knobs.chunk not in self.chunk_options():
            raise NpuMoeError(f"chunk {knobs.chunk} is not offered for a prompt of {self.prompt_len} tokens; use one "
                              f"of {self.chunk_options()}")

    def chunk_options(self) -> list[int]:
        own = self.source.profile.chunk if self.source.profile is not None else None
        return sorted({c for c in (*CHUNKS, own) if c is not None and c <= max(self.prompt_len, own or 0)})


def _popularity(profile, specs):
    shares = {}
    for s in specs:
        m = profile.count_matrix(s.layer).sum(1).astype(float) + 1e-9    # never-routed experts keep a tiny share
        shares[s.layer] = m / m.sum()
    label = f"profile ({profile.meta.get('workload')}, {profile.meta.get('n_tokens')} tokens)"
    return PopularityRouting(label, shares, shares, profile=profile)


def make_lab(model_or_geometry="tiny", profile=None, *, tokenizer=None, prompt=None, prompt_len: int = 256,
             chunk: int = 128, routing: str = "synthetic:gini=0.6", workload: str = "lm-heldout",
             calib_workload: str = "mixed", calib_tokens: int = 2048, seed: int = 0) -> PlanLab:
    """A PlanLab of a model (object, "tiny" or a checkpoint folder: calibrated once, cached) or of a bundled
    geometry name / config.json (routing from `routing`, or from `profile` when given)."""
    import torch

    model = model_or_geometry
    if isinstance(model, str) and (model in list_geometries() or model.endswith(".json")):
        name, _, geo = load_geometry(model)
        specs = list(geo.moe)
        source = _popularity(_load(profile), specs) if profile is not None else parse_routing(routing, specs, seed)
        return PlanLab(name, geo, specs, source, prompt_len, seed=seed)
    name = model if isinstance(model, str) else getattr(model.config, "_name_or_path", "model")
    if isinstance(model, str):
        model, tokenizer = load_model(model)
    if profile is None:
        if tokenizer is None:
            raise NpuMoeError("explore(model) needs its tokenizer (or a profile and a prompt): pass tokenizer=")
        profile = calibration_profile(model, tokenizer, calib_workload, chunk, calib_tokens, seed)
    profile = _load(profile) if not isinstance(profile, CalibrationProfile) else profile
    if prompt is None:
        if tokenizer is None:
            raise NpuMoeError("explore(model) needs a prompt (token ids) or a tokenizer to draw one")
        prompt = get_workload(workload).samples(tokenizer, prompt_len, 1, seed)[0].input_ids
    elif isinstance(prompt, str):
        prompt = tokenizer(prompt).input_ids
    ids = torch.as_tensor(prompt).reshape(1, -1)
    specs = describe(model)
    return PlanLab(str(name), ModelGeometry.from_config(model.config), specs, _popularity(profile, specs),
                   ids.shape[1], model=model, prompt_ids=ids, seed=seed)


def _load(profile):
    return profile if isinstance(profile, CalibrationProfile) else CalibrationProfile.load(profile)


def explore(model_or_geometry="tiny", profile=None, *, layer: int | None = None, knobs: Knobs | None = None,
            operating_point: str = "default", **lab_kwargs):
    """The interactive explorer (an ipywidgets VBox): sliders for the plan knobs, live panels of the plan and its
    modeled prefill against the baselines. Arguments as `make_lab`; `knobs`: the starting setting;
    `operating_point` "paper": start at the percentile that puts npumoe's drop in the paper's band (printed)."""
    from npumoe_lab.viz.explorer_app import Explorer  # lazy: ipywidgets only when the app is asked for
    lab = make_lab(model_or_geometry, profile, **lab_kwargs)
    start = knobs or Knobs(chunk=lab_kwargs.get("chunk", 128))
    if start.chunk not in lab.chunk_options():
        start = replace(start, chunk=lab.chunk_options()[-1])
    start = lab.at_operating_point(start, operating_point)
    return Explorer(lab, start, layer=layer)


def summary_rows(ev: Evaluation) -> list[dict]:
    """The metrics table of an evaluation: this plan first, then the baselines."""
    keys = ("ttft_s", "energy_per_token_mj", "cpu_cycles", "n_npu_calls", "drop_rate", "pad_rate")
    rows = [{"configuration": "this plan", **{k: ev.result.summary[k] for k in keys}}]
    rows += [{"configuration": name, **{k: s[k] for k in keys}} for name, s in ev.baselines.items()]
    return rows


def evaluation_rows(ev: Evaluation, lab: PlanLab, workload: str | None = None) -> list[dict]:
    """Result rows (store.write_rows) of an evaluation: this plan as variant npumoe with its knobs, the baselines
    under their variant names; modeled timing, routing replayed (numerics none)."""
    k = ev.knobs
    rows = []
    for r in summary_rows(ev):
        name = r.pop("configuration")
        variant = {"this plan": "npumoe", "npumoe (default knobs)": "npumoe"}.get(name, name)
        knobs = knob_columns(dict(tiers=k.tiers, group_size=k.group_size, percentile=k.percentile,
                                  residency=k.residency, hot_scale=k.hot_scale)) if name == "this plan" else {}
        rows.append(dict(model=lab.name, workload=workload, variant=variant, platform=k.platform,
                         prompt_len=lab.prompt_len, chunk=k.chunk, repeat=0, timing_source="modeled",
                         numerics_source="none", configuration=name, plan_hash=ev.plan.hash if knobs else None,
                         **r, **knobs))
    return rows


__all__ = ["explore", "make_lab", "PlanLab", "Knobs", "Evaluation", "summary_rows", "evaluation_rows"]
