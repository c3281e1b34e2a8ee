"""Registry of supported HF MoE families (keyed by `model_type`) and the model-level queries built on it:
`get_family`, `find_moe_blocks`, `describe`, `model_fingerprint`."""
from __future__ import annotations

import hashlib
import json
from typing import TYPE_CHECKING

from npumoe_lab.errors import NpuMoeError
from npumoe_lab.models import deepseek_v3, gpt_oss, granitemoe, mixtral, olmoe, phimoe, qwen2_moe, qwen3_moe
from npumoe_lab.models.base import Family, MoEBlockRef, MoELayerSpec

if TYPE_CHECKING:      # annotations only: torch loads where a model is fingerprinted, not for a geometry
    import torch
    from torch import nn

FAMILIES: dict[str, Family] = {m.FAMILY.model_type: m.FAMILY for m in (
    qwen3_moe, qwen2_moe, olmoe, mixtral, phimoe, gpt_oss, deepseek_v3, granitemoe)}

# config keys that are runtime switches or provenance, not part of what the model computes
_VOLATILE_CONFIG_KEYS = {"transformers_version", "dtype", "torch_dtype", "output_router_logits", "use_cache",
                         "output_attentions", "output_hidden_states", "return_dict"}


def get_family(model_or_config) -> Family:
    """Family of a model, an HF config, or a `model_type` string."""
    config = getattr(model_or_config, "config", model_or_config)
    model_type = config if isinstance(config, str) else getattr(config, "model_type", None)
    if model_type not in FAMILIES:
        raise NpuMoeError(f"model_type {model_type!r} is not supported; supported MoE families: "
                          f"{', '.join(sorted(FAMILIES))} (add a file under npumoe_lab/models/ for a new one)")
    return FAMILIES[model_type]


def _decoder_layers(model: nn.Module):
    layers = getattr(getattr(model, "base_model", model), "layers", None)
    if layers is None:
        raise NpuMoeError(f"{type(model).__name__} has no decoder `layers`; pass a model from load_model() or an "
                          f"HF *ForCausalLM of a supported family")
    return layers


def find_moe_blocks(model: nn.Module) -> list[MoEBlockRef]:
    """One MoEBlockRef per MoE layer, in layer order (dense layers are skipped)."""
    family = get_family(model)
    refs = []
    for i, layer in enumerate(_decoder_layers(model)):
        block = getattr(layer, family.block_attr, None)
        experts = getattr(block, "experts", None)
        router = getattr(block, family.router_attr, None)
        # fused 3-D experts are what HF's experts interface (and so the workbench) dispatches on
        if experts is not None and router is not None and hasattr(experts, "gate_up_proj"):
            refs.append(MoEBlockRef(i, block, experts, router))
    return refs


def describe(model: nn.Module) -> list[MoELayerSpec]:
    family, config = get_family(model), model.config
    return [MoELayerSpec(
        layer=ref.layer,
        n_experts=int(ref.experts.num_experts),
        top_k=int(family.top_k(config)),
        hidden=int(config.hidden_size),
        intermediate=int(getattr(config, family.intermediate_key)),
        routing=family.routing,
        norm_topk_prob=bool(family.norm_topk_prob(config)),
        n_shared_experts=int(family.n_shared_experts(config)),
        has_bias=bool(ref.experts.has_bias),
        act=family.act,
        family=family.model_type,
    ) for ref in find_moe_blocks(model)]


def _hash_bf16(h, t: torch.Tensor, block_bytes: int = 1 << 26) -> None:
    """h.update with t's values rounded to bf16 (t's bytes as is when not floating), in slices of at most
    `block_bytes`: the digest of the whole tensor's bytes, with no whole-size copy (1.6 GB for one expert stack of
    the Qwen3-30B-A3B geometry in fp32)."""
    import torch     # lazy: the registry answers geometry questions without torch
    flat = t.detach().reshape(-1)
    step = max(1, block_bytes // max(1, flat.element_size()))
    for i in range(0, flat.numel(), step):
        part = flat[i:i + step]
        part = part.to(torch.bfloat16) if part.is_floating_point() else part
        h.update(part.cpu().contiguous().view(torch.uint8).numpy())


def model_fingerprint(model: nn.Module, refresh: bool = False) -> str:
    """sha256 over the model's config (without runtime switches, paths and private keys) and every tensor in its
    state_dict (name, shape, and its values rounded to bf16). So the dtype a run computes in does not change it:
    the fp32 and bf16 loads of a checkpoint share it, and every load of an fp16 checkpoint (calibrate in one
    dtype, run in another); any change of the weights above bf16 precision changes it. (An fp16 load of an fp32
    checkpoint rounds, and underflows, weights differently: its fingerprint differs.) Cached on the model: pass
    refresh=True after changing weights."""
    cached = getattr(model, "_npumoe_fingerprint", None)
    if cached and not refresh:
        return cached
    config = {k: v for k, v in model.config.to_dict().items()
              if not k.startswith("_") and k not in _VOLATILE_CONFIG_KEYS}
    h = hashlib.sha256(json.dumps(config, sort_keys=True, default=str).encode())
    for name, tensor in sorted(model.state_dict().items()):
        h.update(f"{name}|{tuple(tensor.shape)}|".encode())
        _hash_bf16(h, tensor)
    model._npumoe_fingerprint = h.hexdigest()
    return model._npumoe_fingerprint
