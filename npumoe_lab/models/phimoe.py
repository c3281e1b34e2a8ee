"""PhiMoE (microsoft/Phi-3.5-MoE-instruct): "sparsemixer" top-2 routing. The forward path always uses HF's
router; `reference_route` copies HF's `sparsemixer` eval-mode math (no jitter, no Heun estimator) for tests.
Note the two weights do not sum to 1 and sparsemixer always picks exactly 2 experts."""
from __future__ import annotations

from typing import TYPE_CHECKING

from npumoe_lab.models.base import Family, router_logits

if TYPE_CHECKING:      # annotations only: the family registers without torch (geometries, simulation)
    import torch


def _masked_pick(scores, candidates, jitter_eps):
    """argmax of `candidates`, weight = softmax over candidates after masking every expert whose relative gap
    to that max (measured on the raw scores) exceeds 2 * jitter_eps."""
    import torch     # lazy: see the imports
    top, idx = candidates.max(dim=-1, keepdim=True)
    factor = scores.abs().clamp(min=top)
    far = ((top - scores) / factor) > (2 * jitter_eps)
    weight = torch.softmax(candidates.masked_fill(far, float("-inf")), dim=-1).gather(-1, idx)
    return idx, weight


def sparsemixer_eval(scores: torch.Tensor, jitter_eps: float):
    import torch     # lazy: see the imports
    idx1, w1 = _masked_pick(scores, scores, jitter_eps)
    idx2, w2 = _masked_pick(scores, scores.scatter(-1, idx1, float("-inf")), jitter_eps)
    return torch.cat([idx1, idx2], dim=-1), torch.cat([w1, w2], dim=-1)


def reference_route(router, hidden):
    return sparsemixer_eval(router_logits(router, hidden), router.router_jitter_noise)


FAMILY = Family(model_type="phimoe", routing="sparsemixer", reference_route=reference_route,
                router_attr="router", norm_topk_prob=lambda config: False,
                top_k=lambda config: 2)  # sparsemixer ignores num_experts_per_tok
