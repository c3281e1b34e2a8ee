"""The saliency rules' names, apart from their torch implementations (core/saliency.py): the plan knobs and the
CLI's flags list them without importing torch."""
from __future__ import annotations

from npumoe_lab.errors import NpuMoeError

SALIENCY_RULES = ("weight_x_norm", "router_weight", "activation_norm", "position", "random")


def check_rule(rule: str) -> str:
    if rule not in SALIENCY_RULES:
        raise NpuMoeError(f"unknown saliency rule {rule!r}; use one of: {', '.join(SALIENCY_RULES)}")
    return rule
