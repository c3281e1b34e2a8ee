"""OLMoE (allenai/OLMoE-1B-7B-0924): softmax -> top-k; renormalised only if `norm_topk_prob` (False in the
released checkpoint, so routed weights of a token sum to < 1). Every layer is MoE."""
from __future__ import annotations

from npumoe_lab.models.base import Family, router_logits, softmax_topk


def reference_route(router, hidden):
    return softmax_topk(router_logits(router, hidden), router.top_k, router.norm_topk_prob)


FAMILY = Family(model_type="olmoe", routing="softmax_topk", reference_route=reference_route)
