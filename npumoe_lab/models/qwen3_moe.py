"""Qwen3-MoE (Qwen/Qwen3-30B-A3B): softmax over all experts -> top-k -> renormalise if `norm_topk_prob`.
Dense layers are those in `mlp_only_layers` or off the `decoder_sparse_step` grid."""
from __future__ import annotations

from npumoe_lab.models.base import Family, router_logits, softmax_topk


def sparse_step_layers(config) -> list[int]:
    """Layer i is MoE unless listed in mlp_only_layers or (i + 1) is off the decoder_sparse_step grid
    (the rule of Qwen2/Qwen3-MoE decoder layers)."""
    dense = set(getattr(config, "mlp_only_layers", None) or [])
    step = getattr(config, "decoder_sparse_step", 1) or 1
    if getattr(config, "num_experts", 0) <= 0:
        return []
    return [i for i in range(config.num_hidden_layers) if i not in dense and (i + 1) % step == 0]


def reference_route(router, hidden):
    return softmax_topk(router_logits(router, hidden), router.top_k, router.norm_topk_prob)


FAMILY = Family(
    model_type="qwen3_moe",
    routing="softmax_topk",
    reference_route=reference_route,
    intermediate_key="moe_intermediate_size",
    moe_layers=sparse_step_layers,
)
