"""The workbench's experts implementation, registered with transformers' ExpertsInterface.

HF's router stays in charge of routing (so every family's quirks - sparsemixer, sigmoid + group top-k,
top-k-then-softmax - stay exact); the workbench only replaces what happens after routing. `attach` switches
a loaded model to it; the executor on the attachment decides the numerics: dropless by default, a plan's
static capacities/groups when `attach(model, plan)` is given, or an engine executor that also times and
places every op.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import torch
from transformers.integrations.moe import ALL_EXPERTS_FUNCTIONS

from npumoe_lab.execution.engine import PlanExecutor, as_layout
from npumoe_lab.errors import NpuMoeError
from npumoe_lab.models import find_moe_blocks, model_fingerprint
from npumoe_lab.models.weights import ExpertWeights, expert_weights
from npumoe_lab.core.packing import dropless_experts

IMPLEMENTATION = "npumoe"


@dataclass
class LayerHandle:
    """What the experts forward knows about its layer."""
    layer: int
    module: torch.nn.Module
    _weights: ExpertWeights | None = None

    @property
    def weights(self) -> ExpertWeights:
        if self._weights is None:
            self._weights = expert_weights(self.module)
        return self._weights


def dropless_executor(handle: LayerHandle, hidden, top_k_index, top_k_weights):
    return dropless_experts(handle.weights, hidden, top_k_index, top_k_weights)


@dataclass
class Attachment:
    previous: object                      # the experts implementation to restore on detach
    handles: list[LayerHandle]
    plan: object = None
    options: dict = field(default_factory=dict)
    executor: Callable = dropless_executor


def _npumoe_experts_forward(self, hidden_states, top_k_index, top_k_weights):
    handle = getattr(self, "_npumoe_handle", None)
    attachment = getattr(self, "_npumoe_attachment", None)
    if handle is None or attachment is None:      # module not attached (e.g. copied config): stay dropless
        return dropless_experts(expert_weights(self), hidden_states, top_k_index, top_k_weights)
    return attachment.executor(handle, hidden_states, top_k_index, top_k_weights)


ALL_EXPERTS_FUNCTIONS.register(IMPLEMENTATION, _npumoe_experts_forward)


def _experts_modules(model):
    return [(ref.layer, ref.experts) for ref in find_moe_blocks(model)]


def attach(model, plan=None, **options):
    """Switch a loaded HF MoE model to the workbench's experts path and return it.

    plan=None: dropless (capacity = actual load; logits equal HF's). With a Plan (or its ExecutionLayout), each
    MoE layer runs the plan's static capacities, saliency pruning and groups (options: see
    `npumoe_lab.execution.engine.PlanExecutor`); a plan calibrated on another model is rejected.
    """
    if getattr(model, "_npumoe", None) is not None:
        detach(model)
    modules = _experts_modules(model)
    if not modules:
        raise NpuMoeError(f"{type(model).__name__} has no MoE layers the workbench can attach to")
    previous = getattr(model.config, "_experts_implementation", None)
    handles = [LayerHandle(layer, mod) for layer, mod in modules]
    attachment = Attachment(previous=previous, handles=handles, plan=plan, options=dict(options))
    if plan is not None:
        layout = as_layout(plan)
        if layout.model_fingerprint is not None:
            layout.check_model(model_fingerprint(model))
        # group weights built and experts packed now, from what was prepared once per model and weight version
        # (weight_cache.py): a later attach with any plan or options reuses it
        attachment.executor = PlanExecutor(layout, handles, **options).prepare()
    for h in handles:
        h.module._npumoe_handle = h
        h.module._npumoe_attachment = attachment
    model.set_experts_implementation(IMPLEMENTATION)
    model._npumoe = attachment
    return model


def detach(model):
    """Restore HF's own experts implementation (the one active before `attach`)."""
    attachment = getattr(model, "_npumoe", None)
    if attachment is None:
        return model
    for h in attachment.handles:
        for attr in ("_npumoe_handle", "_npumoe_attachment"):
            if hasattr(h.module, attr):
                delattr(h.module, attr)
    model.set_experts_implementation(attachment.previous or "grouped_mm")
    model._npumoe = None
    return model


def set_executor(model, executor: Callable):
    """Swap the executor of an attached model (the engine does this around a timed prefill)."""
    attachment = getattr(model, "_npumoe", None)
    if attachment is None:
        raise NpuMoeError("the model is not attached to the workbench: call npumoe_lab.attach(model) first")
    previous, attachment.executor = attachment.executor, executor
    return previous
