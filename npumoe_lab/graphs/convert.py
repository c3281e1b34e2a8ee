"""`npumoe-lab convert` / `convert(plan, out, target=...)`: build, validate and cache every static graph of a plan
(resident expert groups and per-layer attention), then write OUT/manifest.json."""
from __future__ import annotations

import time
from pathlib import Path

from npumoe_lab.errors import NpuMoeError
from npumoe_lab.models import load_model
from npumoe_lab.planning.plan import Plan
from npumoe_lab.graphs.build import build_graphs, model_parts, violations
from npumoe_lab.graphs.cache import GraphCache
from npumoe_lab.graphs.coreml import CoreMLOptions
from npumoe_lab.graphs.spec import Limits, field_of


def load_plan(path):
    """The plan, validated (plan.Plan)."""
    path = Path(path)
    if not path.is_file():
        raise NpuMoeError(f"plan file {path} does not exist; make one with `npumoe-lab plan`")
    return Plan.load(path)


def convert(plan, out, target: str = "coreml", model="tiny", platform=None, layout: str = "conv",
            compress: str = "none", compute_units: str = "CPU_AND_NE", all_tiers: bool = False,
            attention: bool = True, context: int = 2048, cache=None, decode_policy: str = "pipeline",
            decode_batch: int = 1) -> dict:
    """Build, validate and cache every static graph of `plan` (a Plan or a plan JSON path) into `out`; returns the
    manifest (also written to out/manifest.json) with `seconds` added. Raises NpuMoeError on validation problems.
    decode_policy: the decode steps' graphs too (graphs.build.build_graphs; the manifest's `decode` says which)."""
    plan = load_plan(plan) if not isinstance(plan, Plan) else plan
    platform = platform or field_of(plan, "platform")
    limits = Limits.of(platform) if platform else Limits()
    model, _ = load_model(model)
    if hasattr(plan, "check_model"):
        plan.check_model(model)  # graphs hold this model's weights: a plan for another model would mislabel them
    weights, attn, rotary = model_parts(model)
    options = None
    if target == "coreml":
        options = CoreMLOptions(layout=layout, compression=None if compress == "none" else compress,
                                compute_units=compute_units)
    t0 = time.perf_counter()
    manifest = build_graphs(plan, weights, out, target=target, options=options, limits=limits,
                            attention=attn if attention else None, rotary=rotary, context=context,
                            all_tiers=all_tiers, cache=_cache(cache), decode_policy=decode_policy,
                            decode_batch=decode_batch)
    manifest = {**manifest, "seconds": time.perf_counter() - t0}
    bad = violations(manifest)
    if bad:
        raise NpuMoeError(f"{len(bad)} validation problem(s), first: {bad[0]}; see the manifest, change --layout/"
                          "--compress or the plan's groups")
    return manifest


def _cache(root):
    return GraphCache(root) if root else None
