"""Convenience entry points that combine the parts (kept tiny; the logic lives in the parts)."""
from __future__ import annotations

import torch

from .devices import get_platform
from .runtime import Clock, PrefillResult, chunked_prefill
from .timeline import schedule, summarize


def prefill(model, input_ids, chunk: int = 256, platform="cpu", attention: str = "npu",
            pad_token_id: int = 0) -> PrefillResult:
    """Chunked prefill of an (attached or plain) model, timed on `platform` (a name or a Platform, e.g. with
    overrides); `result.summary` holds TTFT etc."""
    plat = get_platform(platform) if isinstance(platform, str) else platform
    ids = torch.as_tensor(input_ids).reshape(1, -1)
    clock = Clock(plat, measured=plat.kind == "measured", attention_role=attention)
    res = chunked_prefill(model, ids, chunk, clock, measure_hf_experts=getattr(model, "_npumoe", None) is None,
                          pad_token_id=pad_token_id)
    res.events = schedule(res.events, npu_shares_cpu=plat.npu_shares_cpu)
    res.summary = summarize(res.events, plat, n_tokens=ids.shape[1])
    return res
