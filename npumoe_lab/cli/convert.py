"""`npumoe-lab convert --plan P --target coreml --out DIR`: the static NPU graphs (Core ML or ONNX) of a plan."""
from __future__ import annotations

from pathlib import Path

from npumoe_lab.cli.decode_flags import DECODE_POLICIES
from npumoe_lab.errors import NpuMoeError

TARGETS = ("coreml", "onnx")       # = graphs.build.TARGETS (not imported: torch; tests/test_cli checks)


def _convert(args) -> int:
    import os
    if args.decode_policy not in DECODE_POLICIES:      # checked before the model loads: one line, exit 2
        raise NpuMoeError(f"--decode-policy {args.decode_policy!r} is not a decode policy; use one of "
                          f"{', '.join(DECODE_POLICIES)}")
    if args.decode_batch < 1:
        raise NpuMoeError(f"--decode-batch {args.decode_batch}: give the tokens of one decode step, a whole number >= 1")
    from npumoe_lab.graphs.convert import convert      # lazy: torch and coremltools/onnx load only when run
    if args.cache is None and not os.environ.get("NPUMOE_GRAPH_CACHE"):
        args.cache = str(Path(args.out) / ".graph-cache")    # convert writes only under --out unless told otherwise
    manifest = convert(args.plan, args.out, target=args.target, model=args.model, platform=args.platform,
                       layout=args.layout, compress=args.compress, compute_units=args.compute_units,
                       all_tiers=args.all_tiers, attention=not args.no_attention, context=args.context,
                       cache=args.cache, decode_policy=args.decode_policy, decode_batch=args.decode_batch)
    hits = sum(g["cache_hit"] for g in manifest["graphs"])
    print(f"{len(manifest['graphs'])} {args.target} graphs in {args.out} ({hits} from cache) in "
          f"{manifest['seconds']:.2f} s; manifest: {Path(args.out) / 'manifest.json'}")
    print(f"decode ({args.decode_policy}): {manifest['decode']['note']}")
    return 0


def register_cli(subparsers) -> None:
    p = subparsers.add_parser("convert", help="build static NPU graphs (Core ML / ONNX) for a plan",
                              description="Build, validate and cache every static graph of a plan (resident expert "
                                          "groups and per-layer attention), then write DIR/manifest.json.")
    p.add_argument("--plan", required=True, help="plan JSON from `npumoe-lab plan`")
    p.add_argument("--target", choices=TARGETS, default="coreml", help="graph format (default coreml)")
    p.add_argument("--out", required=True, help="output directory (artifacts + manifest.json)")
    p.add_argument("--model", default="tiny", help="'tiny' or a model directory (must match the plan)")
    p.add_argument("--platform", default=None, help="platform profile for limits (default: the plan's)")
    p.add_argument("--layout", choices=("conv", "bmm"), default="conv",
                   help="Core ML expert layout (coreml only; default conv)")
    p.add_argument("--compress", choices=("none", "int8", "lut4", "lut6", "lut8"), default="none",
                   help="Core ML weight compression (coreml only)")
    p.add_argument("--compute-units", choices=("CPU_AND_NE", "CPU_ONLY", "CPU_AND_GPU", "ALL"), default="CPU_AND_NE",
                   help="stored in the Core ML package; load can override (coreml only)")
    p.add_argument("--all-tiers", action="store_true", help="add the layer's smaller tiers as functions of each group")
    p.add_argument("--no-attention", action="store_true", help="only the expert group graphs")
    p.add_argument("--context", type=int, default=2048, help="KV cache length of the attention graphs")
    p.add_argument("--decode-policy", default="pipeline",
                   help="the decode steps' graphs too: pipeline (default: the prefill graphs at chunk shape, nothing "
                        "added), cpu (a one-token attention function), npu-decode (that and one decode-shaped graph "
                        "per resident group); docs/END_TO_END.md")
    p.add_argument("--decode-batch", type=int, default=1,
                   help="tokens of one decode step (sequences decoded together): npu-decode's group capacity")
    p.add_argument("--cache", default=None, help="artifact cache dir, shared by runs that name it (default $NPUMOE_GRAPH_CACHE, else OUT/.graph-cache)")
    p.set_defaults(func=_convert)
