"""Mixtral (mistralai/Mixtral-8x7B-v0.1): softmax in fp32 -> top-k -> always renormalised (the config has no
`norm_topk_prob`). Router jitter applies only in training. Every layer is MoE."""
from __future__ import annotations

from npumoe_lab.models.base import Family, router_logits, softmax_topk


def reference_route(router, hidden):
    return softmax_topk(router_logits(router, hidden), router.top_k, renorm=True)


FAMILY = Family(model_type="mixtral", routing="softmax_topk", reference_route=reference_route,
                norm_topk_prob=lambda config: True)
