"""The speed anchor: one fixed short prefill of the tiny geometry, timed beside the host speed probe in `measure` and
`run` (host_anchor_s). Why it exists and what it follows: devices/hostspeed.py (its `anchor_factor` turns two
readings into the factor validate-device --runs scales a price by)."""
from __future__ import annotations

import torch

from npumoe_lab.core.cpu_features import resolve_dtype
from npumoe_lab.devices import get_platform
from npumoe_lab.devices.hostspeed import geometry_key
from npumoe_lab.execution.runtime import PrefillConfig, run_prefill
from npumoe_lab.experiments.geometry_model import bundled_depth, geometry_config, random_ids, random_model

ANCHOR_TOKENS, ANCHOR_CHUNK = 256, 128
_STATE: dict = {}


def _anchor():
    """(model, ids, config), built once per process: the tiny geometry at the bundled model's depth, random seeded
    weights in this CPU's fast dtype, HF's eager experts, warmed up."""
    if "anchor" not in _STATE:
        model = random_model("tiny", bundled_depth(), resolve_dtype("auto"), seed=0)
        model.set_experts_implementation("eager")
        ids = random_ids(model.config.vocab_size, ANCHOR_TOKENS, seed=0)
        config = PrefillConfig(get_platform("cpu"), ANCHOR_CHUNK, attention="cpu")
        with torch.inference_mode():
            run_prefill(model, ids[:, :ANCHOR_CHUNK], config, measure_hf_experts=True)     # untimed warm-up
        _STATE["anchor"] = (model, ids, config)
    return _STATE["anchor"]


def anchor_s() -> float:
    """Seconds of the speed anchor: one fixed prefill of the tiny geometry (256 tokens in chunks of 128, HF eager
    experts, random weights, this CPU's fast dtype; ~65 ms on the 2-core EPYC), by the engine's clock."""
    model, ids, config = _anchor()
    with torch.inference_mode():
        return float(run_prefill(model, ids, config, measure_hf_experts=True).summary["ttft_s"])


def is_anchor_geometry(config) -> bool:
    """Whether a model of `config` has the anchor's geometry (the tiny one): only such runs are scaled by it."""
    return geometry_key(config) == geometry_key(geometry_config("tiny", 1))


__all__ = ["anchor_s", "is_anchor_geometry", "ANCHOR_TOKENS", "ANCHOR_CHUNK"]
