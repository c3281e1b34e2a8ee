"""Validation of an attention package: census/static checks per chunk function, and a NumPy re-execution of
two consecutive chunks (the second reads the KV state the first wrote) against HF's own attention forward over
the whole sequence."""
from __future__ import annotations

import numpy as np
import torch

from npumoe_lab.graphs.milnumpy import load_program, run_function
from npumoe_lab.graphs.modules import MASK_MIN, chunk_inputs
from npumoe_lab.graphs.spec import Limits
from npumoe_lab.graphs.validate import check_function, rel_err

TOLERANCE = 1e-2


def rope(rotary, positions, head_dim: int, context: int):
    """cos, sin [S, D] at `positions`: the model's own rotary module when given (any RoPE variant), else default."""
    if rotary is None:
        cos, sin, _, _ = chunk_inputs(positions, context, head_dim)
        return cos, sin
    pos = torch.as_tensor(list(positions))[None]
    cos, sin = rotary(torch.zeros(1, pos.shape[1], 1), pos)
    return cos[0].float(), sin[0].float()


@torch.no_grad()
def hf_attention(attn, x, cos, sin) -> np.ndarray:
    """HF's attention module on the whole sequence x [1, N, H] with a causal mask (the reference)."""
    n = x.shape[1]
    mask = torch.triu(torch.full((n, n), MASK_MIN), diagonal=1)[None, None]
    out = attn(hidden_states=x, position_embeddings=(cos[None], sin[None]), attention_mask=mask)
    return (out[0] if isinstance(out, tuple) else out)[0].float().numpy()


def validate_attention_package(path, spec, attn, rotary=None, limits: Limits | None = None, seed: int = 0):
    limits = limits or Limits()
    prog = load_program(path)
    reports = []
    head_dim = int(attn.head_dim)
    n_kv = attn.k_proj.out_features // head_dim
    hidden = attn.q_proj.in_features
    for s in spec.chunks:
        fname = f"chunk{int(s)}"
        rep = check_function(prog, fname, spec.name, limits)
        n_chunks = 2 if 2 * s <= spec.context else 1
        x = torch.randn(1, n_chunks * s, hidden, generator=torch.Generator().manual_seed(seed))
        x = x.half().float()  # the graph sees fp16 inputs: give the reference the same ones
        cos_all, sin_all = rope(rotary, range(n_chunks * s), head_dim, spec.context)
        ref = hf_attention(attn, x, cos_all, sin_all)
        states = {n: np.zeros((1, n_kv, spec.context, head_dim), np.float32) for n in ("k_cache", "v_cache")}
        outs = []
        for c in range(n_chunks):
            pos = range(c * s, (c + 1) * s)
            _, _, mask, write = chunk_inputs(pos, spec.context, head_dim)
            feed = {"x": x[:, c * s:(c + 1) * s].numpy(), "cos": cos_all[c * s:(c + 1) * s].numpy(),
                    "sin": sin_all[c * s:(c + 1) * s].numpy(), "mask": mask.numpy(), "write": write.numpy()}
            outs.append(run_function(prog, fname, feed, states)["y"][0])
        rep.rel_err = rel_err(np.concatenate(outs, 0), ref)
        if not np.isfinite(rep.rel_err) or rep.rel_err > TOLERANCE:
            rep.violations.append(f"NumPy re-execution differs from HF attention: rel err {rep.rel_err:.3g} > {TOLERANCE}")
        reports.append(rep)
    return reports
