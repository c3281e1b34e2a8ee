"""The import formats by name and `import_routing`: read each file, check it against the geometry, merge into one
RoutingData (selections and/or counts) with its provenance."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from npumoe_lab.errors import NpuMoeError
from npumoe_lab.routing_data import readers_public as pub
from npumoe_lab.routing_data import readers_tools as tools
from npumoe_lab.routing_data.checks import check_counts, check_layers, check_not_constant, refuse
from npumoe_lab.routing_data.schema import RoutingData, RoutingGeometry, counts_from_selections


@dataclass(frozen=True)
class Format:
    reader: object
    tool: str
    partial_layers: bool = False       # the source records only some layers by design (say so, do not refuse)


FORMATS = {
    "llama-moe-trace": Format(tools.read_llama_moe_trace, "llama.cpp moe-trace"),
    "vllm-routed-experts": Format(tools.read_vllm, "vLLM --enable-return-routed-experts"),
    "sglang-routed-experts": Format(tools.read_sglang, "SGLang return_routed_experts"),
    "sglang-eplb": Format(tools.read_sglang_eplb, "SGLang EPLB expert_distribution recorder"),
    "trtllm-expert-stats": Format(tools.read_trtllm, "TensorRT-LLM EXPERT_STATISTIC_PATH"),
    "hf-router-logits": Format(tools.read_hf_router_logits, "HF transformers output_router_logits"),
    "npumoe": Format(pub.read_npumoe, "npumoe-lab calibrate"),
    "olmoe-expert-counts": Format(pub.read_olmoe_counts, "allenai/OLMoE run_routing_analysis.py", True),
    "mbolt-coactivation": Format(pub.read_mbolt, "doramirdor/mbolt co-activation profile (llama.cpp)"),
    "speculative-moe-jsonl": Format(pub.read_speculative_moe, "Mario928/speculative-moe vLLM profiler"),
    "vllm-moe-logger-jsonl": Format(pub.read_vllm_moe_logger, "weiran0129/vLLM-MoE-Logger", True),
}


def import_routing(fmt: str, files, geo: RoutingGeometry, provenance: dict | None = None, domain: str | None = None,
                   phase: str = "mixed", partial_layers: bool | None = None) -> RoutingData:
    """Read `files` of format `fmt` (FORMATS), check each against `geo`, merge. `domain`: of every file (default:
    the file's own where the format names one, else its file name); `phase`: where the format does not say."""
    if fmt not in FORMATS:
        raise NpuMoeError(f"unknown routing format {fmt!r}; use one of {', '.join(FORMATS)}")
    if not files:
        raise NpuMoeError("routing-import needs at least one FILE")
    spec = FORMATS[fmt]
    partial = spec.partial_layers if partial_layers is None else partial_layers
    sels, counts, facts, warnings = [], [], {}, []
    for f in files:
        p = Path(f)
        if not p.exists():
            raise NpuMoeError(f"{p}: no such file")
        sel, cnt, fact = spec.reader(p, geo, domain or p.stem, phase)
        warnings += fact.pop("warnings", [])
        facts.update({k: v for k, v in fact.items() if v is not None})
        if sel is not None:
            frames = sel if isinstance(sel, list) else [sel]
            for fr in frames:
                fr["segment"] = f"{p.stem}:" + fr["segment"].astype(str)
            sels += frames
        if cnt is not None:
            counts.append(cnt)
    selections = pd.concat(sels, ignore_index=True) if sels else None
    where = ", ".join(str(f) for f in files) if len(files) <= 2 else f"{files[0]} (+{len(files) - 1} files)"
    if selections is not None:
        check_layers(where, selections["layer"], geo, partial)
        check_not_constant(where, selections)
        counts = counts_from_selections(selections)
        kind = "trace"
        per_layer = selections[selections["rank"] == 0].groupby("layer").size()
        if per_layer.nunique() > 1:
            warnings.append(f"{where}: layers hold {per_layer.min()}-{per_layer.max()} tokens (layer "
                            f"{per_layer.idxmin()} fewest): some tokens were not logged at some layers; each layer "
                            "replays its own tokens, none is filled in")
    else:
        counts = pd.concat(counts, ignore_index=True).groupby(["layer", "expert", "domain", "phase"],
                                                              as_index=False)[["count", "tokens"]].sum()
        if counts["domain"].nunique() < len(files) and fmt == "olmoe-expert-counts":
            refuse(where, "two files of one domain")
        kind = "counts"
    check_counts(where, counts, geo, partial)
    odd = [d for d in counts["domain"].unique() if any(ch in str(d) for ch in "+,=:")]
    if odd:
        refuse(where, f"domain name {odd[0]!r} holds one of + , = : (they separate routing-source fields); "
                      "rename it with --domain")
    layers = sorted(int(x) for x in counts["layer"].unique())
    prov = {"model": facts.pop("model", None), "tool": spec.tool, "tool_version": None, "text": None,
            "quantisation": facts.pop("quantisation", None), "phase": phase, "licence": None,
            "source": [str(f) for f in files], "format": fmt, **(provenance or {}),
            "geometry": {"name": geo.name, "moe_layers": list(geo.moe_layers), "n_experts": geo.n_experts,
                         "top_k": geo.top_k},
            "layers": layers, "domains": sorted(counts["domain"].unique().tolist()),
            "tokens": {str(d): int(g.groupby("layer")["tokens"].sum().max())
                       for d, g in counts.drop_duplicates(["layer", "domain", "phase"]).groupby("domain")},
            "reader": facts}
    missing = [x for x in geo.moe_layers if x not in layers]
    notes = list(prov.pop("notes", []) or [])
    if missing:
        notes.append(f"{len(layers)} of {len(geo.moe_layers)} MoE layers ({layers}); the others are filled from the "
                     "nearest measured layer where a routing source uses it")
    if kind == "counts":
        notes.append("per-expert counts only: no per-token or per-chunk structure (that comes from the text-like "
                     "model where a source needs it)")
    prov["notes"] = notes
    return RoutingData(kind, counts, prov, selections, warnings)


__all__ = ["FORMATS", "import_routing"]
