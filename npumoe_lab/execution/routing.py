"""Routing capture: what HF's routers decided, per MoE layer, without changing the forward.

Forward pre-hooks on the experts modules see exactly what the experts computation receives (hidden states,
top_k_index, top_k_weights); forward hooks on the routers see the raw router logits. Hooks only copy tensors
and return None, so logits are bit-identical with and without capture, whichever experts implementation runs."""
from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

import torch

from npumoe_lab.errors import NpuMoeError
from npumoe_lab.models import find_moe_blocks


@dataclass
class RoutingRecord:
    """One MoE layer in one forward; N = B*T tokens flattened in HF order (row-major over batch, time)."""
    layer: int
    topk_idx: torch.Tensor       # [N, K] int64
    topk_weight: torch.Tensor    # [N, K] float32 (as passed to the experts, incl. any routed_scaling_factor)
    router_logits: torch.Tensor  # [N, E] float32, raw (pre-softmax / pre-sigmoid, incl. router bias)
    hidden_norm: torch.Tensor    # [N] float32, L2 norm of each token's experts input
    token_mask: torch.Tensor     # [N] bool, False for padding
    call: int = 0                # index of the forward within the recorder (chunk order for calibration)
    hidden: torch.Tensor | None = None  # [N, H] experts input, only with RoutingRecorder(keep_hidden=True)


def _arg(args, kwargs, pos, *names):
    if len(args) > pos:
        return args[pos]
    for name in names:
        if name in kwargs:
            return kwargs[name]
    raise NpuMoeError(f"experts module called without argument {names[0]!r}; routing capture supports HF's "
                      f"experts signature (hidden_states, top_k_index, top_k_weights)")


class RoutingRecorder:
    """Context manager that records routing of every forward run inside it:

        with RoutingRecorder(model) as rec:
            for chunk in chunks:
                model(input_ids=chunk, attention_mask=mask)
        rec.records          # list[RoutingRecord], forward by forward, layer by layer

    keep_hidden=True also stores each layer's experts input (memory: N*H per layer per forward).
    The token mask comes from the `attention_mask` passed to `model` (its last T columns, so it also works with
    a KV cache); without one every token counts as real."""

    def __init__(self, model, keep_hidden: bool = False):
        self.model = model
        self.keep_hidden = keep_hidden
        self.refs = find_moe_blocks(model)
        if not self.refs:
            raise NpuMoeError(f"{type(model).__name__} has no MoE layers; routing capture needs a MoE model")
        self.records: list[RoutingRecord] = []
        self._handles = []
        self._logits: dict[int, torch.Tensor] = {}
        self._mask = None
        self._calls = defaultdict(int)   # layer -> forwards seen so far

    # -- hooks -------------------------------------------------------------------------------------------
    def _on_model(self, module, args, kwargs):
        mask = kwargs.get("attention_mask", args[1] if len(args) > 1 else None)
        self._mask = None if mask is None else mask.detach()

    def _on_router(self, layer):
        def hook(module, args, output):
            logits = output[0] if isinstance(output, tuple) else output
            self._logits[layer] = logits.detach().reshape(-1, logits.shape[-1]).float().clone()
        return hook

    def _on_experts(self, layer):
        def hook(module, args, kwargs):
            hidden = _arg(args, kwargs, 0, "hidden_states")
            idx = _arg(args, kwargs, 1, "top_k_index", "router_indices")
            weight = _arg(args, kwargs, 2, "top_k_weights", "routing_weights")
            n = hidden.shape[0]
            if layer not in self._logits:
                raise NpuMoeError(f"layer {layer}: the experts ran without their router; routing capture needs the "
                                  f"MoE block's own forward (call the model, not the experts module)")
            self.records.append(RoutingRecord(
                layer=layer,
                topk_idx=idx.detach().to(torch.int64).clone(),
                topk_weight=weight.detach().float().clone(),
                router_logits=self._logits.pop(layer),
                hidden_norm=hidden.detach().float().norm(dim=-1),
                token_mask=self._token_mask(n),
                call=self._calls[layer],
                hidden=hidden.detach().clone() if self.keep_hidden else None,
            ))
            self._calls[layer] += 1
        return hook

    def _token_mask(self, n: int) -> torch.Tensor:
        if self._mask is None:
            return torch.ones(n, dtype=torch.bool)
        batch = self._mask.shape[0]
        mask = self._mask[:, -(n // batch):].reshape(-1).bool()
        if mask.numel() != n:
            raise NpuMoeError(f"attention_mask of shape {tuple(self._mask.shape)} does not cover the {n} tokens the "
                              f"experts saw; pass a 2-D [batch, length] attention mask")
        return mask.cpu()

    # -- context -----------------------------------------------------------------------------------------
    def __enter__(self):
        self._handles.append(self.model.register_forward_pre_hook(self._on_model, with_kwargs=True))
        for ref in self.refs:
            self._handles.append(ref.router.register_forward_hook(self._on_router(ref.layer)))
            self._handles.append(ref.experts.register_forward_pre_hook(self._on_experts(ref.layer),
                                                                       with_kwargs=True))
        return self

    def __exit__(self, *exc):
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
        return False

    def by_call(self) -> list[list[RoutingRecord]]:
        """Records grouped per forward (one list per call, in layer order)."""
        out = defaultdict(list)
        for rec in self.records:
            out[rec.call].append(rec)
        return [out[c] for c in sorted(out)]


@torch.no_grad()
def capture_routing(model, input_ids, attention_mask=None) -> list[RoutingRecord]:
    """Run one forward and return one RoutingRecord per MoE layer, in layer order."""
    with RoutingRecorder(model) as rec:
        model(input_ids=input_ids, attention_mask=attention_mask, use_cache=False)
    return rec.records
