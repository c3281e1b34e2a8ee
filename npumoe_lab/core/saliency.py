"""Saliency of routed assignments: which (token, expert) pairs survive when an expert's static capacity overflows.

A score is computed per assignment [T, K]; per expert the top-C assignments by score are kept, ties going to the
earlier token (then the lower top-k slot). `npumoe_lab.core.packing` implements the fast path; `reference_keep` here is
the slow, obviously-correct loop the packing tests compare against.

Rules (`SALIENCY_RULES`):
- `weight_x_norm` (default): router weight x L2 norm of the token's hidden state. The paper prunes by an
  "activation-based saliency score" without giving the formula (PAPER.md 3.2); this product is OUR reading: it
  ranks by how large the expert's contribution to the residual stream can be (gate weight scales the output,
  the input norm scales it too, the FFN being roughly homogeneous in its input).
- `router_weight`: the top-k gate weight alone (BPR-style, Tutel's batch prioritized routing).
- `activation_norm`: the L2 norm of the token's hidden state alone (same for all K slots of a token).
- `position`: Switch-style first come, first served: the earlier token has the higher score.
- `random`: uniform random scores from a seeded generator (the DeepSpeed RTS-like control).
"""
from __future__ import annotations

import numpy as np
import torch

from npumoe_lab.errors import NpuMoeError

SALIENCY_RULES = ("weight_x_norm", "router_weight", "activation_norm", "position", "random")


def check_rule(rule: str) -> str:
    if rule not in SALIENCY_RULES:
        raise NpuMoeError(f"unknown saliency rule {rule!r}; use one of: {', '.join(SALIENCY_RULES)}")
    return rule


def _as_float(x) -> torch.Tensor:
    t = torch.as_tensor(np.asarray(x) if not isinstance(x, torch.Tensor) else x)
    if not t.is_floating_point():
        t = t.float()
    return t.detach().to(torch.float32)


def saliency_scores(rule: str, topk_weight, hidden_norm=None, seed: int = 0) -> torch.Tensor:
    """Score per routed assignment, [T, K] float32; higher = keep. `topk_weight` [T, K], `hidden_norm` [T]
    (needed by the norm-based rules). The default `weight_x_norm` is OUR reading of the paper's "activation-based"
    saliency, which the paper does not fully specify (see the module docstring)."""
    check_rule(rule)
    w = _as_float(topk_weight)
    if w.ndim != 2:
        raise NpuMoeError(f"topk_weight must be [T, K], got shape {tuple(w.shape)}; pass one layer's routing")
    T, K = w.shape
    if rule in ("activation_norm", "weight_x_norm"):
        if hidden_norm is None:
            raise NpuMoeError(f"saliency rule {rule!r} needs hidden_norm [T]; pass the routing record's hidden_norm")
        n = _as_float(hidden_norm).reshape(-1)
        if n.shape[0] != T:
            raise NpuMoeError(f"hidden_norm has {n.shape[0]} tokens but topk_weight has {T}; pass the same tokens")
        n = n.to(w.device)
    if rule == "router_weight":
        return w.clone()
    if rule == "activation_norm":
        return n[:, None].expand(T, K).clone()
    if rule == "weight_x_norm":
        return w * n[:, None]
    if rule == "position":
        # T - t: token 0 scores highest; all K slots of a token share the score (they go to different experts)
        return (T - torch.arange(T, dtype=torch.float32, device=w.device))[:, None].expand(T, K).clone()
    gen = torch.Generator().manual_seed(int(seed))
    return torch.rand((T, K), generator=gen, dtype=torch.float32).to(w.device)


def reference_keep(topk_idx, scores, capacity) -> np.ndarray:
    """Plain-Python reference of capacity pruning: bool [T, K], True = the assignment is computed.
    Per expert e, the assignments routed to e are ranked by (score desc, token asc, slot asc) and the first
    capacity[e] are kept."""
    idx = np.asarray(topk_idx).tolist()
    sc = np.asarray(scores, dtype=np.float64).tolist()
    cap = [int(c) for c in np.asarray(capacity).reshape(-1)]
    by_expert: dict[int, list] = {}
    for t, row in enumerate(idx):
        for k, e in enumerate(row):
            if not 0 <= e < len(cap):
                raise NpuMoeError(f"expert index {e} at token {t} is outside the {len(cap)} capacities given; "
                                  "pass one capacity per expert")
            by_expert.setdefault(e, []).append((-sc[t][k], t, k))
    keep = [[False] * len(row) for row in idx]
    for e, items in by_expert.items():
        for _, t, k in sorted(items)[:cap[e]]:
            keep[t][k] = True
    return np.array(keep, dtype=bool).reshape(np.asarray(topk_idx).shape)


def drop_counts(kept, topk_idx, n_experts: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(dropped assignments per token [T], dropped assignments per expert [E]) from a keep mask [T, K]."""
    kept = np.asarray(kept, dtype=bool)
    idx = np.asarray(topk_idx)
    if kept.shape != idx.shape:
        raise NpuMoeError(f"kept mask {kept.shape} and topk_idx {idx.shape} differ in shape; pass the same layer")
    E = int(n_experts) if n_experts is not None else (int(idx.max()) + 1 if idx.size else 0)
    dropped = ~kept
    per_token = dropped.sum(axis=1).astype(np.int64)
    per_expert = np.bincount(idx[dropped].reshape(-1), minlength=E).astype(np.int64)
    return per_token, per_expert
