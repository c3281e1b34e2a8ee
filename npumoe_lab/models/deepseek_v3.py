"""DeepSeek-V3 (deepseek-ai/DeepSeek-V3): sigmoid scores; choice = scores + e_score_correction_bias; keep the
`topk_group` of `n_group` groups with the largest sum of their top-2 choices; top-k within them; weights are
the (uncorrected) scores, renormalised if `norm_topk_prob`, times `routed_scaling_factor`. The first
`first_k_dense_replace` layers are dense; MoE layers add `n_shared_experts` dense shared experts."""
from __future__ import annotations

from npumoe_lab.models.base import Family, router_logits


def reference_route(router, hidden):
    import torch     # lazy: the family registers without torch (geometries, simulation)
    scores = torch.sigmoid(router_logits(router, hidden))
    choice = scores + router.e_score_correction_bias.float()
    n, e = choice.shape
    groups = choice.view(n, router.num_group, e // router.num_group)
    group_score = groups.topk(2, dim=-1).values.sum(dim=-1)
    kept = group_score.topk(router.topk_group, dim=-1).indices
    group_ok = torch.zeros_like(group_score, dtype=torch.bool).scatter(1, kept, True)
    choice = choice.masked_fill(~group_ok.repeat_interleave(e // router.num_group, dim=1), float("-inf"))
    idx = choice.topk(router.top_k, dim=-1).indices
    weight = scores.gather(1, idx)
    if router.norm_topk_prob:
        weight = weight / (weight.sum(dim=-1, keepdim=True) + 1e-20)
    return idx, weight * router.routed_scaling_factor


FAMILY = Family(
    model_type="deepseek_v3",
    routing="sigmoid_group_topk",
    reference_route=reference_route,
    intermediate_key="moe_intermediate_size",
    shared_attr="shared_experts",
    moe_layers=lambda config: list(range(config.first_k_dense_replace, config.num_hidden_layers)),
    n_shared_experts=lambda config: int(getattr(config, "n_shared_experts", 0) or 0),
)
