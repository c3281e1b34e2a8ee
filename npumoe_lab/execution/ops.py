"""Typed operation records and the per-chunk context: what the engine tells a clock, and what it is told.

Every op of a prefill (attention, router, dispatch, pack, one static group call, cold experts, scatter, the rest of
the chunk) is an `Op`: what ran, where (role), its shape and its cost (FLOPs, bytes, device calls). The engine
emits the same Ops whether the experts run on real tensors or only their routing is replayed (simulation), so a
`Clock` (clock.py) that turns Ops into timeline Events gives one timeline for both.

`ChunkContext` is what a prefill driver hands to the experts executor for one chunk (index, pad mask, past tokens,
the clock, whether numerics run). HF's experts forward cannot take extra arguments, so the driver makes it current
with `chunk_scope(ctx)` (a context variable) for the duration of the chunk's forward; simulation passes it directly.
"""
from __future__ import annotations

import contextlib
import contextvars
from dataclasses import dataclass

from npumoe_lab.devices.cost import OpCost
from npumoe_lab.errors import NpuMoeError

OP_KINDS = ("attention", "router", "shared_experts", "experts_hf", "dispatch", "pack", "expert_group",
            "experts_dynamic", "scatter", "other")
ROLES = ("npu", "cpu")


@dataclass(frozen=True)
class Op:
    """One operation of a prefill. `shape`: the dims the cost was computed from (e.g. (G, C, H, I) of a group)."""
    name: str            # event name: "attention", "group3", "cold", "spill", ...
    kind: str            # one of OP_KINDS
    role: str            # "npu" | "cpu"
    layer: int           # decoder layer; -1 for ops outside the layer stack
    chunk: int           # prefill chunk index
    cost: OpCost
    shape: tuple = ()

    def __post_init__(self):
        if self.kind not in OP_KINDS:
            raise NpuMoeError(f"op {self.name!r}: kind {self.kind!r} is unknown; use one of {OP_KINDS}")
        if self.role not in ROLES:
            raise NpuMoeError(f"op {self.name!r}: role {self.role!r} is unknown; use one of {ROLES}")


@dataclass
class ChunkContext:
    """One static prefill chunk as the experts executor sees it."""
    index: int                              # chunk number within the prefill
    past: int                               # real tokens before this chunk (KV cache length)
    n_real: int                             # real tokens in this chunk (the rest is padding)
    length: int                             # static chunk length (real + padding)
    clock: object                           # a clock.Clock: turns Ops into Events (NullClock: untimed)
    numerics: bool = True                   # False: replay routing only (simulation), no tensors computed
    dtype_bytes: int = 2                    # bytes per activation (and default weight) element on the device
    npu_weight_bytes: int | None = None     # stored weight element size on the NPU role (e.g. 1: int8), None: dtype

    def weight_bytes(self, role: str) -> int:
        """Bytes per weight element streamed by an op on `role`."""
        return (self.npu_weight_bytes or self.dtype_bytes) if role == "npu" else self.dtype_bytes

    @property
    def pad_mask(self) -> torch.Tensor | None:  # noqa: F821 (a string: torch loads only where numerics run)
        """[length] bool, True for the padding tokens after the real ones (None: no padding)."""
        if self.n_real == self.length:
            return None
        import torch     # lazy: ops are also built by a routing-only simulation, which never loads torch
        return torch.arange(self.length) >= self.n_real


@dataclass
class BatchChunkContext(ChunkContext):
    """One chunk of B independent, equally long sequences prefilled together (rows b*length ... (b+1)*length of
    the experts' input are sequence b). The executor runs each sequence on its own (its own capacities, drops and
    padding, its own clock in `clocks`): a batch is never pooled. `clock` records what the B share (hooks)."""
    clocks: tuple = ()

    def sequences(self) -> list[ChunkContext]:
        """The per-sequence contexts (the unbatched path's, each with its sequence's clock)."""
        return [ChunkContext(index=self.index, past=self.past, n_real=self.n_real, length=self.length, clock=c,
                             numerics=self.numerics, dtype_bytes=self.dtype_bytes,
                             npu_weight_bytes=self.npu_weight_bytes) for c in self.clocks]


_CURRENT: contextvars.ContextVar[ChunkContext | None] = contextvars.ContextVar("npumoe_chunk", default=None)


def current_chunk() -> ChunkContext | None:
    """The chunk being prefilled (None outside a prefill driver: plain forwards run untimed)."""
    return _CURRENT.get()


@contextlib.contextmanager
def chunk_scope(ctx: ChunkContext):
    token = _CURRENT.set(ctx)
    try:
        yield ctx
    finally:
        _CURRENT.reset(token)


__all__ = ["Op", "OP_KINDS", "ChunkContext", "BatchChunkContext", "current_chunk", "chunk_scope"]
