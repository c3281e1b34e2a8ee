"""Build every graph a plan needs (resident groups + attention per layer) for one target, through the
content-addressed cache, validate each, and write `OUT/manifest.json` describing them.

A cached artifact keeps its validation report next to it (`report.json` in the key directory), so a rebuild of
an unchanged plan is: hash weights, look up, link files out; no conversion and no re-validation."""
from __future__ import annotations

import json
import time
from dataclasses import asdict
from pathlib import Path

from npumoe_lab.errors import NpuMoeError
from npumoe_lab.models import expert_weights, find_moe_blocks
from npumoe_lab.utils import progress, provenance
from npumoe_lab.graphs.cache import GraphCache, artifact_key, copy_artifact, weights_digest
from npumoe_lab.graphs.coreml import build_attention_package, build_group_package
from npumoe_lab.graphs.onnx import census, export_attention, export_group, rerun_group
from npumoe_lab.graphs.spec import (AttentionGraphSpec, Limits, canonical, decode_group_specs, field_of, group_specs,
                                   plan_chunks, subset)
from npumoe_lab.graphs.validate import validate_group_package
from npumoe_lab.graphs.validate_attention import validate_attention_package

TARGETS = ("coreml", "onnx")
DECODE_POLICIES = ("pipeline", "cpu", "npu-decode")   # = execution.decode_policy's (graphs sit below execution)


def _attn_digest(attn) -> str:
    return weights_digest(*[t for _, t in sorted(attn.state_dict().items())])


def _build_group(spec, w, target, options, limits, dst: Path) -> dict:
    """Build and validate one group artifact at dst (a path inside the cache's temp dir)."""
    if target == "coreml":
        build_group_package(w, spec.capacities, dst, options)
        reports = validate_group_package(dst, spec, w, options.layout, limits, options.compression)
        return {"functions": [asdict(r) for r in reports]}
    dst.mkdir(parents=True)
    out = []
    for cap in spec.capacities:
        f = export_group(w, cap, dst / f"cap{cap}.onnx")
        found, rerun = census(f), rerun_group(f, w, cap)
        out.append({"graph": spec.name, "function": f"cap{cap}", **found, **rerun,
                    "violations": found["violations"] + rerun["violations"]})
    return {"functions": out}


def _build_attention(spec, attn, rotary, target, options, limits, dst: Path) -> dict:
    if target == "coreml":
        build_attention_package(attn, spec.chunks, spec.context, dst, options)
        return {"functions": [asdict(r) for r in validate_attention_package(dst, spec, attn, rotary, limits)]}
    dst.mkdir(parents=True)
    out = []
    for s in spec.chunks:
        f = export_attention(attn, s, spec.context, dst / f"chunk{s}.onnx")
        out.append({"graph": spec.name, "function": f"chunk{s}", **census(f)})
    return {"functions": out}


def _cached(cache, key, suffix, build) -> tuple[Path, dict, bool, float]:
    t0 = time.perf_counter()

    def build_and_report(dst: Path):
        report = build(dst)
        (dst.parent / "report.json").write_text(json.dumps(report, indent=1, default=str))
    path, hit = cache.get_or_build(key, build_and_report, suffix)
    report = json.loads((path.parent / "report.json").read_text())
    return path, report, hit, time.perf_counter() - t0


def build_graphs(plan, weights: dict, out, *, target: str = "coreml", options=None, limits: Limits | None = None,
                 attention: dict | None = None, rotary=None, context: int = 2048, all_tiers: bool = False,
                 cache: GraphCache | None = None, decode_policy: str = "pipeline", decode_batch: int = 1) -> dict:
    """weights {layer: ExpertWeights of the whole layer}; attention {layer: HF attention module} (None: no
    attention graphs); rotary: the model's rotary embedding module (validation inputs). Returns the manifest.
    decode_policy: `pipeline` decodes on the prefill graphs at chunk shape (nothing added); `cpu` adds a one-token
    function to each attention graph; `npu-decode` that and one decode-shaped graph per resident group at capacity
    decode_batch, the step's tokens (kind "decode-group", named L<l>_g<g>_decode)."""
    if target not in TARGETS:
        raise NpuMoeError(f"unknown target {target!r}; use one of {TARGETS}")
    if target == "coreml":
        from npumoe_lab.graphs.coreml import CoreMLOptions  # coremltools itself is imported only if something must be built
        options = options or CoreMLOptions()
    opt_key = asdict(options) if options is not None else {}
    limits, cache, out = limits or Limits(), cache or GraphCache(), Path(out)
    if decode_policy not in DECODE_POLICIES:
        raise NpuMoeError(f"--decode-policy {decode_policy!r} is not a decode policy; use one of "
                          f"{', '.join(DECODE_POLICIES)}")
    specs = group_specs(plan, all_tiers=all_tiers, limits=limits, weights=weights)
    dspecs = decode_group_specs(plan, decode_batch, limits=limits, weights=weights) \
        if decode_policy == "npu-decode" else []
    missing = sorted({s.layer for s in specs} - set(weights))
    if missing:
        raise NpuMoeError(f"plan layers {missing} have no expert weights in the model; the plan does not match it")
    entries = _group_entries(specs, weights, target, options, opt_key, limits, cache, out, "group")
    entries += _group_entries(dspecs, weights, target, options, opt_key, limits, cache, out, "decode-group")
    if attention:
        # a decode step's attention is one token per sequence (its KV cache is its own), whatever the batch
        chunks = tuple(sorted({*plan_chunks(plan), *([1] if decode_policy != "pipeline" else [])}))
        if max(chunks) > context:
            raise NpuMoeError(f"chunk {max(chunks)} is longer than the KV context {context}; raise --context")
        for layer in progress(sorted(attention), desc=f"{target} attention graphs"):
            spec = AttentionGraphSpec(layer, chunks, int(context))
            attn = attention[layer]
            key = artifact_key(f"{target}-attention", _attn_digest(attn), asdict(spec),
                               {**opt_key, "limits": asdict(limits), "class": type(attn).__name__})
            suffix = ".mlpackage" if target == "coreml" else ""
            name = spec.name + suffix
            path, report, hit, secs = _cached(cache, key, suffix, lambda d, s=spec, a=attn: _build_attention(
                s, a, rotary, target, options, limits, d))
            entries.append({"kind": "attention", "layer": layer, "chunks": list(chunks), "context": int(context),
                            "key": key, "cache_hit": hit, "seconds": secs, "path": name, **report})
            copy_artifact(path, out / name)
    manifest = {"target": target, "plan_hash": field_of(plan, "hash"), "options": opt_key, "limits": asdict(limits),
                "decode": decode_manifest(decode_policy, decode_batch, plan, dspecs, bool(attention)),
                "graphs": entries, **provenance()}
    out.mkdir(parents=True, exist_ok=True)
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1, default=str))
    return manifest


def _group_entries(specs, weights, target, options, opt_key, limits, cache, out, kind) -> list[dict]:
    entries = []
    for spec in progress(specs, desc=f"{target} {kind} graphs"):
        w = subset(weights[spec.layer], spec.experts).contiguous()
        key = artifact_key(f"{target}-group", weights_digest(*canonical(w)), asdict(spec),
                           {**opt_key, "act": w.act, "alpha": w.alpha, "limit": w.limit, "limits": asdict(limits)})
        suffix = ".mlpackage" if target == "coreml" else ""
        name = spec.name + suffix
        path, report, hit, secs = _cached(cache, key, suffix,
                                          lambda d, s=spec, ww=w: _build_group(s, ww, target, options, limits, d))
        entries.append({"kind": kind, "layer": spec.layer, "group": spec.group, "experts": list(spec.experts),
                        "capacities": list(spec.capacities), "key": key, "cache_hit": hit, "seconds": secs,
                        "path": name, **report})
        copy_artifact(path, out / name)
    return entries


def decode_manifest(policy: str, batch: int, plan, dspecs, attention: bool) -> dict:
    """What the decode policy runs on, in words and names (the manifest's `decode`)."""
    chunks = plan_chunks(plan)
    if policy == "pipeline":
        note = (f"each decode step runs the prefill graphs at chunk shape {list(chunks)} (the token padded to the "
                "chunk): no graph added")
    elif policy == "cpu":
        note = ("experts on the CPU; attention graphs get a one-token function" if attention
                else "experts on the CPU: no graph added (--no-attention)")
    else:
        note = (f"{len(dspecs)} decode-shaped group graphs (capacity {batch}), cold groups on the CPU"
                + ("; attention graphs get a one-token function" if attention else ""))
    return {"policy": policy, "step_tokens": int(batch), "graphs": [s.name for s in dspecs], "note": note}


def model_parts(model) -> tuple[dict, dict, object]:
    """({layer: ExpertWeights}, {layer: attention module}, rotary embedding) of a loaded workbench model."""
    refs = find_moe_blocks(model)
    layers = model.base_model.layers
    weights = {r.layer: expert_weights(r.experts) for r in refs}
    attention = {r.layer: layers[r.layer].self_attn for r in refs if hasattr(layers[r.layer], "self_attn")}
    return weights, attention, getattr(model.base_model, "rotary_emb", None)


def violations(manifest: dict) -> list[str]:
    return [f"{f.get('graph')}/{f.get('function')}: {v}" for g in manifest["graphs"] for f in g["functions"]
            for v in f.get("violations", [])]
