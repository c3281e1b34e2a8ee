"""Random-weight HF models at a named geometry (the bundled tiny model's, or a data/geometries/*.json one such as
Qwen3-30B-A3B), with fewer layers: what `measure` times its op grid on and what the CPU loop's held-out runs use.

Weights are seeded and fan-in scaled (tests/model_zoo.py's recipe): HF's init (std 0.02) gives near-uniform routing
and tiny expert outputs; scaled router logits make routing decisive and skewed like a trained model's.
"""
from __future__ import annotations

import json
from pathlib import Path

import torch

from npumoe_lab.errors import NpuMoeError
from npumoe_lab.models import find_moe_blocks
from npumoe_lab.models.loading import TINY_MODEL_DIR
from npumoe_lab.sim.geometries import load_geometry

TINY = "tiny"


def bundled_depth() -> int:
    """The bundled model's layer count (its config), the depth of the tiny geometry's measured prefills."""
    return int(json.loads((Path(TINY_MODEL_DIR) / "config.json").read_text())["num_hidden_layers"])


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


POOL = 1 << 22          # random values drawn once and copied (shifted) into every large tensor


@torch.no_grad()
def random_model(name: str, n_layers: int, dtype=torch.bfloat16, seed: int = 0):
    """Eval-mode causal LM of geometry `name` with random, fan-in scaled weights in `dtype`.

    HF's own init is skipped (drawing 1.2 G normal values for a 2-layer Qwen3-30B-A3B geometry takes minutes on 2
    cores): every matrix is filled from one seeded pool of POOL normal values, each tensor from its own offset, so
    weights differ across experts and layers at memcpy speed; norms are ones; routers get their own fan-in scaled
    draw (routing must be decisive and seeded)."""
    from transformers import AutoModelForCausalLM
    from transformers.initialization import no_init_weights   # lazy: transformers' init switch, only here
    config = geometry_config(name, n_layers)
    with no_init_weights():
        model = AutoModelForCausalLM.from_config(config, attn_implementation="eager", dtype=dtype)
    g = torch.Generator().manual_seed(seed)
    pool = torch.randn(POOL, generator=g)
    blocks = find_moe_blocks(model)
    routers = {id(ref.router.weight) for ref in blocks}
    transposed = {id(p) for ref in blocks if getattr(ref.experts, "is_transposed", False)     # [E, in, out]
                  for p in ref.experts.parameters()}
    for i, (pname, p) in enumerate(model.named_parameters()):
        if id(p) in routers:
            p.copy_((torch.randn(p.shape, generator=g) / p.shape[1] ** 0.5).to(p.dtype))
        elif p.dim() == 1:
            p.fill_(0.0 if pname.endswith("bias") else 1.0)
        else:
            fan_in = p.shape[-2] if id(p) in transposed else p.shape[-1]     # F.linear layout: [.., out, in]
            _fill_from_pool(p, pool, offset=(7919 * (i + 1)) % POOL, scale=fan_in ** -0.5)
    for b in model.buffers():          # rotary inverse frequencies etc. are computed, not initialised: keep them
        if not torch.isfinite(b.float()).all():
            raise NpuMoeError("a model buffer is not finite after construction; report this geometry")
    return model.eval().requires_grad_(False)


def _fill_from_pool(p: torch.Tensor, pool: torch.Tensor, offset: int, scale: float) -> None:
    flat = p.view(-1)
    n, pos = flat.numel(), 0
    src = torch.roll(pool, -offset).to(p.dtype) * scale
    while pos < n:
        k = min(n - pos, src.numel())
        flat[pos:pos + k].copy_(src[:k])
        pos += k


def random_ids(vocab: int, n: int, seed: int = 0) -> torch.Tensor:
    """[1, n] token ids drawn uniformly (seeded), avoiding the first few special ids."""
    g = torch.Generator().manual_seed(seed)
    return torch.randint(4, vocab, (1, n), generator=g)


__all__ = ["geometry_config", "random_model", "random_ids", "TINY", "bundled_depth"]
