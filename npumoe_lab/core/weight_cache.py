"""Expert weights prepared for a kernel (oneDNN-packed, NPU precision) belong to the model, not to an attachment.

Preparing them is the expensive part of `attach(model, plan)` at real geometries (packing every expert of two
Qwen3-30B-A3B layers took ~3 s), and it depends only on the weights and the kernel, never on the plan or
the options. So the prepared copies are kept on the experts module itself, keyed by what they were made for, and
every later attach with any plan reuses them. They are dropped as soon as the module's weights change: the key
includes each parameter's storage address and autograd version counter, which in-place updates (`load_state_dict`,
an optimizer step, `p.copy_`), replaced parameters and dtype/device moves all change. HF's own parameters are
never modified; `detach` leaves them as they were. The engine's scratch buffers (packing.Workspace) live here
too: fresh ones are zero-filled pages on every prefill, so an attachment of its own would pay that each time.
"""
from __future__ import annotations

from typing import Callable

import torch

ATTR = "_npumoe_prepared"


def weights_version(module: torch.nn.Module) -> tuple:
    """Identity of the module's current weights: (address, version, dtype) per direct parameter and buffer."""
    tensors = list(module.parameters(recurse=False)) + list(module.buffers(recurse=False))
    return tuple((t.data_ptr(), t._version, t.dtype) for t in tensors)


def prepared(module: torch.nn.Module, key, build: Callable):
    """`build()`'s result for `key`, cached on `module` until its weights change (then every entry is rebuilt)."""
    version = weights_version(module)
    cache = module.__dict__.get(ATTR)
    if cache is None or cache["version"] != version:
        cache = module.__dict__[ATTR] = {"version": version, "items": {}}
    items = cache["items"]
    if key not in items:
        items[key] = build()
    return items[key]


def forget(module: torch.nn.Module) -> None:
    """Drop the module's prepared weights (frees their memory; the next attach prepares them again)."""
    module.__dict__.pop(ATTR, None)


__all__ = ["prepared", "weights_version", "forget"]
