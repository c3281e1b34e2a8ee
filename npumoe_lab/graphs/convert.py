"""`npumoe-lab convert --plan P --target coreml|onnx --out DIR [--model tiny|PATH]`: build, validate and cache
every static graph of a plan (resident expert groups and per-layer attention), then write DIR/manifest.json."""
from __future__ import annotations

import time
from pathlib import Path

from npumoe_lab.errors import NpuMoeError
from npumoe_lab.models import load_model
from npumoe_lab.planning.plan import Plan
from npumoe_lab.graphs.build import TARGETS, build_graphs, model_parts, violations
from npumoe_lab.graphs.cache import GraphCache
from npumoe_lab.graphs.coreml import CoreMLOptions
from npumoe_lab.graphs.spec import Limits, field_of


def load_plan(path):
    """The plan, validated (plan.Plan)."""
    path = Path(path)
    if not path.is_file():
        raise NpuMoeError(f"plan file {path} does not exist; make one with `npumoe-lab plan`")
    return Plan.load(path)


def convert(args) -> int:
    plan = load_plan(args.plan)
    platform = args.platform or field_of(plan, "platform")
    limits = Limits.of(platform) if platform else Limits()
    model, _ = load_model(args.model)
    if hasattr(plan, "check_model"):
        plan.check_model(model)  # graphs hold this model's weights: a plan for another model would mislabel them
    weights, attention, rotary = model_parts(model)
    options = None
    if args.target == "coreml":
        options = CoreMLOptions(layout=args.layout, compression=None if args.compress == "none" else args.compress,
                                compute_units=args.compute_units)
    t0 = time.perf_counter()
    manifest = build_graphs(plan, weights, args.out, target=args.target, options=options, limits=limits,
                            attention=None if args.no_attention else attention, rotary=rotary, context=args.context,
                            all_tiers=args.all_tiers, cache=_cache(args.cache))
    secs = time.perf_counter() - t0
    hits = sum(g["cache_hit"] for g in manifest["graphs"])
    print(f"{len(manifest['graphs'])} {args.target} graphs in {args.out} ({hits} from cache) in {secs:.2f} s; "
          f"manifest: {Path(args.out) / 'manifest.json'}")
    bad = violations(manifest)
    if bad:
        raise NpuMoeError(f"{len(bad)} validation problem(s), first: {bad[0]}; see the manifest, change --layout/"
                          "--compress or the plan's groups")
    return 0


def _cache(root):
    return GraphCache(root) if root else None


def register_cli(subparsers) -> None:
    p = subparsers.add_parser("convert", help="build static NPU graphs (Core ML / ONNX) for a plan",
                              description=__doc__)
    p.add_argument("--plan", required=True, help="plan JSON from `npumoe-lab plan`")
    p.add_argument("--target", choices=TARGETS, default="coreml")
    p.add_argument("--out", required=True, help="output directory (artifacts + manifest.json)")
    p.add_argument("--model", default="tiny", help="'tiny' or a model directory (must match the plan)")
    p.add_argument("--platform", default=None, help="platform profile for limits (default: the plan's)")
    p.add_argument("--layout", choices=("conv", "bmm"), default="conv", help="Core ML expert layout (coreml only; default conv)")
    p.add_argument("--compress", choices=("none", "int8", "lut4", "lut6", "lut8"), default="none",
                   help="Core ML weight compression (coreml only)")
    p.add_argument("--compute-units", choices=("CPU_AND_NE", "CPU_ONLY", "CPU_AND_GPU", "ALL"), default="CPU_AND_NE",
                   help="stored in the Core ML package; load can override (coreml only)")
    p.add_argument("--all-tiers", action="store_true", help="add the layer's smaller tiers as functions of each group")
    p.add_argument("--no-attention", action="store_true", help="only the expert group graphs")
    p.add_argument("--context", type=int, default=2048, help="KV cache length of the attention graphs")
    p.add_argument("--cache", default=None, help="artifact cache dir (default $NPUMOE_GRAPH_CACHE or .graph-cache)")
    p.set_defaults(func=convert)
