"""GPT-OSS (openai/gpt-oss-20b): router with bias; top-k on logits, softmax over those k. Experts are stored
transposed ([E,H,2I]) with gate/up interleaved, carry biases, and use the clamped "gpt_oss" activation
(HF's `GptOssExperts._apply_gate`). HF's GPT-OSS has no sdpa attention (sinks), hence eager in load_model."""
from __future__ import annotations

from npumoe_lab.models.base import Family, router_logits, topk_softmax


def reference_route(router, hidden):
    return topk_softmax(router_logits(router, hidden), router.top_k)  # router_logits adds router.bias


FAMILY = Family(model_type="gpt_oss", routing="topk_softmax", reference_route=reference_route,
                router_attr="router", act="gpt_oss", norm_topk_prob=lambda config: True)
