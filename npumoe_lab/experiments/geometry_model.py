"""Random-weight HF models at a named geometry (the bundled tiny model's, or a data/geometries/*.json one such as
Qwen3-30B-A3B), with fewer layers: what `measure` times its op grid on and what the CPU loop's held-out runs use.

Weights are seeded and fan-in scaled (tests/model_zoo.py's recipe): HF's init (std 0.02) gives near-uniform routing
and tiny expert outputs; scaled router logits make routing decisive and skewed like a trained model's.
"""
from __future__ import annotations

import torch

from npumoe_lab.errors import NpuMoeError
from npumoe_lab.models import find_moe_blocks
from npumoe_lab.models.loading import TINY_MODEL_DIR
from npumoe_lab.sim.geometries import load_geometry

TINY = "tiny"


def geometry_config(name: str, n_layers: int):
    """HF config of geometry `name` ("tiny" = the bundled model's config, or a sim geometry) with n_layers layers."""
    from transformers import AutoConfig
    if isinstance(n_layers, bool) or not isinstance(n_layers, int) or n_layers < 1:
        raise NpuMoeError(f"n_layers must be an integer >= 1, got {n_layers!r}")
    if name == TINY:
        config = AutoConfig.from_pretrained(TINY_MODEL_DIR)
    else:
        _, config, _ = load_geometry(name)
    config.num_hidden_layers = n_layers
    if isinstance(getattr(config, "layer_types", None), list):   # per-layer attention kinds follow the depth
        config.layer_types = config.layer_types[:n_layers]
    return config


@torch.no_grad()
def random_model(name: str, n_layers: int, dtype=torch.bfloat16, seed: int = 0):
    """Eval-mode causal LM of geometry `name` with random, fan-in scaled weights in `dtype`."""
    from transformers import AutoModelForCausalLM
    config = geometry_config(name, n_layers)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, attn_implementation="eager", dtype=dtype).eval()
    g = torch.Generator().manual_seed(seed + 1)
    for ref in find_moe_blocks(model):
        w = ref.router.weight
        w.copy_((torch.randn(w.shape, generator=g) / w.shape[1] ** 0.5).to(w.dtype))
        for attr in ("gate_up_proj", "down_proj"):
            p = getattr(ref.experts, attr)
            fan_in = p.shape[1] if getattr(ref.experts, "is_transposed", False) else p.shape[2]
            p.copy_((torch.randn(p.shape, generator=g) / fan_in ** 0.5).to(p.dtype))
    return model.requires_grad_(False)


def random_ids(vocab: int, n: int, seed: int = 0) -> torch.Tensor:
    """[1, n] token ids drawn uniformly (seeded), avoiding the first few special ids."""
    g = torch.Generator().manual_seed(seed)
    return torch.randint(4, vocab, (1, n), generator=g)


__all__ = ["geometry_config", "random_model", "random_ids", "TINY"]
