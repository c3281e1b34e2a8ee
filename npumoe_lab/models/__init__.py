"""Model layer: which HF MoE families the workbench supports and how to find, describe and load them.
One file per family (named after HF `model_type`), the shared types in base.py, the registry in registry.py.
Loading and weights (torch, transformers) are imported on first use (PEP 562 `__getattr__`): a geometry-only
simulation uses the families and layer specs without loading torch."""
import importlib

from npumoe_lab.models.base import ACTIVATIONS, ROUTING_RULES, Family, MoEBlockRef, MoELayerSpec
from npumoe_lab.models.registry import FAMILIES, describe, find_moe_blocks, get_family, model_fingerprint

_LAZY = {"TINY_MODEL_DIR": "loading", "load_model": "loading", "ExpertWeights": "weights",
         "expert_weights": "weights"}

__all__ = ["ACTIVATIONS", "ROUTING_RULES", "FAMILIES", "ExpertWeights", "Family", "MoEBlockRef", "MoELayerSpec",
           "TINY_MODEL_DIR", "describe", "expert_weights", "find_moe_blocks", "get_family", "load_model",
           "model_fingerprint"]


def __getattr__(name):
    if name in _LAZY:
        return getattr(importlib.import_module(f"npumoe_lab.models.{_LAZY[name]}"), name)
    raise AttributeError(f"module 'npumoe_lab.models' has no attribute {name!r}")
