"""Readers for the layouts of public routing files (data/routing/SOURCES.md lists them) and the workbench's own:

- `olmoe-expert-counts`: allenai/OLMoE scripts/routing_output/*/expert_counts/DOMAIN.pkl, a pickled list of three
  `collections.Counter{expert: count}` for layers 0, 7 and 15 (its run_routing_analysis.py), read with the
  restricted unpickler; the domain is the file name;
- `mbolt-coactivation`: doramirdor/mbolt results/colibri-119/coactivation_*.json, per-layer `heat[E]` = decode
  tokens whose top-k holds each expert, with `k`, `n_expert_per_layer`, `n_decode_tokens`;
- `speculative-moe-jsonl`: Mario928/speculative-moe routing JSONL, one row per token and layer
  `{dataset, problem_id, layer, token_pos|token_idx, experts[K], gating_probs[K]}`;
- `vllm-moe-logger-jsonl`: weiran0129/vLLM-MoE-Logger Logs/moe_layer*.jsonl, a meta line then
  `{type: "route", req_id, token_idx, layer, topk_ids[K], topk_weights[K]}` (one layer per file);
- `npumoe`: a calibration profile folder of `npumoe-lab calibrate` (per-chunk counts, domain = its workload).
"""
from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import numpy as np
import pandas as pd

from npumoe_lab.routing_data.checks import check_topk, drop_leading_repeats, refuse
from npumoe_lab.routing_data.safe_pickle import load_restricted
from npumoe_lab.routing_data.schema import counts_frame, selections_frame

OLMOE_LAYERS = (0, 7, 15)      # run_routing_analysis.py dumps layer_counters[0], [7], [15]


def read_olmoe_counts(path, geo, domain, phase):
    where = Path(path)
    obj = load_restricted(where)
    if not isinstance(obj, list) or len(obj) != len(OLMOE_LAYERS) or not all(isinstance(c, Counter) for c in obj):
        refuse(where, f"expected a list of {len(OLMOE_LAYERS)} Counters (layers {OLMOE_LAYERS}), got "
                      f"{type(obj).__name__}{'' if not isinstance(obj, list) else f' of {len(obj)}'}")
    rows = []
    for layer, c in zip(OLMOE_LAYERS, obj):
        items = {int(k): int(v) for k, v in c.items()}
        tokens = sum(items.values()) // geo.top_k
        rows += [(layer, e, where.stem, "prefill", n, tokens) for e, n in items.items()]
    return None, counts_frame(rows), {"form": "list of 3 Counters (layers 0, 7, 15)"}


def read_mbolt(path, geo, domain, phase):
    where = Path(path)
    try:
        doc = json.loads(where.read_text())
    except json.JSONDecodeError as exc:
        refuse(where, f"not valid JSON ({exc.msg}); is the file truncated?")
    if not isinstance(doc, dict) or not isinstance(doc.get("layers"), list) or \
            not all(isinstance(x, dict) and "heat" in x and "layer" in x for x in doc["layers"]):
        refuse(where, "not a co-activation profile: expected {k, n_expert_per_layer, n_decode_tokens, "
                      "layers: [{layer, heat}]}")
    if int(doc.get("k", geo.top_k)) != geo.top_k or int(doc.get("n_expert_per_layer", geo.n_experts)) != geo.n_experts:
        refuse(where, f"k={doc.get('k')}, {doc.get('n_expert_per_layer')} experts do not match {geo.name} "
                      f"(top-{geo.top_k}, {geo.n_experts})")
    tokens = int(doc.get("n_decode_tokens") or 0)
    rows = []
    for x in doc["layers"]:
        heat = np.asarray(x["heat"], dtype=np.int64)
        if len(heat) != geo.n_experts:
            refuse(where, f"layer {x['layer']}: heat has {len(heat)} entries, {geo.name} has {geo.n_experts}")
        if tokens and heat.sum() != tokens * geo.top_k:
            refuse(where, f"layer {x['layer']}: heat sums to {heat.sum()}, not k x n_decode_tokens = "
                          f"{tokens * geo.top_k}")
        rows += [(int(x["layer"]), e, domain, "decode", int(heat[e]), tokens or int(heat.sum()) // geo.top_k)
                 for e in range(len(heat))]
    return None, counts_frame(rows), {"form": "co-activation heat", "model": doc.get("model"),
                                      "quantisation": doc.get("quant")}


def _jsonl(where):
    out = []
    with open(where) as fh:
        for i, line in enumerate(fh):
            if line.strip():
                try:
                    out.append(json.loads(line))
                except json.JSONDecodeError:
                    refuse(where, f"line {i + 1} is not JSON (a truncated JSONL?)")
    if not out:
        refuse(where, "empty file")
    return out


def _rows_to_frame(where, rows, geo, seg_key, tok_key, ids_key, w_key, dom, phase):
    for i, r in enumerate(rows):
        if not isinstance(r, dict) or not all(k in r for k in (tok_key, "layer", ids_key)):
            refuse(where, f"row {i + 1}: expected keys {tok_key}, layer, {ids_key} (got "
                          f"{sorted(r)[:6] if isinstance(r, dict) else type(r).__name__})")
        if len(r[ids_key]) != geo.top_k:
            refuse(where, f"row {i + 1}: {len(r[ids_key])} experts but {geo.name} routes top-{geo.top_k}")
    ids = np.asarray([r[ids_key] for r in rows], dtype=np.int64)
    w = np.asarray([r.get(w_key) or [np.nan] * geo.top_k for r in rows], dtype=np.float32)
    order = np.argsort(-np.nan_to_num(w, nan=0.0), axis=1, kind="stable")   # rank 0 = highest weight
    ids, w = np.take_along_axis(ids, order, 1), np.take_along_axis(w, order, 1)
    K = geo.top_k
    rep = lambda v: np.repeat(np.asarray(v), K)     # noqa: E731
    sel = selections_frame(rep([r["layer"] for r in rows]), rep([r[tok_key] for r in rows]),
                           rep([str(r.get(seg_key, 0)) for r in rows]),
                           rep([str(r.get("dataset", dom)) for r in rows]), phase, np.tile(np.arange(K), len(rows)),
                           ids.reshape(-1), w.reshape(-1))
    for layer, g in sel.groupby("layer"):
        if layer not in geo.moe_layers:
            refuse(where, f"layer {layer} is not a MoE layer of {geo.name}")
        check_topk(where, g["expert"].to_numpy().reshape(-1, K), geo, layer)
    if sel.duplicated(["segment", "phase", "token", "layer", "rank"]).any():
        refuse(where, "a (problem, token, layer) row appears twice")
    return sel


def _number_steps(rows, seg_key, tok_key):
    """Both vLLM loggers log the whole prompt (the prefill step) at one position, then one row per generated token:
    rows are renumbered in log order per (segment, layer), and the rows of a segment's first position, when it
    holds several, are marked prefill (the rest decode). Returns the per-row phases."""
    first, mult, phases, seq = {}, Counter((r.get(seg_key), r.get("layer"), r.get(tok_key)) for r in rows), [], Counter()
    for r in rows:
        seg = (r.get(seg_key), r.get("layer"))
        first.setdefault(seg, r.get(tok_key))
        pre = r.get(tok_key) == first[seg] and mult[(*seg, r.get(tok_key))] > 1
        phases.append("prefill" if pre else "decode")
        r[tok_key] = seq[seg]
        seq[seg] += 1
    return phases


def read_speculative_moe(path, geo, domain, phase):
    where = Path(path)
    rows = _jsonl(where)
    tok_key = "token_pos" if "token_pos" in rows[0] else "token_idx"
    phases = _number_steps(rows, "problem_id", tok_key)
    return [_rows_to_frame(where, rows, geo, "problem_id", tok_key, "experts", "gating_probs", domain,
                           np.repeat(np.asarray(phases, dtype=object), geo.top_k))], \
        None, {"form": f"JSONL {{dataset, problem_id, layer, {tok_key}, experts, gating_probs}} (the prompt's "
                       "tokens logged at one position: renumbered in log order)"}


def read_vllm_moe_logger(path, geo, domain, phase):
    where = Path(path)
    rows = [r for r in _jsonl(where) if isinstance(r, dict) and r.get("type", "route") == "route"]
    rows, warns = drop_leading_repeats(where, rows, lambda r: tuple(r.get("topk_ids") or ()))
    phases = _number_steps(rows, "req_id", "token_idx")
    return [_rows_to_frame(where, rows, geo, "req_id", "token_idx", "topk_ids", "topk_weights", domain,
                           np.repeat(np.asarray(phases, dtype=object), geo.top_k))], \
        None, {"form": "JSONL route rows (renumbered in log order)", "warnings": warns}


def read_npumoe(path, geo, domain, phase):
    d = Path(path)
    if not (d / "profile.json").is_file() or not (d / "counts.parquet").is_file():
        refuse(d, "not a calibration profile folder (profile.json + counts.parquet from `npumoe-lab calibrate`)")
    meta = json.loads((d / "profile.json").read_text())
    c = pd.read_parquet(d / "counts.parquet").groupby(["layer", "expert"], as_index=False)["count"].sum()
    dom = str(meta.get("workload") or domain)
    rows = []
    for layer, g in c.groupby("layer"):
        tokens = int(g["count"].sum()) // geo.top_k
        rows += [(int(layer), int(e), dom, "prefill", int(n), tokens) for e, n in zip(g["expert"], g["count"])]
    return None, counts_frame(rows), {"form": "calibration profile", "model": meta.get("model"),
                                      "chunk": meta.get("chunk")}


__all__ = ["read_olmoe_counts", "read_mbolt", "read_speculative_moe", "read_vllm_moe_logger", "read_npumoe"]
