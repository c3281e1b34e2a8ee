"""Random-weight models at a geometry (measure's grid, the CPU loop's held-out 2-layer Qwen3-30B-A3B model)."""
import pytest
import torch

from npumoe_lab.experiments.geometry_model import geometry_config, random_model
from npumoe_lab.models import find_moe_blocks


def test_seeded_scaled_and_distinct_weights():
    a, b = random_model("tiny", 1, torch.float32, seed=3), random_model("tiny", 1, torch.float32, seed=3)
    for (n, p), (_, q) in zip(a.named_parameters(), b.named_parameters()):
        assert torch.equal(p, q), n                                   # seeded: the same model twice
    ex = find_moe_blocks(a)[0].experts
    H = a.config.hidden_size
    assert ex.gate_up_proj.std().item() == pytest.approx(H ** -0.5, rel=0.05)     # fan-in scaled
    assert not torch.equal(ex.gate_up_proj[0], ex.gate_up_proj[1])                 # experts differ
    out = a(torch.randint(4, 100, (1, 32))).logits
    assert torch.isfinite(out).all() and len(a.model.layers) == 1


def test_geometry_config_of_the_bundled_qwen_geometry():
    c = geometry_config("qwen3-30b-a3b", 2)
    assert (c.num_hidden_layers, c.hidden_size, c.moe_intermediate_size, c.num_experts) == (2, 2048, 768, 128)
