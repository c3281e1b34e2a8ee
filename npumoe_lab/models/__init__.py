"""Model layer: which HF MoE families the workbench supports and how to find, describe and load them.
One file per family (named after HF `model_type`), the shared types in base.py, the registry in registry.py."""
from npumoe_lab.models.base import ACTIVATIONS, ROUTING_RULES, Family, MoEBlockRef, MoELayerSpec
from npumoe_lab.models.loading import TINY_MODEL_DIR, load_model
from npumoe_lab.models.registry import FAMILIES, describe, find_moe_blocks, get_family, model_fingerprint
from npumoe_lab.models.weights import ExpertWeights, expert_weights

__all__ = ["ACTIVATIONS", "ROUTING_RULES", "FAMILIES", "ExpertWeights", "Family", "MoEBlockRef", "MoELayerSpec",
           "TINY_MODEL_DIR", "describe", "expert_weights", "find_moe_blocks", "get_family", "load_model",
           "model_fingerprint"]
