"""Readers for the routing output of inference tools (formats read from each tool's code; docs/ROUTING.md):
each returns (selections frame or None, counts frame or None, facts) for one file; formats.py checks and merges.

- llama.cpp `moe-trace`: headerless `layer,expert` CSV (one row per routed activation: counts only), or the forks'
  `phase,token,layer,rank,expert` and `pos,layer,id0..id{k-1}` (negative pos = prefill) per-token CSVs;
- vLLM `routed_experts`: integer array [tokens, layers, top_k] as .npy, or JSON (the array, {"routed_experts": ...}
  or a list of request outputs), layers in the model's MoE-layer order;
- SGLang `meta_info.routed_experts`: base64 of int32 [tokens, layers, top_k] in a response JSON (or a list of them);
- SGLang EPLB recorder dump (.pt): `logical_count` [layers, experts] or [passes, layers, experts];
- TensorRT-LLM expert statistics: a folder with meta_info.json and rank*.safetensors keyed "{iter}_{layer}";
- HF `output_router_logits`: router logits per MoE layer [tokens, experts] (.safetensors/.npz keyed by layer
  index, or one [layers, tokens, experts] .npy), top-k taken by softmax order.
"""
from __future__ import annotations

import base64
import csv
import json
from pathlib import Path

import numpy as np

from npumoe_lab.routing_data.checks import check_topk, refuse
from npumoe_lab.routing_data.schema import RoutingGeometry, counts_frame, selections_frame


def _ints(where, line_no, row):
    try:
        return [int(x) for x in row]
    except ValueError:
        refuse(where, f"line {line_no}: {','.join(row)!r} is not integers (a truncated or corrupt CSV)")


def topk_frames(where, arr: np.ndarray, geo: RoutingGeometry, segment, domain, phase, weights=None, tokens=None,
                layers=None):
    """Selections of a [tokens, layers, K] array (layer axis = `layers`, default the geometry's MoE layers)."""
    arr = np.asarray(arr)
    if arr.ndim != 3:
        refuse(where, f"expected [tokens, layers, top_k] expert ids, got shape {arr.shape}")
    layers = list(geo.moe_layers) if layers is None else list(layers)
    if arr.shape[1] != len(layers):
        refuse(where, f"the array has {arr.shape[1]} layers but {geo.name} has {len(layers)} MoE layers; pass the "
                      "geometry of the model that made it")
    T, L, K = arr.shape
    for j in range(L):
        check_topk(where, arr[:, j, :], geo, layers[j])
    tok = np.arange(T) if tokens is None else np.asarray(tokens)
    ph = np.broadcast_to(np.asarray(phase, dtype=object), (T,)) if np.ndim(phase) else np.full(T, phase, object)
    return selections_frame(np.repeat(np.asarray(layers), T * K).reshape(L, T, K).transpose(1, 0, 2).reshape(-1),
                            np.repeat(tok, L * K), segment, domain, np.repeat(ph, L * K),
                            np.tile(np.arange(K), T * L), arr.reshape(-1).astype(np.int64),
                            None if weights is None else np.asarray(weights, dtype=np.float32).reshape(-1))


def read_llama_moe_trace(path, geo, domain, phase):
    where = Path(path)
    with open(path, newline="") as fh:
        rows = list(csv.reader(fh))
    rows = [r for r in rows if r]
    if not rows:
        refuse(where, "empty file")
    head = [c.strip() for c in rows[0]]
    if head[:2] == ["layer", "expert"] or all(c.lstrip("-").isdigit() for c in head):   # headerless layer,expert
        body = rows[1:] if head[:2] == ["layer", "expert"] else rows
        vals = [_ints(where, i + 1, r) for i, r in enumerate(body)]
        if any(len(v) != 2 for v in vals):
            i = next(i for i, v in enumerate(vals) if len(v) != 2)
            refuse(where, f"line {i + 1}: {len(vals[i])} fields, the headerless moe-trace form has 2 (layer,expert)")
        a = np.asarray(vals, dtype=np.int64)
        rows_out = []
        for layer in np.unique(a[:, 0]):
            ex = a[a[:, 0] == layer, 1]
            if len(ex) % geo.top_k:
                refuse(where, f"layer {layer} has {len(ex)} activations, not a multiple of top-{geo.top_k} "
                              "(a truncated trace, or another geometry)")
            if ex.min() < 0 or ex.max() >= geo.n_experts:
                refuse(where, f"expert id {int(ex.max())} at layer {layer} is outside 0..{geo.n_experts - 1}")
            c = np.bincount(ex, minlength=geo.n_experts)
            rows_out += [(int(layer), e, domain, phase, int(c[e]), len(ex) // geo.top_k) for e in range(len(c))]
        return None, counts_frame(rows_out), {"form": "layer,expert (headerless; no token or phase column)"}
    if head == ["phase", "token", "layer", "rank", "expert"]:
        vals = []
        for i, r in enumerate(rows[1:]):
            if len(r) != 5:
                refuse(where, f"line {i + 2}: {len(r)} fields, expected 5 (phase,token,layer,rank,expert)")
            vals.append((r[0].strip(), *_ints(where, i + 2, r[1:])))
        ph = np.array([v[0] for v in vals], dtype=object)
        a = np.array([v[1:] for v in vals], dtype=np.int64).reshape(-1, 4)
        bad = sorted(set(ph) - {"prefill", "decode"})
        if bad:
            refuse(where, f"phase {bad[0]!r} is neither prefill nor decode")
        order = np.lexsort((a[:, 2], a[:, 1], a[:, 0]))
        return _long(where, ph[order], a[order], geo, domain), None, {"form": "phase,token,layer,rank,expert"}
    if head[:2] == ["pos", "layer"] and all(h.startswith("id") for h in head[2:]):
        K = len(head) - 2
        vals = []
        for i, r in enumerate(rows[1:]):
            if len(r) != K + 2:
                refuse(where, f"line {i + 2}: {len(r)} fields, the header names {K + 2}")
            vals.append(_ints(where, i + 2, r))
        a = np.asarray(vals, dtype=np.int64).reshape(-1, K + 2)
        ph = np.where(a[:, 0] < 0, "prefill", "decode").astype(object)
        tok = np.where(a[:, 0] < 0, -a[:, 0] - 1, a[:, 0])
        long = np.stack([np.repeat(tok, K), np.repeat(a[:, 1], K), np.tile(np.arange(K), len(a)),
                         a[:, 2:].reshape(-1)], 1)
        return _long(where, np.repeat(ph, K), long, geo, domain), None, {"form": "pos,layer,id0.. (pos < 0: prefill)"}
    refuse(where, f"header {','.join(head)!r} is none of the moe-trace forms (layer,expert | "
                  "phase,token,layer,rank,expert | pos,layer,id0..)")


def _long(where, phase, a, geo, domain):
    """Selections from long rows (token, layer, rank, expert) + phase, checked per layer as [T, K]."""
    sel = selections_frame(a[:, 1], a[:, 0], "0", domain, phase, a[:, 2], a[:, 3])
    if sel.duplicated(["phase", "token", "layer", "rank"]).any():
        refuse(where, "a (phase, token, layer, rank) appears twice")
    for layer, g in sel.groupby("layer"):
        n = g.groupby(["phase", "token"]).size()
        if (n != geo.top_k).any():
            refuse(where, f"a token has {int(n[n != geo.top_k].iloc[0])} experts at layer {layer} but {geo.name} "
                          f"routes top-{geo.top_k} (a truncated trace, or another geometry)")
        check_topk(where, g.sort_values(["phase", "token", "rank"])["expert"].to_numpy().reshape(-1, geo.top_k),
                   geo, layer)
    sel["segment"] = sel["phase"]        # prefill and decode positions are counted separately
    return sel


def _json(where):
    try:
        return json.loads(Path(where).read_text())
    except json.JSONDecodeError as exc:
        refuse(where, f"not valid JSON ({exc.msg} at line {exc.lineno}); is the file truncated?")


def read_vllm(path, geo, domain, phase):
    where = Path(path)
    if where.suffix == ".npy":
        arrs = [(np.load(where, allow_pickle=False), None)]
    else:
        doc = _json(where)
        items = doc if isinstance(doc, list) and doc and isinstance(doc[0], dict) else [doc]
        arrs = []
        for it in items:
            if isinstance(it, dict):
                if "routed_experts" not in it:
                    refuse(where, f"JSON object without 'routed_experts' (keys: {sorted(it)[:6]}); give the array "
                                  "[tokens, layers, top_k] or CompletionOutput dicts")
                n_prompt = it.get("num_prompt_tokens") or len(it.get("prompt_token_ids") or []) or None
                arrs.append((it["routed_experts"], n_prompt))
            else:
                arrs.append((it, None))
    frames = []
    for i, (a, n_prompt) in enumerate(arrs):
        try:
            a = np.asarray(a, dtype=np.int64)
        except (ValueError, TypeError):
            refuse(where, "routed_experts is not a rectangular integer array [tokens, layers, top_k]")
        ph = phase if n_prompt is None else np.where(np.arange(len(a)) < n_prompt, "prefill", "decode")
        frames.append(topk_frames(where, a, geo, str(i), domain, ph))
    return frames, None, {"form": "routed_experts [tokens, layers, top_k]"}


def read_sglang(path, geo, domain, phase):
    where = Path(path)
    doc = _json(where)
    items = doc if isinstance(doc, list) else [doc]
    frames = []
    for i, it in enumerate(items):
        meta = it.get("meta_info", it) if isinstance(it, dict) else None
        if not isinstance(meta, dict) or not isinstance(meta.get("routed_experts"), str):
            refuse(where, "no meta_info.routed_experts (a base64 string) in the response JSON")
        try:
            raw = np.frombuffer(base64.b64decode(meta["routed_experts"], validate=True), dtype="<i4")
        except ValueError:
            refuse(where, f"response {i}: routed_experts is not base64 of int32")
        L, K = len(geo.moe_layers), geo.top_k
        if raw.size % (L * K):
            refuse(where, f"response {i}: {raw.size} ids are not a whole number of tokens x {L} layers x top-{K}")
        start = int(meta.get("routed_experts_start_len") or 0)
        a = raw.reshape(-1, L, K).astype(np.int64)
        tok = start + np.arange(len(a))
        n_prompt = meta.get("prompt_tokens")
        ph = phase if n_prompt is None else np.where(tok < int(n_prompt), "prefill", "decode")
        frames.append(topk_frames(where, a, geo, str(i), domain, ph, tokens=tok))
    return frames, None, {"form": "meta_info.routed_experts (base64 int32)"}


def read_sglang_eplb(path, geo, domain, phase):
    import torch       # lazy: only this format is a torch file (weights_only: no code runs)
    where = Path(path)
    try:
        doc = torch.load(where, map_location="cpu", weights_only=True)
    except Exception as exc:       # torch raises many types for a bad file; all mean the same to the user
        refuse(where, f"not a readable torch file with tensors only ({type(exc).__name__})")
    lc = doc.get("logical_count") if isinstance(doc, dict) else None
    if lc is None:
        refuse(where, "no 'logical_count' in the EPLB dump (expert_distribution_recorder_*.pt)")
    c = np.asarray(lc.cpu().numpy() if hasattr(lc, "numpy") else lc, dtype=np.int64)
    if c.ndim == 3:
        c = c.sum(0)
    if c.ndim != 2:
        refuse(where, f"logical_count has shape {c.shape}, expected [layers, experts] or [passes, layers, experts]")
    return None, _layer_counts(where, c, geo, list(geo.moe_layers), domain, phase), {"form": "logical_count"}


def _layer_counts(where, c: np.ndarray, geo, layers, domain, phase):
    if c.shape[0] != len(layers):
        refuse(where, f"{c.shape[0]} layers of counts but {geo.name} has {len(layers)} MoE layers")
    if c.shape[1] != geo.n_experts:
        refuse(where, f"{c.shape[1]} experts per layer but {geo.name} has {geo.n_experts}")
    rows = []
    for j, layer in enumerate(layers):
        tokens = int(round(c[j].sum() / geo.top_k))
        rows += [(int(layer), e, domain, phase, int(c[j, e]), tokens) for e in range(c.shape[1])]
    return counts_frame(rows)


def read_trtllm(path, geo, domain, phase):
    from safetensors.numpy import load_file     # lazy: only this format is safetensors
    d = Path(path)
    d = d.parent if d.name == "meta_info.json" else d
    if not (d / "meta_info.json").is_file():
        refuse(d, "no meta_info.json: give the EXPERT_STATISTIC_PATH folder")
    meta = _json(d / "meta_info.json")
    if meta.get("num_experts") not in (None, geo.n_experts) or meta.get("num_experts_per_token") not in (None, geo.top_k):
        refuse(d / "meta_info.json", f"num_experts {meta.get('num_experts')}, top-k "
                                     f"{meta.get('num_experts_per_token')} do not match {geo.name} "
                                     f"({geo.n_experts}, top-{geo.top_k})")
    files = sorted(p for p in d.glob("rank*.safetensors") if not p.stem.endswith(("_raw", "_numtokens")))
    if not files:
        refuse(d, "no rank*.safetensors")
    acc = {}
    for f in files:
        try:
            for key, t in load_file(f).items():
                it, _, layer = key.partition("_")
                if not (it.isdigit() and layer.isdigit()):
                    refuse(f, f"key {key!r} is not '{{iter}}_{{layer}}'")
                acc[int(layer)] = acc.get(int(layer), 0) + np.asarray(t, dtype=np.int64).reshape(-1)
        except (OSError, ValueError) as exc:
            refuse(f, f"not a readable safetensors file ({exc})")
    layers = sorted(acc)
    if any(len(acc[x]) != geo.n_experts for x in layers):
        refuse(d, f"per-layer counts are not {geo.n_experts} long")
    rows = []
    for layer in layers:
        tokens = int(round(acc[layer].sum() / geo.top_k))
        rows += [(layer, e, domain, phase, int(acc[layer][e]), tokens) for e in range(geo.n_experts)]
    return None, counts_frame(rows), {"form": "meta_info.json + rank*.safetensors", "meta_info": meta}


def read_hf_router_logits(path, geo, domain, phase):
    where = Path(path)
    if where.suffix == ".npy":
        stacked = np.load(where, allow_pickle=False)
        if stacked.ndim != 3:
            refuse(where, f"expected [layers, tokens, experts] router logits, got shape {stacked.shape}")
        per = {layer: stacked[j] for j, layer in enumerate(geo.moe_layers[:len(stacked)])}
        if len(stacked) != len(geo.moe_layers):
            refuse(where, f"{len(stacked)} layers of logits but {geo.name} has {len(geo.moe_layers)} MoE layers")
    else:
        if where.suffix == ".npz":
            with np.load(where, allow_pickle=False) as z:
                raw = {k: z[k] for k in z.files}
        else:
            from safetensors.numpy import load_file     # lazy: only this format is safetensors
            raw = load_file(where)
        keys = {k: k.rsplit(".", 1)[-1] for k in raw}
        if not all(v.isdigit() for v in keys.values()):
            refuse(where, "router-logit keys must end in the MoE layer index (e.g. '0', 'router_logits.3')")
        per = {int(keys[k]): v for k, v in raw.items()}
    frames = []
    K = geo.top_k
    for layer, lg in sorted(per.items()):
        lg = np.asarray(lg, dtype=np.float32)
        lg = lg[0] if lg.ndim == 3 and lg.shape[0] == 1 else lg
        if lg.ndim != 2 or lg.shape[1] != geo.n_experts:
            refuse(where, f"layer {layer}: logits of shape {lg.shape}, expected [tokens, {geo.n_experts}]")
        idx = np.argsort(-lg, axis=1, kind="stable")[:, :K]
        p = np.exp(lg - lg.max(1, keepdims=True))
        p /= p.sum(1, keepdims=True)
        w = np.take_along_axis(p, idx, 1)
        w = w / w.sum(1, keepdims=True) if geo.norm_topk_prob else w
        frames.append(topk_frames(where, idx[:, None, :], geo, "0", domain, phase, w[:, None, :], layers=[layer]))
    return frames, None, {"form": "router logits per MoE layer (top-k by softmax order)"}


__all__ = ["read_llama_moe_trace", "read_vllm", "read_sglang", "read_sglang_eplb", "read_trtllm",
           "read_hf_router_logits", "topk_frames"]
