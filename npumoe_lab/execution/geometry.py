"""Model geometry from an HF config alone: the MoE layer specs and the cost records of the non-expert ops.

`ModelGeometry.from_config(config)` needs no weights (a loaded model's config, or a `config.json` of a model too large
to load here), so a real prefill and a routing-only simulation build their attention, router, shared-expert and
"rest of the chunk" ops from the same code (ops.Op with the devices/cost.py builders).
"""
from __future__ import annotations

from dataclasses import dataclass

from npumoe_lab.devices.cost import attention_cost, dense_cost, memory_cost
from npumoe_lab.errors import NpuMoeError
from npumoe_lab.models.base import MoELayerSpec
from npumoe_lab.models.registry import get_family
from npumoe_lab.execution.ops import ChunkContext, Op

N_EXPERTS_KEYS = ("num_experts", "num_local_experts", "n_routed_experts")
SHARED_FIRST = {"qwen2_moe"}           # families whose block runs the shared expert before the router


def _text_config(config):
    return config.get_text_config() if hasattr(config, "get_text_config") else config


def n_experts_of(config) -> int | None:
    for key in N_EXPERTS_KEYS:
        v = getattr(config, key, None)
        if isinstance(v, int) and v > 0:
            return v
    return None


@dataclass(frozen=True)
class ModelGeometry:
    family: str
    n_layers: int
    hidden: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    vocab: int
    context: int | None
    moe: tuple[MoELayerSpec, ...]       # one per MoE layer, in layer order
    shared_intermediate: int            # summed intermediate size of a MoE layer's shared experts (0: none)

    @staticmethod
    def from_config(config) -> "ModelGeometry":
        c = _text_config(config)
        family = get_family(c)
        E = n_experts_of(c)
        if E is None:
            raise NpuMoeError(f"config of model_type {c.model_type!r} names no routed experts (none of "
                              f"{', '.join(N_EXPERTS_KEYS)}); is it a MoE model?")
        inter = getattr(c, family.intermediate_key, None)
        if not inter:
            raise NpuMoeError(f"config of model_type {c.model_type!r} lacks {family.intermediate_key!r}, the expert "
                              "FFN size; pass the model's full config.json")
        heads = int(c.num_attention_heads)
        n_shared = int(family.n_shared_experts(c))
        shared_inter = int(getattr(c, "shared_expert_intermediate_size", 0) or 0) or n_shared * int(inter)
        has_bias = c.model_type == "gpt_oss"
        specs = tuple(MoELayerSpec(layer=i, n_experts=E, top_k=int(family.top_k(c)), hidden=int(c.hidden_size),
                                   intermediate=int(inter), routing=family.routing,
                                   norm_topk_prob=bool(family.norm_topk_prob(c)), n_shared_experts=n_shared,
                                   has_bias=has_bias, act=family.act, family=family.model_type)
                      for i in family.moe_layers(c))
        return ModelGeometry(family=family.model_type, n_layers=int(c.num_hidden_layers), hidden=int(c.hidden_size),
                             n_heads=heads, n_kv_heads=int(getattr(c, "num_key_value_heads", None) or heads),
                             head_dim=int(getattr(c, "head_dim", None) or c.hidden_size // heads),
                             vocab=int(c.vocab_size), context=getattr(c, "max_position_embeddings", None),
                             moe=specs, shared_intermediate=shared_inter if n_shared else 0)

    @property
    def moe_layers(self) -> dict[int, MoELayerSpec]:
        return {s.layer: s for s in self.moe}

    @property
    def shared_first(self) -> bool:
        return self.family in SHARED_FIRST

    # -- the non-expert ops of one chunk (role: where attention and dense parts run for the variant) ---------
    def attention_op(self, layer: int, ctx: ChunkContext, role: str) -> Op:
        cost = attention_cost(ctx.length, ctx.past, self.hidden, self.n_heads, self.n_kv_heads, self.head_dim,
                              dtype_bytes=ctx.dtype_bytes, weight_bytes=ctx.weight_bytes(role))
        return Op("attention", "attention", role, layer, ctx.index, cost, (ctx.length, ctx.past))

    def router_op(self, layer: int, ctx: ChunkContext) -> Op:
        E = self.moe_layers[layer].n_experts
        return Op("router", "router", "cpu", layer, ctx.index,
                  dense_cost(ctx.length, self.hidden, E, dtype_bytes=ctx.dtype_bytes), (ctx.length, self.hidden, E))

    def shared_op(self, layer: int, ctx: ChunkContext, role: str) -> Op:
        out = 3 * self.shared_intermediate        # gate, up and down matrices of a SwiGLU MLP
        return Op("shared_experts", "shared_experts", role, layer, ctx.index,
                  dense_cost(ctx.length, self.hidden, out, dtype_bytes=ctx.dtype_bytes,
                             weight_bytes=ctx.weight_bytes(role)), (ctx.length, self.hidden, out))

    def rest_op(self, ctx: ChunkContext, last: bool, measured: bool) -> Op:
        """Embeddings, norms, residual adds and the LM head: what no other op covers. The LM head projects the
        prompt's last token only, in its last chunk (all TTFT needs; measured prefills do the same: head.py).
        Measured: its cost is the chunk's wall time not covered by events (no FLOPs recorded); modeled: that LM
        head in the last chunk, else the norms' memory traffic."""
        if measured:
            cost = memory_cost(0, "other")
        elif last:
            cost = dense_cost(1, self.hidden, self.vocab, dtype_bytes=ctx.dtype_bytes)
        else:
            cost = memory_cost(2 * self.hidden * ctx.dtype_bytes, "norms")
        # shape: what the chunk's rest is made of, the LM head's rows last (a measured run records no cost for it;
        # a fitted host model prices it from these: devices/cpu_model.py)
        return Op("other", "other", "cpu", -1, ctx.index, cost,
                  (ctx.length, self.n_layers, self.hidden, self.vocab, int(last)))


__all__ = ["ModelGeometry", "n_experts_of"]
