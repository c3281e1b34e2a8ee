"""Expert weights of one HF experts module in the workbench's canonical orientation (y = x @ W).

transformers v5 fuses experts into 3-D parameters whose layout differs per family: most store
`gate_up_proj [E, 2I, H]` (F.linear layout, gate rows then up rows) and `down_proj [E, H, I]`; gpt_oss
stores them transposed (`[E, H, 2I]`, `[E, I, H]`) with gate/up interleaved, biases and a clamped GLU.
Everything downstream (packing, static group graphs, Core ML/ONNX builders) reads weights through here.
Views are returned where the layout allows, so reading weights costs no copy.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from npumoe_lab.errors import NpuMoeError


@dataclass(frozen=True)
class ExpertWeights:
    gate_up: torch.Tensor            # [E, H, 2I] in the module's own column order (concatenated or interleaved)
    down: torch.Tensor               # [E, I, H]
    b_gate_up: torch.Tensor | None   # [E, 2I]
    b_down: torch.Tensor | None      # [E, H]
    apply_gate: Callable             # HF's own activation on the gate_up output (exact per family)
    concatenated: bool               # gate/up as [gate | up] (True) or interleaved g0,u0,g1,u1 (False)
    act: str                         # "swiglu" | "gpt_oss"
    alpha: float | None = None       # gpt_oss glu: gate * sigmoid(alpha * gate)
    limit: float | None = None       # gpt_oss clamp

    @property
    def n_experts(self) -> int:
        return self.gate_up.shape[0]

    @property
    def hidden(self) -> int:
        return self.gate_up.shape[1]

    @property
    def intermediate(self) -> int:
        return self.down.shape[1]

    def _split(self, t: torch.Tensor):
        if self.concatenated:
            i = t.shape[-1] // 2
            return t[..., :i], t[..., i:]
        return t[..., ::2], t[..., 1::2]

    @property
    def w_gate(self) -> torch.Tensor:   # [E, H, I]
        return self._split(self.gate_up)[0]

    @property
    def w_up(self) -> torch.Tensor:     # [E, H, I]
        return self._split(self.gate_up)[1]

    @property
    def b_gate(self):
        return None if self.b_gate_up is None else self._split(self.b_gate_up)[0]

    @property
    def b_up(self):
        return None if self.b_gate_up is None else self._split(self.b_gate_up)[1]

    def select(self, experts) -> "ExpertWeights":
        """Weights of a subset of experts stacked in the given order (a view when they are contiguous)."""
        idx = list(experts)
        if idx == list(range(idx[0], idx[0] + len(idx))):
            sl = slice(idx[0], idx[0] + len(idx))
            pick = lambda t: None if t is None else t[sl]  # noqa: E731
        else:
            ix = torch.tensor(idx, dtype=torch.long, device=self.gate_up.device)
            pick = lambda t: None if t is None else t.index_select(0, ix)  # noqa: E731
        return ExpertWeights(pick(self.gate_up), pick(self.down), pick(self.b_gate_up), pick(self.b_down),
                             self.apply_gate, self.concatenated, self.act, self.alpha, self.limit)

    def contiguous(self) -> "ExpertWeights":
        """Materialised copies (what a compiled static graph holds)."""
        c = lambda t: None if t is None else t.contiguous()  # noqa: E731
        return ExpertWeights(c(self.gate_up), c(self.down), c(self.b_gate_up), c(self.b_down),
                             self.apply_gate, self.concatenated, self.act, self.alpha, self.limit)

    def to(self, dtype) -> "ExpertWeights":
        c = lambda t: None if t is None else t.to(dtype)  # noqa: E731
        return ExpertWeights(c(self.gate_up), c(self.down), c(self.b_gate_up), c(self.b_down),
                             self.apply_gate, self.concatenated, self.act, self.alpha, self.limit)


def expert_weights(experts) -> ExpertWeights:
    """Canonical views of an HF v5 experts module (one decorated with `use_experts_implementation`)."""
    if not hasattr(experts, "gate_up_proj") or not hasattr(experts, "is_transposed"):
        raise NpuMoeError(f"{type(experts).__name__} is not a transformers v5 fused experts module "
                          "(no gate_up_proj / is_transposed); the workbench needs a model whose experts class "
                          "is decorated with use_experts_implementation")
    if not getattr(experts, "has_gate", True) or getattr(experts, "has_post_expert_norm", False):
        raise NpuMoeError(f"{type(experts).__name__}: experts without a gate or with a post-expert norm are not "
                          "supported yet")
    if experts.is_transposed:                       # gpt_oss: already x @ W
        gate_up, down = experts.gate_up_proj, experts.down_proj
    else:                                           # F.linear layout: transpose views
        gate_up, down = experts.gate_up_proj.transpose(1, 2), experts.down_proj.transpose(1, 2)
    has_bias = getattr(experts, "has_bias", False)
    b_gu = experts.gate_up_proj_bias if has_bias else None
    b_d = experts.down_proj_bias if has_bias else None
    from transformers.integrations.moe import _default_apply_gate
    own_gate = getattr(type(experts), "_apply_gate", None) is not _default_apply_gate
    act = "gpt_oss" if own_gate and hasattr(experts, "limit") else "swiglu"
    if own_gate and act != "gpt_oss":
        raise NpuMoeError(f"{type(experts).__name__} defines its own gate activation that the workbench does not "
                          "know; add its math to npumoe_lab/models/weights.py")
    return ExpertWeights(gate_up, down, b_gu, b_d, experts._apply_gate, bool(experts.is_concatenated), act,
                         getattr(experts, "alpha", None), getattr(experts, "limit", None))
