"""`npumoe-lab simulate` / `simulate(...)`: paper-scale runs without the weights.

geometry x routing x platform x variant x prompt length x chunk -> result rows in the same store and with the same
columns as `npumoe-lab run`, plus `geometry`, `routing_source`, `routing_gini` and `numerics_source = none` (no
score columns: nothing is computed). Every variant's plan is built as `run` builds it (`plan.variant_plan` on the
routing source's calibration profile, the same knobs), and every timeline comes from the engine's own op records
(`replay.replay_prefill`). Times, energies and cycles are modeled (the platform's cost model); drop and padding
rates are the plans' capacities against the sampled per-chunk counts.
"""
from __future__ import annotations

import argparse
import itertools
import time
from pathlib import Path

import pandas as pd
import torch

from npumoe_lab.devices import Platform, get_platform
from npumoe_lab.results.store import write_rows, write_timeline
from npumoe_lab.execution.engine import PlanExecutor
from npumoe_lab.execution.footprint import plan_columns
from npumoe_lab.errors import NpuMoeError
from npumoe_lab.planning.knobs import PlanKnobs, add_knob_arguments, knobs_from_args
from npumoe_lab.planning.layout import ExecutionLayout
from npumoe_lab.planning.plan import variant_plan
from npumoe_lab.execution.runtime import PrefillConfig, check_context
from npumoe_lab.execution.timeline import to_frame
from npumoe_lab.utils import progress, provenance
from npumoe_lab.planning.variants import parse_variants
from npumoe_lab.sim.geometries import list_geometries, load_geometry
from npumoe_lab.sim.replay import replay_prefill
from npumoe_lab.sim.report import ratios
from npumoe_lab.sim.routing import parse_routing

WEIGHT_FORMATS = {"fp16": {}, "int8": {"npu_weight_bytes": "int8"}}   # -> platform override of the NPU's weights


def _list(value, cast=str) -> list:
    items = value.split(",") if isinstance(value, str) else (value if isinstance(value, (list, tuple)) else [value])
    try:
        return [cast(str(v).strip()) for v in items if str(v).strip()]
    except ValueError:
        raise NpuMoeError(f"{value!r} is not a comma list of {cast.__name__}s") from None


def variant_executor(variant, specs, profile, platform, knobs: dict):
    """(executor or None for HF's experts, plan or None) of a variant, built exactly as `run` builds it."""
    if variant.experts == "hf":
        return None, None
    if variant.experts == "dynamic":
        return PlanExecutor(ExecutionLayout.dropless(specs), [], cold="dynamic"), None
    plan = variant_plan(profile, variant.name, specs, platform=platform,
                        **{k: v for k, v in knobs.items() if v is not None})
    return PlanExecutor(plan, [], spill=variant.spill), plan


def _by_layout(variant, specs, profile, plats, knobs) -> list:
    """[(executor, [(platform, plan), ...]), ...]: one executor per distinct layout of the variant's plans."""
    groups = {}
    for plat in plats:
        executor, plan = variant_executor(variant, specs, profile, plat, knobs)
        # one op stream for platforms with the same layout and the same stored NPU weight size (op bytes follow it)
        key = (executor.layout.layers if executor is not None else None, getattr(plat.npu, "weight_bytes", None))
        groups.setdefault(key, (executor, []))[1].append((plat, plan))
    return list(groups.values())


def _row(name, src, v, plat, plan, t, c, weights, summary, prov, knobs, footprint=None) -> dict:
    summary = {k: val for k, val in summary.items() if k != "host_wall_s"}    # nothing ran on this host
    return dict(model=name, workload=src.label.split(":")[0], variant=v.name, platform=plat.name, prompt_len=t,
                chunk=c, repeat=0, n_samples=1, geometry=name, routing_source=src.label, routing_gini=src.gini(),
                numerics_source="none", weights=weights, plan_hash=getattr(plan, "hash", None),
                platform_kind=plat.kind, created=time.strftime("%Y-%m-%dT%H:%M:%S%z"), **summary,
                **(footprint or {}), **prov, **{("n_tiers" if k == "tiers" else k): val for k, val in knobs.items()})


def simulate(geometry="qwen3-30b-a3b", routing="synthetic:gini=0.6", platforms="m2-max", variants="all",
             prompt_len=1024, chunk=512, weights: str = "fp16", seed: int = 0, out=None, timeline: bool = False,
             **plan_knobs) -> pd.DataFrame:
    """Simulate every combination; returns (and writes to `out`) one row per (geometry, platform, variant,
    prompt length, chunk). Comma lists or lists for geometry, platforms (names or Platform objects, e.g. with
    overrides), variants, prompt_len and chunk."""
    rows, frames = [], []
    for row, res in iter_simulation(geometry, routing, platforms, variants, prompt_len, chunk, weights, seed,
                                    **plan_knobs):
        rows.append(row)
        if timeline:
            frames.append(to_frame(res.events).assign(variant=row["variant"], platform=row["platform"],
                                                      model=row["model"], prompt_len=row["prompt_len"],
                                                      chunk_size=row["chunk"], sample=0))
    df = pd.DataFrame(rows)
    if out is not None:
        write_rows(df, out)
        if frames:
            write_timeline(pd.concat(frames, ignore_index=True), Path(out) / "timelines")
    return df


def iter_simulation(geometry, routing, platforms, variants="all", prompt_len=1024, chunk=512, weights="fp16",
                    seed=0, **plan_knobs):
    """(row, PrefillResult with its scheduled events) per combination; everything is checked before the first."""
    PlanKnobs.check_names(plan_knobs)
    if weights not in WEIGHT_FORMATS:
        raise NpuMoeError(f"--weights {weights!r}: use one of {', '.join(WEIGHT_FORMATS)}")
    geos = [load_geometry(g) for g in _list(geometry)]
    plats = [p if isinstance(p, Platform) else get_platform(p, **WEIGHT_FORMATS[weights]) for p in
             (platforms if isinstance(platforms, (list, tuple)) else _list(platforms))]
    for p in plats:
        if p.kind == "measured":
            raise NpuMoeError(f"platform {p.name!r} is measured on this host; a simulation has no numerics to "
                              "time: use a modeled platform (npumoe-lab platforms)")
    vlist = parse_variants(variants)
    prompts, chunks = _list(prompt_len, int), _list(chunk, int)
    for (name, _, geo), c, t in itertools.product(geos, chunks, prompts):
        if c < 1 or t < 1:
            raise NpuMoeError(f"chunk and prompt length must be >= 1; got chunk {c}, prompt {t}")
        check_context(geo.context, c, f"--chunk {c} for geometry {name}")
        check_context(geo.context, t, f"--prompt-len {t} for geometry {name}")
    sources = {name: parse_routing(routing, list(geo.moe), seed) for name, _, geo in geos}   # all checked first
    prov = provenance()
    threads = torch.get_num_threads()
    torch.set_num_threads(1)      # thousands of tiny routing ops: a thread pool only adds hand-off cost
    bar = progress(total=len(geos) * len(chunks) * len(prompts) * len(plats) * len(vlist), desc="simulate")
    try:
        for name, _, geo in geos:
            src, specs = sources[name], list(geo.moe)
            for c in chunks:
                profile = src.calibration_profile(specs, c, seed)
                # per variant: platforms whose plans have the same layout share one op stream, priced on each
                built = {v.name: _by_layout(v, specs, profile, plats, plan_knobs) for v in vlist}
                for t in prompts:
                    routed = src.chunks(specs, t, c, seed)
                    for v in vlist:
                        for executor, members in built[v.name]:
                            configs = [PrefillConfig(p, c, attention=v.attention) for p, _ in members]
                            results = replay_prefill(geo, executor, configs[0], routed, t, also_on=configs[1:])
                            for (plat, plan), res in zip(members, results):
                                bar.update(1)
                                fp = plan_columns(None if executor is None else executor.layout, res.events, plat,
                                                  sum(s.n_experts for s in specs))
                                yield _row(name, src, v, plat, plan, t, c, weights, res.summary, prov,
                                           plan_knobs, fp), res
    finally:
        bar.close()
        torch.set_num_threads(threads)


def register_cli(sub) -> None:
    p = sub.add_parser("simulate", help="paper-scale prefill from a model's geometry and routing statistics "
                                        "(no weights; times modeled)")
    p.add_argument("--geometry", default="qwen3-30b-a3b",
                   help=f"comma list of {', '.join(list_geometries())} or config.json paths")
    p.add_argument("--routing", default="synthetic:gini=0.6",
                   help="synthetic:gini=G[,layer_overlap=L,workload_overlap=W,concentration=A,doc_concentration=D,"
                        "calibration=MIX,workload=MIX,seed=N] (unset fields: the measured defaults of "
                        "data/routing/tiny-defaults.yaml) | profile:DIR[,run=DIR2|,workload_overlap=W] | "
                        "tiny[:workload=NAME]")
    p.add_argument("--platform", default="m2-max", help="comma list of modeled platforms")
    p.add_argument("--variant", default="all", help="comma list or 'all'")
    p.add_argument("--prompt-len", default="1024", help="comma list")
    p.add_argument("--chunk", default="512", help="comma list")
    p.add_argument("--weights", default="fp16", choices=list(WEIGHT_FORMATS),
                   help="NPU weight storage: fp16, or int8 dequantized on the NPU (half the bytes streamed)")
    p.add_argument("--seed", type=int, default=0)
    add_knob_arguments(p, with_defaults=False)       # unset: each variant's plan defaults
    p.add_argument("--timeline", action="store_true", help="also write the per-op timelines")
    p.add_argument("--out", required=True)
    p.set_defaults(func=_cli)


def _cli(a: argparse.Namespace) -> int:
    knobs = knobs_from_args(a)
    t0 = time.perf_counter()
    df = simulate(a.geometry, a.routing, a.platform, a.variant, a.prompt_len, a.chunk, a.weights, a.seed, a.out,
                  a.timeline, **knobs)
    cols = ["model", "platform", "prompt_len", "chunk", "variant", "ttft_s", "energy_per_token_mj", "cpu_cycles",
            "n_npu_calls", "n_npu_groups", "npu_expert_flop_share", "drop_rate", "pad_rate", "compile_s"]
    with pd.option_context("display.width", 200, "display.max_columns", 20, "display.max_rows", 400):
        print(df[cols].to_string(index=False))
        sp = ratios(df, "ttft_s")
        if not sp.empty:
            print("\nnpumoe TTFT speedup (baseline / npumoe, modeled):\n"
                  + sp.to_string(index=False, float_format=lambda x: f"{x:.2f}"))
    print(f"\n{len(df)} rows (timing modeled, numerics none; routing {df.routing_source.iloc[0]}, measured Gini of "
          f"the sampled counts {df.routing_gini.iloc[0]:.3f}) in {time.perf_counter() - t0:.1f} s; written to {a.out}")
    return 0
