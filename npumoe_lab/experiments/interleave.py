"""Switch a model between variant configurations without rebuilding them, so that measured repeats can
interleave the variants (a slow spell of the host then hits every variant alike instead of one).

A configuration is what `attach` / `set_experts_implementation` left on the model: the workbench attachment
(with its executor, whose packed weights stay warm) or HF's own experts implementation.
"""
from __future__ import annotations

from npumoe_lab.execution.experts import IMPLEMENTATION, detach


def snapshot(model):
    """The model's current experts configuration."""
    return getattr(model, "_npumoe", None), getattr(model.config, "_experts_implementation", None)


def restore(model, snap) -> None:
    """Put the model back into a configuration taken by `snapshot` (the attachment object is reused as is)."""
    attachment, impl = snap
    if getattr(model, "_npumoe", None) is not attachment:
        detach(model)
        if attachment is not None:
            for h in attachment.handles:
                h.module._npumoe_handle = h
                h.module._npumoe_attachment = attachment
            model._npumoe = attachment
    model.set_experts_implementation(IMPLEMENTATION if attachment is not None else impl)
