"""`npumoe-lab routing-import`: read routing captured by an inference tool (or a public routing file), check it
against a model geometry, and store it in the routing schema (docs/ROUTING.md) under data/routing/NAME."""
from __future__ import annotations

FORMAT_NAMES = ("llama-moe-trace", "vllm-routed-experts", "sglang-routed-experts", "sglang-eplb",
                "trtllm-expert-stats", "hf-router-logits", "npumoe", "olmoe-expert-counts", "mbolt-coactivation",
                "speculative-moe-jsonl", "vllm-moe-logger-jsonl")   # = routing_data.formats.FORMATS (no pandas here)


def routing_geometry(name_or_path):
    """The RoutingGeometry of a bundled geometry name or a config.json (sim.geometries reads it)."""
    # lazy: the command's own imports (--help loads none of them)
    from npumoe_lab.routing_data.schema import RoutingGeometry
    from npumoe_lab.sim.geometries import load_geometry
    name, _, geo = load_geometry(name_or_path, hf_config=False)
    s = geo.moe[0]
    return RoutingGeometry(name, tuple(x.layer for x in geo.moe), s.n_experts, s.top_k, bool(s.norm_topk_prob))


def _routing_import(a) -> int:
    # lazy: pandas and the readers load only when the command runs
    from npumoe_lab.routing_data.formats import import_routing
    geo = routing_geometry(a.model_geometry)
    prov = {k: v for k, v in (("model", a.model), ("tool_version", a.tool_version), ("text", a.text),
                              ("quantisation", a.quantisation), ("licence", a.licence), ("source", a.source)) if v}
    if a.note:
        prov["notes"] = list(a.note)
    data = import_routing(a.format, a.files, geo, prov, a.domain, a.phase)
    for w in data.warnings:
        print(f"warning: {w}")
    out = data.save(a.out)
    c = data.counts
    print(f"{data.kind}: {len(data.layers)} layers of {geo.name}, domains {', '.join(data.domains)}, "
          f"{int(c.drop_duplicates(['layer', 'domain', 'phase'])['tokens'].sum() / max(len(data.layers), 1))} "
          f"tokens per layer" + (f", {len(data.selections)} selections" if data.selections is not None else ""))
    for n in data.provenance["notes"]:
        print(f"note: {n}")
    print(f"wrote {out}")
    return 0


def register_cli(sub) -> None:
    p = sub.add_parser("routing-import", help="import routing traces/counts of llama.cpp, vLLM, SGLang, "
                                              "TensorRT-LLM, HF or public files into data/routing/NAME")
    p.add_argument("files", nargs="+", metavar="FILE", help="the tool's output file(s) (a folder for "
                                                            "trtllm-expert-stats and npumoe)")
    p.add_argument("--format", required=True, choices=FORMAT_NAMES, help="the tool / layout that wrote FILE")
    p.add_argument("--model-geometry", required=True,
                   help="bundled geometry name (see `npumoe-lab simulate --help`) or the model's config.json")
    p.add_argument("--out", required=True, help="new folder to write (e.g. data/routing/NAME)")
    p.add_argument("--domain", help="domain of every file (default: the file's own, else its file name)")
    p.add_argument("--phase", default="mixed", choices=("prefill", "decode", "mixed"),
                   help="phase where the format does not record it (default mixed)")
    p.add_argument("--model", help="provenance: the checkpoint (e.g. Qwen/Qwen3-30B-A3B)")
    p.add_argument("--tool-version", help="provenance: the tool's version or commit")
    p.add_argument("--text", help="provenance: what text was routed")
    p.add_argument("--quantisation", help="provenance: the weights' quantisation")
    p.add_argument("--licence", help="provenance: the licence of the source data")
    p.add_argument("--source", help="provenance: where the file came from (URL at a commit; default the paths given)")
    p.add_argument("--note", action="append", help="provenance: what the data can and cannot say (repeatable)")
    p.set_defaults(func=_routing_import)
