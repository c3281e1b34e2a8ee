"""Offline calibration (PAPER.md 3.1): run the model over calibration text in prefill chunks and record, per
(layer, expert, chunk), how many assignments the router sent there; plus per-expert saliency statistics and the
co-routing matrix (for coactivation grouping).

Documents are cut to whole chunks (up to the model context, rounded down to a multiple of `chunk`), and the KV
cache is carried from chunk to chunk within a document, so every chunk sees the context it would see in
chunked prefill. Only whole chunks are counted: per-chunk counts are comparable, and the total is `tokens`
rounded down to whole chunks (or less if the text runs out; `meta["n_tokens"]` says what was used).
"""
from __future__ import annotations

import inspect
import itertools
import math
import random
import time
import warnings

import numpy as np
import pandas as pd
import torch

from npumoe_lab.core.cpu_features import dtype_name
from npumoe_lab.errors import NpuMoeError
from npumoe_lab.planning.profile import CalibrationProfile
from npumoe_lab.models import describe, model_fingerprint
from npumoe_lab.execution.routing import RoutingRecorder
from npumoe_lab.execution.runtime import check_chunk, chunked_prefill
from npumoe_lab.workloads.texts import DOMAINS, bundled_text
from npumoe_lab.utils import cache_dir, progress, provenance
from npumoe_lab.workloads import get_workload, list_workloads
from npumoe_lab.workloads.base import bos_id, context_limit, encode

TEXT_WORKLOADS = ("mixed",)     # + every domain name of npumoe_lab.workloads.base.DOMAINS


# -- calibration text ------------------------------------------------------------------------------------
def model_context(model, tokenizer=None) -> int | None:
    ctx = getattr(getattr(model, "config", None), "max_position_embeddings", None)
    if ctx is None and tokenizer is not None:
        ctx = context_limit(tokenizer)
    return None if ctx is None else int(ctx)


def _text_documents(tokenizer, texts: dict, doc_len: int, chunk: int, seed: int) -> list[list[int]]:
    bos, rng, per_source = bos_id(tokenizer), random.Random(seed), []
    body = doc_len - len(bos)
    for text in texts.values():
        toks = encode(tokenizer, text) if text else []
        docs = [bos + toks[i:i + body] for i in range(0, len(toks), body)]
        docs = [d[:len(d) // chunk * chunk] for d in docs if len(d) >= chunk]
        rng.shuffle(docs)
        per_source.append(docs)
    # round-robin over the sources so that any token budget covers all of them evenly
    docs = [d for group in itertools.zip_longest(*per_source) for d in group if d is not None]
    if not docs:
        sizes = {k: len(v or "") for k, v in texts.items()}
        raise NpuMoeError(f"the calibration text is empty or shorter than one chunk of {chunk} tokens "
                          f"(characters per source: {sizes}); pass more text or a smaller chunk")
    return docs


def calibration_documents(tokenizer, workload: str, chunk: int, doc_len: int, tokens: int, seed: int = 0,
                          text=None) -> list[list[int]]:
    """Token documents for calibration, each a whole number of chunks: `text` (a string or {name: string}) when
    given, else the bundled calib text of a domain or of all of them ("mixed"), else a workload's samples."""
    if tokenizer is None:
        raise NpuMoeError("calibration needs the model's tokenizer; the model directory has none, add its "
                          "tokenizer files")
    if text is not None:
        return _text_documents(tokenizer, text if isinstance(text, dict) else {"text": text}, doc_len, chunk, seed)
    if workload in TEXT_WORKLOADS or workload in DOMAINS:
        names = DOMAINS if workload == "mixed" else (workload,)
        return _text_documents(tokenizer, {d: bundled_text(d, "calib") for d in names}, doc_len, chunk, seed)
    if workload not in list_workloads():
        raise NpuMoeError(f"unknown calibration workload {workload!r}; use 'mixed', a domain "
                          f"({', '.join(DOMAINS)}) or a workload ({', '.join(list_workloads())})")
    wl = get_workload(workload)
    prompt_len = min(doc_len - (wl.max_new_tokens + chunk - 1) // chunk * chunk, tokens // chunk * chunk)
    if prompt_len < chunk:
        raise NpuMoeError(f"workload {workload!r} leaves no room for one chunk of {chunk} tokens in the model "
                          f"context; use a smaller chunk")
    samples = wl.samples(tokenizer, prompt_len, math.ceil(tokens / prompt_len), seed)
    return [list(s.input_ids)[:len(s.input_ids) // chunk * chunk] for s in samples]


# -- running the model -----------------------------------------------------------------------------------
class _Accumulator:
    def __init__(self, specs, n_chunks: int):
        self.E = {s.layer: s.n_experts for s in specs}
        self.counts = {l: np.zeros((e, n_chunks), dtype=np.int64) for l, e in self.E.items()}
        self.stats = {l: np.zeros((4, e)) for l, e in self.E.items()}          # count, w, w^2, norm
        self.coact = {l: np.zeros((e, e), dtype=np.int64) for l, e in self.E.items()}

    def add(self, rec, chunk_id: int):
        E, mask = self.E[rec.layer], rec.token_mask.bool()
        # counted on the CPU whatever device the model ran on (a no-op for a CPU model)
        idx, w = rec.topk_idx.cpu()[mask], rec.topk_weight.cpu()[mask].double()
        norm = rec.hidden_norm.cpu()[mask].double()[:, None].expand_as(w)
        flat = idx.reshape(-1)
        self.counts[rec.layer][:, chunk_id] += torch.bincount(flat, minlength=E).numpy()
        for row, vals in enumerate((torch.ones_like(w), w, w * w, norm)):
            self.stats[rec.layer][row] += torch.bincount(flat, weights=vals.reshape(-1), minlength=E).numpy()
        onehot = torch.zeros(idx.shape[0], E, dtype=torch.float64).scatter_(1, idx, 1.0)
        self.coact[rec.layer] += (onehot.T @ onehot).round().long().numpy()

    def frames(self):
        counts, stats, coact = [], [], []
        for l, m in self.counts.items():
            E, C = m.shape
            counts.append(pd.DataFrame({"layer": l, "expert": np.repeat(np.arange(E), C),
                                        "chunk_id": np.tile(np.arange(C), E), "count": m.reshape(-1)}))
            s = self.stats[l]
            stats.append(pd.DataFrame({"layer": l, "expert": np.arange(E), "count": s[0].round().astype(np.int64),
                                       "weight_sum": s[1], "weight_sq_sum": s[2], "norm_sum": s[3]}))
            a, b = np.triu_indices(E, 1)
            c = self.coact[l][a, b]
            keep = c > 0
            coact.append(pd.DataFrame({"layer": l, "expert_a": a[keep], "expert_b": b[keep], "count": c[keep]}))
        return pd.concat(counts, ignore_index=True), pd.concat(stats, ignore_index=True), \
            pd.concat(coact, ignore_index=True)


def kv_cache_kwarg(model) -> str:
    """The forward keyword (and output attribute) of the KV cache: transformers v5 `cache`, older `past_key_values`."""
    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


def _run_chunks(model, docs, chunk: int, acc: _Accumulator, desc: str) -> None:
    """Prefill each document chunk by chunk (runtime.chunked_prefill: the one chunk loop), carrying the KV cache
    within a document; the routing of every chunk goes to `acc`, chunk ids running over all documents."""
    was_training = model.training
    bar = progress(total=sum(len(d) for d in docs) // chunk, desc=desc, unit="chunk")
    first = 0                        # chunk id of the current document's first chunk
    model.eval()                     # routing as in inference (no router noise / dropout)
    try:
        with RoutingRecorder(model) as rec:
            def take(c):
                for r in rec.records:
                    acc.add(r, first + c)
                rec.records.clear()
                bar.update(1)
            for doc in docs:         # a new document starts with an empty cache
                chunked_prefill(model, torch.tensor([doc]), chunk, on_chunk=take, keep_logits=False)
                first += len(doc) // chunk
    finally:
        bar.close()
        model.train(was_training)


@torch.no_grad()
def calibrate(model, tokenizer, workload: str = "mixed", chunk: int = 512, tokens: int = 16384, seed: int = 0,
              out=None, text=None) -> CalibrationProfile:
    """Calibration profile of `model` over `tokens` tokens of `workload` (a workload name, a domain name, or
    "mixed" = all bundled calib texts), in prefill chunks of `chunk`; saved to `out` when given."""
    check_chunk(chunk)
    ctx = model_context(model, tokenizer)
    if ctx is not None and chunk > ctx:
        raise NpuMoeError(f"chunk {chunk} is larger than the model context of {ctx} tokens; use chunk <= {ctx}")
    if tokens < chunk:
        raise NpuMoeError(f"tokens {tokens} is less than one chunk of {chunk}; ask for at least {chunk} tokens")
    doc_len = (ctx // chunk * chunk) if ctx is not None else max(chunk, tokens // chunk * chunk)
    docs, budget, used = calibration_documents(tokenizer, workload, chunk, doc_len, tokens, seed, text), \
        tokens // chunk * chunk, []
    for d in docs:                       # take whole chunks until the budget is spent
        take = min(len(d), budget - sum(map(len, used)))
        if take <= 0:
            break
        used.append(d[:take])
    n_tokens = sum(map(len, used))
    if n_tokens < budget:
        warnings.warn(f"calibration text gave {n_tokens} tokens of the {tokens} asked for; using {n_tokens}")
    specs = describe(model)
    acc = _Accumulator(specs, n_tokens // chunk)
    _run_chunks(model, used, chunk, acc, f"calibrate {workload}")
    counts, stats, coact = acc.frames()
    meta = {"model_fingerprint": model_fingerprint(model),
            "model": str(getattr(model.config, "_name_or_path", "") or type(model).__name__),
            "dtype": dtype_name(next(model.parameters()).dtype),    # what the routing was counted in (recorded)
            "workload": workload if text is None else "text", "chunk": chunk, "n_tokens": n_tokens,
            "requested_tokens": tokens, "n_chunks": n_tokens // chunk, "n_documents": len(used), "context": ctx,
            "seed": seed, "layers": [dict(vars(s)) for s in specs], **provenance(),
            "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    profile = CalibrationProfile(counts, stats, meta, coact)
    if out is not None:
        profile.save(out)
    return profile


def calibration_profile(model, tokenizer, workload: str, chunk: int, tokens: int, seed: int = 0):
    """Calibrate once per (model, workload, chunk, tokens); later runs load the saved profile."""
    d = cache_dir() / "profiles" / f"{model_fingerprint(model)[:16]}-{workload}-c{chunk}-n{tokens}-s{seed}"
    if (d / "profile.json").exists():
        return CalibrationProfile.load(d)
    profile = calibrate(model, tokenizer, workload=workload, chunk=chunk, tokens=tokens, seed=seed)
    profile.save(d)
    return profile
