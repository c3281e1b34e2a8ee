"""Qwen2-MoE (Qwen/Qwen1.5-MoE-A2.7B): Qwen3-MoE routing plus one dense shared expert whose output is scaled by
a sigmoid gate (`shared_expert_gate`); both stay in HF's block code."""
from __future__ import annotations

from npumoe_lab.models.base import Family
from npumoe_lab.models.qwen3_moe import reference_route, sparse_step_layers


def n_shared_experts(config) -> int:
    return 1 if (getattr(config, "shared_expert_intermediate_size", 0) or 0) > 0 else 0


FAMILY = Family(
    model_type="qwen2_moe",
    routing="softmax_topk",
    reference_route=reference_route,
    intermediate_key="moe_intermediate_size",
    shared_attr="shared_expert",
    shared_gate_attr="shared_expert_gate",
    moe_layers=sparse_step_layers,
    n_shared_experts=n_shared_experts,
)
