"""Convenience entry points that combine the parts (kept tiny; the logic lives in the parts)."""
from __future__ import annotations

from npumoe_lab.execution.runtime import PrefillConfig, PrefillResult, run_prefill


def prefill(model, input_ids, chunk: int = 256, platform="cpu", attention: str = "npu",
            pad_token_id: int = 0) -> PrefillResult:
    """Chunked prefill of an (attached or plain) model, timed on `platform` (a name or a Platform, e.g. with
    overrides); `result.summary` holds TTFT etc."""
    return run_prefill(model, input_ids, PrefillConfig(platform, chunk, attention, pad_token_id))
