"""Tiny random HF models, one per supported family (the mlx-lm test pattern: no downloads, seeded).

hidden 64, 2-3 layers, 8 experts, top-2, vocab 128. deepseek_v3 has a dense first layer and group-limited
top-k (2 groups of 4, 1 kept) with a non-zero e_score_correction_bias; qwen2_moe has a shared expert."""
from __future__ import annotations

import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer


FAMILY_NAMES = ("qwen3_moe", "qwen2_moe", "olmoe", "mixtral", "phimoe", "gpt_oss", "deepseek_v3", "granitemoe")

_COMMON = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
               vocab_size=128, num_experts_per_tok=2, max_position_embeddings=512, bos_token_id=1, eos_token_id=2,
               pad_token_id=0, tie_word_embeddings=False)
_PER_FAMILY = {
    "qwen3_moe": dict(num_experts=8, moe_intermediate_size=32, intermediate_size=128, norm_topk_prob=True),
    "qwen2_moe": dict(num_experts=8, moe_intermediate_size=32, intermediate_size=128,
                      shared_expert_intermediate_size=48, norm_topk_prob=False),
    "olmoe": dict(num_experts=8, intermediate_size=32, norm_topk_prob=False),
    "mixtral": dict(num_local_experts=8, intermediate_size=32),
    "phimoe": dict(num_local_experts=8, intermediate_size=32),
    "gpt_oss": dict(num_local_experts=8, intermediate_size=32, sliding_window=128,
                    rope_parameters={"rope_type": "default", "rope_theta": 10000.0}),
    "deepseek_v3": dict(n_routed_experts=8, moe_intermediate_size=32, intermediate_size=128, n_group=2, topk_group=1,
                        first_k_dense_replace=1, n_shared_experts=1, num_hidden_layers=3, q_lora_rank=32,
                        kv_lora_rank=16, qk_rope_head_dim=8, qk_nope_head_dim=8, v_head_dim=16, head_dim=8,
                        num_key_value_heads=4, routed_scaling_factor=2.5, norm_topk_prob=True),
    "granitemoe": dict(num_local_experts=8, intermediate_size=32),
}


def tiny_config(family: str, **overrides):
    return AutoConfig.for_model(family, **{**_COMMON, **_PER_FAMILY[family], **overrides})


def tiny_model(family: str, seed: int = 0, dtype=torch.float32, **overrides):
    """Eval-mode model with eager attention and HF's eager experts (the parity reference)."""
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(tiny_config(family, **overrides), attn_implementation="eager",
                                             experts_implementation="eager")
    from npumoe_lab.models import find_moe_blocks
    g = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for ref in find_moe_blocks(model):
            # HF's init (std 0.02) gives near-uniform routing; spread logits to ~unit scale so routing is decisive
            # and top-k ties between implementations are practically impossible
            w = ref.router.weight
            w.copy_(torch.randn(w.shape, generator=g) / w.shape[1] ** 0.5)
            if hasattr(ref.router, "e_score_correction_bias"):
                ref.router.e_score_correction_bias.copy_(0.1 * torch.randn(w.shape[0], generator=g))
            if getattr(ref.router, "bias", None) is not None:
                ref.router.bias.copy_(0.1 * torch.randn(w.shape[0], generator=g))
            # HF's std 0.02 makes expert outputs ~1e-3, too small for parity to notice a wrong expert; use
            # fan-in scaling so the experts dominate the residual stream
            for name in ("gate_up_proj", "down_proj"):
                p = getattr(ref.experts, name)
                fan_in = p.shape[1] if ref.experts.is_transposed else p.shape[2]
                p.copy_(torch.randn(p.shape, generator=g) / fan_in ** 0.5)
            for name in ("gate_up_proj_bias", "down_proj_bias"):
                b = getattr(ref.experts, name, None)
                if b is not None:
                    b.copy_(0.02 * torch.randn(b.shape, generator=g))
    return model.to(dtype).eval()


def token_batch(length: int, batch: int = 1, pad: int = 0, seed: int = 0):
    """(input_ids [B,T], attention_mask [B,T] or None). With batch 2 and pad > 0 the first row is left-padded."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, 128, (batch, length), generator=g)
    if batch == 1 and pad == 0:
        return ids, None
    mask = torch.ones(batch, length, dtype=torch.long)
    mask[0, :pad] = 0
    ids[0, :pad] = 0
    return ids, mask


def save_standin(out_dir, tokenizer_dir):
    """A small random Qwen3-MoE saved with the bundled tokenizer and context (2 layers, 16 experts, top-4): the
    same code path as the bundled model at a fraction of the cost. Router weights ~N(0, 0.3): decisive, skewed
    routing like a trained router."""
    tok = AutoTokenizer.from_pretrained(tokenizer_dir)
    real = AutoConfig.from_pretrained(tokenizer_dir)
    cfg = AutoConfig.for_model("qwen3_moe", vocab_size=real.vocab_size, hidden_size=64, num_hidden_layers=2,
                               num_attention_heads=4, num_key_value_heads=2, head_dim=16, num_experts=16,
                               num_experts_per_tok=4, moe_intermediate_size=32, intermediate_size=128,
                               max_position_embeddings=real.max_position_embeddings, norm_topk_prob=True,
                               tie_word_embeddings=True)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("gate.weight"):
                p.normal_(0, 0.3)
    model.save_pretrained(out_dir)
    tok.save_pretrained(out_dir)
    return out_dir
