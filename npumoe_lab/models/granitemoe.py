"""GraniteMoE (ibm-granite/granite-3.0-1b-a400m): top-k on the router logits, softmax over those k. The block
lives at `block_sparse_moe` (not `mlp`) and the router at `router`; the LM head's output is divided by
`logits_scaling`."""
from __future__ import annotations

from npumoe_lab.models.base import Family, router_logits, topk_softmax


def reference_route(router, hidden):
    return topk_softmax(router_logits(router, hidden), router.top_k)


FAMILY = Family(model_type="granitemoe", routing="topk_softmax", reference_route=reference_route,
                block_attr="block_sparse_moe", router_attr="router", norm_topk_prob=lambda config: True,
                logits_divisor=lambda config: config.logits_scaling)
