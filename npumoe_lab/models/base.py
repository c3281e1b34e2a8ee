"""What the workbench knows about an HF MoE family: `Family` (one per file beside this one), the per-layer
`MoELayerSpec`, the `MoEBlockRef` handle, and plain-torch router references shared by several families.

The references exist only so tests can check captured routing against an implementation that is not HF's
code; the forward path always uses HF's own router."""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, NamedTuple

if TYPE_CHECKING:      # annotations only: torch loads where a router or a model runs, not for a geometry
    import torch
    from torch import nn

ROUTING_RULES = ("softmax_topk", "topk_softmax", "sparsemixer", "sigmoid_group_topk")
ACTIVATIONS = ("swiglu", "gpt_oss")


@dataclass(frozen=True)
class MoELayerSpec:
    """Geometry and routing rule of one MoE layer (what planning, packing and graphs need)."""
    layer: int
    n_experts: int
    top_k: int
    hidden: int
    intermediate: int
    routing: str            # one of ROUTING_RULES
    norm_topk_prob: bool    # routed weights of a token sum to 1 (before any routed_scaling_factor)
    n_shared_experts: int   # dense shared experts beside the routed ones (they stay in HF's block code)
    has_bias: bool
    act: str                # one of ACTIVATIONS
    family: str             # HF model_type


class MoEBlockRef(NamedTuple):
    layer: int
    block: nn.Module        # the sparse MoE block (router + experts [+ shared experts])
    experts: nn.Module      # decorated with HF `use_experts_implementation`
    router: nn.Module       # returns (router_logits [N,E], top_k_weights [N,K], top_k_index [N,K])


def _all_layers(config) -> list[int]:
    return list(range(config.num_hidden_layers))


def _config_norm_topk(config) -> bool:
    return bool(getattr(config, "norm_topk_prob", False))


def _no_shared(config) -> int:
    return 0


def _config_top_k(config) -> int:
    return int(config.num_experts_per_tok)


def _no_divisor(config) -> None:
    return None


@dataclass(frozen=True)
class Family:
    """Quirks of one HF `model_type`. Callables take the HF config (or, for reference_route, a router)."""
    model_type: str
    routing: str
    # reference_route(router_module, hidden [N,H]) -> (topk_idx [N,K] int64, topk_weight [N,K] float32)
    reference_route: Callable[[nn.Module, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]
    block_attr: str = "mlp"
    router_attr: str = "gate"
    intermediate_key: str = "intermediate_size"
    act: str = "swiglu"
    shared_attr: str | None = None          # module name of the shared expert(s) inside the block
    shared_gate_attr: str | None = None     # e.g. qwen2_moe's sigmoid gate on the shared expert
    norm_topk_prob: Callable[[object], bool] = _config_norm_topk
    moe_layers: Callable[[object], list[int]] = _all_layers
    n_shared_experts: Callable[[object], int] = _no_shared
    top_k: Callable[[object], int] = _config_top_k
    # what the *ForCausalLM divides its LM head's output by (None: nothing); execution/head.py applies it
    logits_divisor: Callable[[object], float | None] = _no_divisor

    def __post_init__(self):
        assert self.routing in ROUTING_RULES and self.act in ACTIVATIONS, (self.routing, self.act)


# ---- plain-torch router references (fp32, written from the routing rule, not copied from HF's classes) ----

def router_logits(router: nn.Module, hidden: torch.Tensor) -> torch.Tensor:
    """Logits of a linear router (weight [E,H], optional bias [E]) in float32."""
    logits = hidden.reshape(-1, router.weight.shape[1]).float() @ router.weight.float().T
    bias = getattr(router, "bias", None)
    return logits + bias.float() if bias is not None else logits


def softmax_topk(logits: torch.Tensor, k: int, renorm: bool):
    """Softmax over all experts, keep the k largest probabilities, optionally renormalise them to sum 1."""
    import torch     # lazy: the models package imports without torch (geometries, simulation)
    probs = torch.softmax(logits, dim=-1)
    weight, idx = probs.topk(k, dim=-1)
    if renorm:
        weight = weight / weight.sum(dim=-1, keepdim=True)
    return idx, weight


def topk_softmax(logits: torch.Tensor, k: int):
    """Keep the k largest logits, softmax over those k only (weights sum to 1 by construction)."""
    import torch     # lazy: as above
    top, idx = logits.topk(k, dim=-1)
    return idx, torch.softmax(top, dim=-1)
