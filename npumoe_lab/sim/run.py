"""`npumoe-lab simulate` / `simulate(...)`: paper-scale runs without the weights.

geometry x routing x platform x variant x prompt length x chunk -> result rows in the same store and with the same
columns as `npumoe-lab run`, plus `geometry`, `routing_source`, `routing_gini` and `numerics_source = none` (no
score columns: nothing is computed). Every variant's plan is built as `run` builds it (`plan.variant_plan` on the
routing source's calibration profile, the same knobs), and every timeline comes from the engine's own op records
(`replay.replay_prefill`), or, by default, from the same ops built as arrays (`stream.build_stream`, scheduled and
priced by `array_replay`; a test holds both equal): `engine="ops"` (and `--timeline`) takes the per-op path. Times,
energies and cycles are modeled (the platform's cost model); drop and padding rates are the plans' capacities
against the sampled per-chunk counts. `draws=N` adds the 90 % interval of ttft_s, energy_per_token_mj and cpu_cycles
(`_lo` / `_hi`) over N parameter draws (`pricing.parameter_draws`: the platform's posterior, else a prior), the same
stream priced once per draw set, on either NPU cost structure (per-op roofline, graph-level: pricing.py).
Rows name the platform by its label (`Platform.label`: name plus overrides, e.g. "m2-max[npu_dispatch_s=0.0004]";
a fitted YAML its own name) in `platform`, by its profile's name in `platform_base`, and by the measurement rows'
chip in `platform_chip` (m2-max for both m2-max and m2-max-fit: grouping sourced and fitted by chip).
"""
from __future__ import annotations

import functools
import itertools
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from npumoe_lab.devices import as_platform
from npumoe_lab.results.store import knob_columns, write_rows, write_timeline
from npumoe_lab.execution.config import PrefillConfig, check_context, check_lengths
from npumoe_lab.execution.footprint import plan_columns
from npumoe_lab.errors import NpuMoeError
from npumoe_lab.planning.knobs import PlanKnobs
from npumoe_lab.planning.layout import ExecutionLayout
from npumoe_lab.planning.plan import variant_plan
from npumoe_lab.execution.timeline import to_frame
from npumoe_lab.utils import progress, provenance, relaxed_gc
from npumoe_lab.planning.variants import parse_variants
from npumoe_lab.sim.geometries import load_geometry
from npumoe_lab.sim.array_replay import interval_columns, stream_metrics, summarize_stream
from npumoe_lab.sim.pricing import array_priced, draws_source, parameter_draws
from npumoe_lab.sim.stream import RoutingCounts, StreamExecutor, build_stream, routing_counts
from npumoe_lab.sim.parallel import default_workers, parallel_rows
from npumoe_lab.sim import plan_cache
from npumoe_lab.sim.decode import decode_routing, decode_stream, e2e_columns, e2e_draws, replay_decode, \
    step_counts, stream_decode_summary
from npumoe_lab.execution.decode_policy import DEFAULT_DECODE_TOKENS, check_decode
from npumoe_lab.sim.routing import gini, parse_routing
from npumoe_lab.sim.operating_point import (PAPER_DROP_TARGET, check_operating_point, operating_columns,
                                            solve_percentile)

WEIGHT_FORMATS = {"fp16": {}, "int8": {"npu_weight_bytes": "int8"}}   # -> platform override of the NPU's weights
ENGINES = ("array", "ops")        # op streams as arrays (default) | the per-op replay (reference, timelines)


@dataclass
class StreamResult:
    """One simulated prefill on the array path: its op stream and summary (no per-op events)."""
    stream: object                   # stream.OpStream
    platform: object
    summary: dict
    draws: dict | None = None        # {metric: (D,) array} under the parameter draws (array_replay.stream_metrics)


def _list(value, cast=str) -> list:
    items = value.split(",") if isinstance(value, str) else (value if isinstance(value, (list, tuple)) else [value])
    try:
        return [cast(str(v).strip()) for v in items if str(v).strip()]
    except ValueError:
        raise NpuMoeError(f"{value!r} is not a comma list of {cast.__name__}s") from None


def _executor(layout, engine: str, **options):
    """The per-op engine's PlanExecutor ("ops"), or for the array path the StreamExecutor holding what an op stream
    reads of it (no torch: the simulate command imports neither torch nor transformers)."""
    if engine == "array":
        return StreamExecutor(layout, **options)
    from npumoe_lab.execution.engine import PlanExecutor    # lazy: torch, for the per-op replay only
    return PlanExecutor(layout, [], **options)


def variant_executor(variant, specs, profile, platform, knobs: dict, memo: dict | None = None, engine: str = "ops"):
    """(executor or None for HF's experts, plan or None) of a variant, built exactly as `run` builds it. `memo`:
    a dict shared by the calls of one simulation, so that variants whose plans are the same (npumoe and
    npumoe-spill: they differ in the executor only) build and compile it once. `engine` "ops": a PlanExecutor
    (replay_prefill), "array": a StreamExecutor (build_stream only)."""
    if variant.experts == "hf":
        return None, None
    if variant.experts == "dynamic":
        return _executor(_dropless(tuple(specs)), engine, cold="dynamic"), None
    given = PlanKnobs.given(knobs)
    forced = {**given, **variant.plan_overrides}
    key = (id(profile), id(platform), tuple(sorted(forced.items(), key=str)))
    if memo is None or key not in memo:
        def build():
            plan = variant_plan(profile, variant.name, specs, platform, given)
            return plan, plan.compile()
        built = plan_cache.cached_plan(variant, specs, profile, platform, forced, build)
        if memo is not None:
            memo[key] = built
    plan, layout = memo[key] if memo is not None else built
    return _executor(layout, engine, spill=variant.spill), plan


def _routing_source(routing, specs: tuple, seed: int):
    """The routing source of a spec: a string spec's source is kept for the next calls of this process (a sweep's
    cells: the synthetic popularity's fit, the calibration draws and profiles are the same for the same spec)."""
    if not isinstance(routing, str):
        return parse_routing(routing, list(specs), seed)
    return _cached_source(routing, specs, seed)


@functools.lru_cache(maxsize=8)
def _cached_source(routing: str, specs: tuple, seed: int):
    return parse_routing(routing, list(specs), seed)


@functools.lru_cache(maxsize=16)
def _dropless(specs: tuple) -> ExecutionLayout:
    """The dynamic dropless layout of a geometry (the same for every chunk and platform: built once)."""
    return ExecutionLayout.dropless(specs)


def _by_layout(variant, specs, profile, plats, knobs, memo=None, engine="ops") -> list:
    """[(executor, [(platform, plan), ...]), ...]: one executor per distinct layout of the variant's plans."""
    groups = {}
    for plat in plats:
        executor, plan = variant_executor(variant, specs, profile, plat, knobs(plat) if callable(knobs) else knobs,
                                          memo, engine)
        # one op stream for platforms with the same layout and the same stored NPU weight size (op bytes follow it)
        key = (executor.layout.layers if executor is not None else None, getattr(plat.npu, "weight_bytes", None))
        groups.setdefault(key, (executor, []))[1].append((plat, plan))
    return list(groups.values())


def _chunks(src, specs, t, c, seed):
    """The routing source's sampled chunks of a prompt, kept on the source (the per-op replay reads them)."""
    kept = _prompt(src, specs, t, c, seed)
    if kept.routed is None:
        kept.routed = src.chunks(specs, t, c, seed)
    return kept.routed


@dataclass
class _Prompt:
    """A prompt's sampled chunks, Gini and RoutingCounts, each filled on first use (read only by every caller: a
    sweep's cells read the same prompt, so each is computed once)."""
    routed: list | None = None
    gini: float | None = None
    counts: RoutingCounts | None = None
    every: np.ndarray | None = None       # [chunks, MoE layers, E] counts of every token (padding too)


def _prompt(src, specs, t, c, seed) -> _Prompt:
    memo = src.__dict__.setdefault("_sampled_chunks", {})
    key = (tuple(s.layer for s in specs), t, c, seed)
    if key not in memo:
        if len(memo) >= 64:
            memo.clear()
        memo[key] = _Prompt()
    return memo[key]


def _prompt_gini(src, specs, t, c, seed) -> float:
    """The Gini of the prompt's own sampled counts (_routed_gini), or the source's where it samples none."""
    if not hasattr(src, "_gini"):
        return src.gini()
    kept = _prompt(src, specs, t, c, seed)
    if kept.gini is None:
        if kept.routed is None and hasattr(src, "chunk_counts"):
            _prompt_counts(src, specs, t, c, seed)
            kept.gini = _counted_gini(kept.every, specs)
        else:
            kept.gini = _routed_gini(_chunks(src, specs, t, c, seed), specs)
    return kept.gini


def _prompt_counts(src, specs, t, c, seed) -> RoutingCounts:
    """The prompt's RoutingCounts: of its sampled chunks where they were drawn (the per-op replay), else counted as
    they are drawn where the source can (chunk_counts: no expert order or weights; the same counts)."""
    kept = _prompt(src, specs, t, c, seed)
    if kept.counts is None:
        if kept.routed is None and hasattr(src, "chunk_counts"):
            kept.every, real = src.chunk_counts(specs, t, c, seed)
            kept.counts = RoutingCounts.of([s.layer for s in specs], kept.every, real, c, t, specs[0].top_k)
        else:
            kept.counts = routing_counts(_chunks(src, specs, t, c, seed), specs, t, c)
    return kept.counts


def _operating_points(geos, sources, plats, prompts, chunks, seed, plan_knobs, target, off_band) -> dict:
    """{(model, chunk, id(platform)): OperatingPoint} of `--operating-point paper`, all solved before the first
    row (an unreachable band stops the run before anything is computed)."""
    import numpy as np      # lazy: this file imports no numpy at its top (pandas only)
    out = {}
    for name, _, geo in geos:
        src, specs = sources[name], list(geo.moe)
        for c in chunks:
            profile = src.calibration_profile(specs, c, seed)
            real = np.concatenate([_prompt_counts(src, specs, t, c, seed).real for t in prompts])
            for p in plats:
                pt = solve_percentile(profile, specs, p, real, plan_knobs, PAPER_DROP_TARGET if target is None
                                      else target, labels=dict(model=name, routing=src.label))
                if not pt.in_band and off_band == "error":
                    raise NpuMoeError(f"--operating-point paper: {name}, chunk {c}, {p.label}: {pt.note}; use "
                                      "--operating-point default, or other knobs (a larger --group-size or "
                                      "--npu-program-budget off keeps more groups resident)")
                out[(name, c, id(p))] = pt
    return out


def _knobs_at(points: dict, name: str, c: int, plan_knobs: dict):
    """The plan knobs of a platform: the run's, with the paper operating point's percentile where solved."""
    def knobs(plat) -> dict:
        pt = points.get((name, c, id(plat)))
        return plan_knobs if pt is None else {**plan_knobs, "percentile": pt.percentile}
    return knobs


def _plan_limit_columns(plan) -> dict:
    """The program budget a plan was searched under (a number, 'off', or 'none' where none applied)."""
    lim = getattr(plan, "limits", None) or {}
    return {"npu_program_budget_used": str(lim.get("npu_program_budget", "none"))}


def _routed_gini(routed: list, specs) -> float:
    """Mean over MoE layers of the Gini of this prompt's sampled per-expert counts (its own chunks, whatever the
    routing source sampled before or after: memoised draws, other prompts, decode steps)."""
    out = []
    for s in specs:
        idx = np.concatenate([np.asarray(ch[s.layer][0]).ravel() for ch in routed])
        out.append(gini(np.bincount(idx[idx >= 0], minlength=s.n_experts)))
    return float(np.mean(out)) if out else 0.0


def _counted_gini(every: np.ndarray, specs) -> float:
    """_routed_gini from the prompt's counts of every token ([chunks, MoE layers, E], specs' order)."""
    out = [gini(every[:, i, :s.n_experts].sum(0)) for i, s in enumerate(specs)]
    return float(np.mean(out)) if out else 0.0


def _row(name, src, v, plat, plan, t, c, weights, summary, prov, knobs, footprint=None) -> dict:
    summary = {k: val for k, val in summary.items() if k != "host_wall_s"}    # nothing ran on this host
    return dict(model=name, workload=src.label.split(":")[0], variant=v.name, platform=plat.label,
                platform_base=plat.name, platform_chip=plat.chip, prompt_len=t,
                chunk=c, repeat=0, n_samples=1, geometry=name, routing_source=src.label, routing_gini=src.gini(),
                numerics_source="none", weights=weights, plan_hash=getattr(plan, "hash", None),
                platform_kind=plat.kind, created=time.strftime("%Y-%m-%dT%H:%M:%S%z"), **summary,
                **(footprint or {}), **prov, **knob_columns(knobs))


def _priced(stream, platform, draws) -> StreamResult:
    """The stream's summary on `platform`, with its metrics under the parameter draws and their 90 % interval."""
    summary = summarize_stream(stream, platform)
    if draws is None:
        return StreamResult(stream, platform, summary)
    metrics = stream_metrics(stream, draws, platform.npu_shares_cpu)
    return StreamResult(stream, platform, {**summary, **interval_columns(metrics)}, metrics)


def _decode_array(geo, executor, counts, prompt_len, chunk, policy, configs, priced, prefill) -> list:
    """Per platform, the e2e columns (sim/decode.py) of the decode steps counted as `counts`: one array stream
    priced on each. `priced`: (platform, its parameter draws or None); `prefill`: (summary, metrics under the same
    draws or None) of each platform's prefill, so the e2e intervals pair each draw's prefill with its decode."""
    n = counts.n_chunks
    stream = decode_stream(geo, executor, counts, prompt_len, chunk, policy, attention=configs[0].attention,
                           dtype_bytes=configs[0].dtype_bytes, npu_weight_bytes=configs[0].npu_weight_bytes)
    out = []
    for (p, d), (summary, pre) in zip(priced, prefill):
        dm = stream_metrics(stream, d, p.npu_shares_cpu) if d is not None else None
        out.append(e2e_columns(summary, stream_decode_summary(stream, p), n, policy, pre, dm))
        if pre is not None and dm is not None:      # the e2e metrics per draw beside the prefill's (paper-check)
            pre.update(e2e_draws(pre, dm, n))
    return out


def simulate(geometry="qwen3-30b-a3b", routing="synthetic:gini=0.6", platforms="m2-max", variants="all",
             prompt_len=1024, chunk=512, weights: str = "fp16", seed: int = 0, out=None, timeline: bool = False,
             draws: int = 0, engine: str = "array", workers: int = 1, decode_tokens: int = DEFAULT_DECODE_TOKENS,
             decode_policy: str = "pipeline", operating_point: str = "default", off_band: str = "error",
             **plan_knobs) -> pd.DataFrame:
    """Simulate every combination; returns (and writes to `out`) one row per (geometry, platform, variant,
    prompt length, chunk). Comma lists or lists for geometry, platforms (names or Platform objects, e.g. with
    overrides), variants, prompt_len and chunk."""
    df, timelines = simulate_with_timelines(geometry, routing, platforms, variants, prompt_len, chunk, weights, seed,
                                            timeline, draws=draws, engine=engine, workers=workers,
                                            decode_tokens=decode_tokens, decode_policy=decode_policy,
                                            operating_point=operating_point, off_band=off_band, **plan_knobs)
    if out is not None:
        save_simulation(df, timelines, out)
    return df


@relaxed_gc()
def simulate_with_timelines(geometry="qwen3-30b-a3b", routing="synthetic:gini=0.6", platforms="m2-max",
                            variants="all", prompt_len=1024, chunk=512, weights: str = "fp16", seed: int = 0,
                            timeline: bool = False, draws: int = 0, engine: str = "array", workers: int = 1,
                            decode_tokens: int = DEFAULT_DECODE_TOKENS, decode_policy: str = "pipeline",
                            operating_point: str = "default", off_band: str = "error", **plan_knobs):
    """(rows, the per-op timelines or None): simulate() without writing (the CLI prints before it writes).
    `workers`: processes over the grid's (geometry, chunk) units (sim/parallel.py: the same rows; 1: in this
    process, the default; None: the cores this process may use); timelines are built in this process."""
    workers = default_workers() if workers is None else workers
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise NpuMoeError(f"workers={workers!r}: give a whole number of worker processes >= 1 (1: in this process)")
    # the paper operating point solves its percentiles (and may stop before the first row) in this process
    if not timeline and workers > 1 and operating_point == "default":
        check_decode(decode_tokens, decode_policy)
        rows = _parallel(geometry, routing, platforms, variants, prompt_len, chunk, weights, seed, draws, engine,
                         workers, {**plan_knobs, "decode_tokens": decode_tokens, "decode_policy": decode_policy})
        if rows is not None:
            return pd.DataFrame(rows), None
    rows, frames = [], []
    for row, res in iter_simulation(geometry, routing, platforms, variants, prompt_len, chunk, weights, seed,
                                    draws=draws, engine="ops" if timeline else engine, decode_tokens=decode_tokens,
                                    decode_policy=decode_policy, operating_point=operating_point, off_band=off_band,
                                    **plan_knobs):
        rows.append(row)
        if timeline:
            frames.append(to_frame(res.events).assign(variant=row["variant"], platform=row["platform"],
                                                      model=row["model"], prompt_len=row["prompt_len"],
                                                      chunk_size=row["chunk"], sample=0))
    return pd.DataFrame(rows), (pd.concat(frames, ignore_index=True) if frames else None)


def _parallel(geometry, routing, platforms, variants, prompt_len, chunk, weights, seed, draws, engine, workers,
              plan_knobs):
    """The rows over worker processes, or None (sequential) where parallel_rows declines."""
    units = [(g, c) for g in _list(geometry) for c in _list(chunk, int)]
    if min(workers, len(units)) < 2:
        return None
    geos = {g: load_geometry(g, hf_config=False)[2] for g in _list(geometry)}
    for g, c in units:                # the checks that differ by unit, in iter_simulation's order: its first error
        for t in _list(prompt_len, int):
            check_lengths(t, c)
            check_context(geos[g].context, c, f"--chunk {c} for geometry {load_geometry(g, hf_config=False)[0]}")
            check_context(geos[g].context, t, f"--prompt-len {t} for geometry {load_geometry(g, hf_config=False)[0]}")
    if isinstance(routing, str):      # the source's fit, once, inherited by the forked workers (_cached_source)
        for geo in geos.values():
            _routing_source(routing, tuple(geo.moe), seed)
    # a unit's work grows with its MoE layers' experts (plans, routing draws): the costliest start first
    cost = [sum(s.n_experts for s in geos[g].moe) for g, _ in units]
    kwargs = dict(routing=routing, platforms=platforms, variants=variants, prompt_len=prompt_len, weights=weights,
                  seed=seed, draws=draws, engine=engine, **plan_knobs)
    n_rows = len(units) * len(_list(prompt_len, int)) * len(parse_variants(variants)) * len(
        platforms if isinstance(platforms, (list, tuple)) else _list(platforms))
    return parallel_rows(units, kwargs, workers, lambda: progress(total=n_rows, desc="simulate"), cost)


@relaxed_gc()
def save_simulation(df: pd.DataFrame, timelines, out) -> list[Path]:
    """The rows (and timelines) of a simulation into `out`; the paths written."""
    paths = [write_rows(df, out)]
    if timelines is not None:
        paths.append(write_timeline(timelines, Path(out) / "timelines"))
    return paths


def iter_simulation(geometry, routing, platforms, variants="all", prompt_len=1024, chunk=512, weights="fp16",
                    seed=0, draws: int = 0, engine: str = "array", decode_tokens: int = DEFAULT_DECODE_TOKENS,
                    decode_policy: str = "pipeline", operating_point: str = "default",
                    drop_target: float | None = None, off_band: str = "error", **plan_knobs):
    """(row, result) per combination; everything is checked before the first. result: engine "ops" a
    PrefillResult with its scheduled events; "array" a StreamResult (op stream + summary). `decode_tokens` N >= 1
    adds N greedy decode steps under `decode_policy` (sim/decode.py: the e2e columns); 0: prefill-only rows.
    `operating_point` "paper": the percentile solved per (model, chunk, platform) for npumoe's drop at
    `drop_target` (default the paper band's centre; sim/operating_point.py); where none reaches the band,
    `off_band` "error" stops before the first row, "closest" simulates at the closest (rows say op_in_band
    False)."""
    PlanKnobs.check_names(plan_knobs)
    check_decode(decode_tokens, decode_policy)
    check_operating_point(operating_point, drop_target)
    if off_band not in ("error", "closest"):
        raise NpuMoeError(f"off_band {off_band!r}: use 'error' (stop where no percentile reaches the band) or "
                          "'closest' (simulate at the closest, rows say op_in_band False)")
    if engine not in ENGINES:
        raise NpuMoeError(f"engine {engine!r}: use one of {', '.join(ENGINES)}")
    if isinstance(draws, bool) or not isinstance(draws, int) or draws < 0:
        raise NpuMoeError(f"--draws {draws!r}: give a whole number of parameter draws >= 0 (0: no interval)")
    if weights not in WEIGHT_FORMATS:
        raise NpuMoeError(f"--weights {weights!r}: use one of {', '.join(WEIGHT_FORMATS)}")
    geos = [load_geometry(g, hf_config=False) for g in _list(geometry)]
    plats = [as_platform(p, **WEIGHT_FORMATS[weights]) for p in
             (platforms if isinstance(platforms, (list, tuple)) else _list(platforms))]
    for p in plats:
        if p.kind == "measured":
            raise NpuMoeError(f"platform {p.name!r} is measured on this host; a simulation has no numerics to "
                              "time: use a modeled platform (npumoe-lab platforms)")
    vlist = parse_variants(variants)
    prompts, chunks = _list(prompt_len, int), _list(chunk, int)
    for (name, _, geo), c, t in itertools.product(geos, chunks, prompts):
        check_lengths(t, c)
        check_context(geo.context, c, f"--chunk {c} for geometry {name}")
        check_context(geo.context, t, f"--prompt-len {t} for geometry {name}")
    sources = {name: _routing_source(routing, tuple(geo.moe), seed) for name, _, geo in geos}   # all checked first
    points = _operating_points(geos, sources, plats, prompts, chunks, seed, plan_knobs, drop_target, off_band) \
        if operating_point == "paper" else {}
    if not all(array_priced(p) for p in plats):      # a structure price_stream lacks: the per-op engine, no interval
        engine, draws = "ops", 0
    drawn = {id(p): parameter_draws(p, draws, seed) for p in plats} if draws else {}
    extra = lambda p: dict(interval_draws=draws, interval_source=draws_source(p)) if draws else {}   # noqa: E731
    prov = provenance()
    if engine == "ops":
        # lazy: torch, for the per-op replay only (the array path imports neither torch nor transformers)
        import torch
        from npumoe_lab.sim.replay import replay_prefill
        threads = torch.get_num_threads()
        torch.set_num_threads(1)      # thousands of tiny routing ops: a thread pool only adds hand-off cost
    bar = progress(total=len(geos) * len(chunks) * len(prompts) * len(plats) * len(vlist), desc="simulate")
    try:
        for name, _, geo in geos:
            src, specs = sources[name], list(geo.moe)
            dsteps = decode_routing(src, specs, decode_tokens, seed)
            for c in chunks:
                dcounts = step_counts(dsteps, specs, decode_policy, c) if dsteps and (engine == "array" or draws) \
                    else None
                profile = src.calibration_profile(specs, c, seed)
                # per variant: platforms whose plans have the same layout share one op stream, priced on each
                memo = {}
                knobs_at = _knobs_at(points, name, c, plan_knobs)
                built = {v.name: _by_layout(v, specs, profile, plats, knobs_at, memo, engine) for v in vlist}
                for t in prompts:
                    routed = _chunks(src, specs, t, c, seed) if engine == "ops" else None
                    rgini = _prompt_gini(src, specs, t, c, seed)
                    counts = _prompt_counts(src, specs, t, c, seed) if engine == "array" or draws else None
                    for v in vlist:
                        for executor, members in built[v.name]:
                            configs = [PrefillConfig(p, c, attention=v.attention) for p, _ in members]
                            if engine == "array":
                                stream = build_stream(geo, executor, counts, attention=v.attention,
                                                      dtype_bytes=configs[0].dtype_bytes,
                                                      npu_weight_bytes=configs[0].npu_weight_bytes)
                                results = [_priced(stream, p, drawn.get(id(p))) for p, _ in members]
                                decoded = _decode_array(geo, executor, dcounts, t, c, decode_policy, configs,
                                                        [(p, drawn.get(id(p))) for p, _ in members],
                                                        [(r.summary, r.draws) for r in results]) if dsteps else None
                            else:
                                results = replay_prefill(geo, executor, configs[0], routed, t, also_on=configs[1:])
                                if draws:     # the interval from the same ops as arrays (a test holds them equal)
                                    stream = build_stream(geo, executor, counts, attention=v.attention,
                                                          dtype_bytes=configs[0].dtype_bytes,
                                                          npu_weight_bytes=configs[0].npu_weight_bytes)
                                    pre_draws = [stream_metrics(stream, drawn[id(p)], p.npu_shares_cpu)
                                                 for p, _ in members]
                                    for res, m in zip(results, pre_draws):
                                        res.summary.update(interval_columns(m))
                                decoded = None
                                if dsteps:   # the point values op by op; with draws the intervals from arrays
                                    dec = replay_decode(geo, executor, configs[0], dsteps, t, decode_policy,
                                                        also_on=configs[1:])
                                    decoded = [e2e_columns(res.summary, d, decode_tokens, decode_policy)
                                               for res, (_, d) in zip(results, dec)]
                                    if draws:
                                        arr = _decode_array(geo, executor, dcounts, t, c, decode_policy, configs,
                                                            [(p, drawn[id(p)]) for p, _ in members],
                                                            [(r.summary, m) for r, m in zip(results, pre_draws)])
                                        for row, a in zip(decoded, arr):
                                            row.update({k: v for k, v in a.items() if k.endswith(("_lo", "_hi"))})
                            for k, ((plat, plan), res) in enumerate(zip(members, results)):
                                bar.update(1)
                                if decoded is not None:
                                    res.summary.update(decoded[k])
                                fp = plan_columns(None if executor is None else executor.layout,
                                                  res.stream if isinstance(res, StreamResult) else res.events, plat,
                                                  sum(s.n_experts for s in specs))
                                fp.update(_plan_limit_columns(plan), **operating_columns(points.get((name, c, id(plat)))))
                                row = _row(name, src, v, plat, plan, t, c, weights, {**res.summary, **extra(plat)},
                                           prov, knobs_at(plat), fp)
                                yield {**row, "routing_gini": rgini}, res
    finally:
        bar.close()
        if engine == "ops":
            torch.set_num_threads(threads)
