"""Small static torch modules that become NPU graphs: a group of experts at one capacity, and the attention
sublayer for one prefill chunk. Everything is shape-static; routing, packing and scatter stay on the host
(ANCHORS 3.8: no topk/gather/scatter inside a graph)."""
from __future__ import annotations

import numpy as np
import torch
from torch import nn

from npumoe_lab.errors import NpuMoeError

LAYOUTS = ("bmm", "conv")
MASK_MIN = -1e4  # finite in fp16: -1e9 overflows to -inf and gives NaN on the ANE (ANCHORS 3.8)
FP16_LOWEST = -65504.0  # one-sided clamps get this finite bound, else the converter emits a -inf constant


def _t(a) -> torch.Tensor:
    return a.detach().to(torch.float32).clone() if torch.is_tensor(a) else torch.as_tensor(np.asarray(a, np.float32))


def to_layout(x, layout: str):
    """[G, C, H] -> the graph's input layout. conv: channels-first (1, G*H, 1, C), the ANE's native (B, C, 1, S)."""
    if layout == "bmm":
        return x
    g, c, h = x.shape
    if torch.is_tensor(x):
        return x.permute(0, 2, 1).reshape(1, g * h, 1, c)
    return np.ascontiguousarray(np.transpose(x, (0, 2, 1)).reshape(1, g * h, 1, c))


def from_layout(y, layout: str, groups: int):
    """Inverse of `to_layout`: graph output -> [G, C, H]."""
    if layout == "bmm":
        return y
    c, h = y.shape[-1], y.shape[1] // groups
    if torch.is_tensor(y):
        return y.reshape(groups, h, c).permute(0, 2, 1)
    return np.ascontiguousarray(np.transpose(np.asarray(y).reshape(groups, h, c), (0, 2, 1)))


class GroupFFN(nn.Module):
    """The experts of one group, each on its own [C, H] slab: y[g] = FFN_g(x[g]).

    layout "bmm": x [G, C, H] -> [G, C, H] with batched matmuls (ONNX, CPU).
    layout "conv": x (1, G*H, 1, C) -> (1, G*H, 1, C) with 1x1 grouped convolutions (groups=G), the
    channels-first form Apple recommends for the ANE (ANCHORS 3.1); G*I must stay <= 65536 channels.
    act "swiglu": silu(g) * u;  "gpt_oss": g=clamp(g, max=limit), u=clamp(u, -limit, limit), (u+1)*g*sigmoid(alpha*g).
    """

    def __init__(self, w_gate, w_up, w_down, b_gate=None, b_up=None, b_down=None, act="swiglu",
                 alpha=None, limit=None, layout="bmm"):
        super().__init__()
        if layout not in LAYOUTS:
            raise NpuMoeError(f"unknown graph layout {layout!r}; use one of {LAYOUTS}")
        if act not in ("swiglu", "gpt_oss"):
            raise NpuMoeError(f"unknown expert activation {act!r}; use 'swiglu' or 'gpt_oss'")
        if act == "gpt_oss" and (alpha is None or limit is None):
            raise NpuMoeError("gpt_oss experts need alpha and limit; read them with models.weights.expert_weights")
        wg, wu, wd = _t(w_gate), _t(w_up), _t(w_down)
        if wg.ndim != 3 or wu.shape != wg.shape or tuple(wd.shape) != (wg.shape[0], wg.shape[2], wg.shape[1]):
            raise NpuMoeError(f"expert weights must be w_gate/w_up [G,H,I] and w_down [G,I,H]; got "
                              f"{tuple(wg.shape)}, {tuple(wu.shape)}, {tuple(wd.shape)}")
        self.groups, self.hidden, self.inter = wg.shape
        self.act, self.layout = act, layout
        self.alpha, self.limit = (float(alpha) if alpha is not None else None), (float(limit) if limit is not None else None)
        g, h, i = wg.shape
        zeros = lambda *s: torch.zeros(*s)  # noqa: E731  (absent bias = 0; kept out of the graph below)
        self.has_bias = any(b is not None for b in (b_gate, b_up, b_down))
        bg = _t(b_gate) if b_gate is not None else zeros(g, i)
        bu = _t(b_up) if b_up is not None else zeros(g, i)
        bd = _t(b_down) if b_down is not None else zeros(g, h)
        if layout == "bmm":
            self.w_gate, self.w_up, self.w_down = (nn.Parameter(w, requires_grad=False) for w in (wg, wu, wd))
            self.b_gate, self.b_up, self.b_down = (nn.Parameter(b[:, None, :], requires_grad=False) for b in (bg, bu, bd))
        else:  # conv weight [out, in/groups, 1, 1], group-major output channels
            self.w_gate = nn.Parameter(wg.transpose(1, 2).reshape(g * i, h, 1, 1), requires_grad=False)
            self.w_up = nn.Parameter(wu.transpose(1, 2).reshape(g * i, h, 1, 1), requires_grad=False)
            self.w_down = nn.Parameter(wd.transpose(1, 2).reshape(g * h, i, 1, 1), requires_grad=False)
            self.b_gate, self.b_up, self.b_down = (nn.Parameter(b.reshape(-1), requires_grad=False) for b in (bg, bu, bd))

    def _proj(self, x, w, b):
        if self.layout == "bmm":
            y = torch.matmul(x, w)
            return y + b if self.has_bias else y
        return nn.functional.conv2d(x, w, b if self.has_bias else None, groups=self.groups)

    def forward(self, x):
        gate, up = self._proj(x, self.w_gate, self.b_gate), self._proj(x, self.w_up, self.b_up)
        if self.act == "swiglu":
            h = nn.functional.silu(gate) * up
        else:
            gate = torch.clamp(gate, min=FP16_LOWEST, max=self.limit)
            up = torch.clamp(up, min=-self.limit, max=self.limit)
            h = (up + 1.0) * (gate * torch.sigmoid(gate * self.alpha))
        return self._proj(h, self.w_down, self.b_down)

    def example_input(self, capacity: int, seed: int = 0) -> torch.Tensor:
        x = torch.randn(self.groups, capacity, self.hidden, generator=torch.Generator().manual_seed(seed))
        return to_layout(x, self.layout)


class ChunkAttention(nn.Module):
    """Attention sublayer (q/k/v/o projections, optional q/k RMSNorm, RoPE, GQA) for one prefill chunk of static
    length S against a KV cache of static length T. Refuses what it does not implement (sinks, MLA, a sliding
    window shorter than the context) rather than computing something else.

    Inputs: x [1, S, H] (normed hidden states), cos/sin [S, D] (RoPE at the chunk's positions), mask [1, 1, S, T]
    (0 or MASK_MIN: causal + unwritten slots), write [T, S] one-hot (row t = 1 at column s if token s goes to cache
    slot t). The cache write is `cache*(1-rowsum(write)) + write @ kv`: matmul and mul only, no dynamic
    slice_update (CPU-only on the ANE, ANCHORS 1). kv="state": caches are Core ML states (iOS 18);
    kv="io": caches are extra inputs and the updated caches extra outputs (ONNX, or tools without states).
    """

    def __init__(self, attn: nn.Module, context: int, kv: str = "state"):
        super().__init__()
        if kv not in ("state", "io"):
            raise NpuMoeError(f"unknown kv mode {kv!r}; use 'state' or 'io'")
        missing = [n for n in ("q_proj", "k_proj", "v_proj", "o_proj") if not hasattr(attn, n)]
        if missing:
            raise NpuMoeError(f"attention module {type(attn).__name__} has no {missing}; only q/k/v/o_proj attention "
                              "(Llama/Qwen/Mixtral style) can be converted; convert without attention graphs")
        if getattr(attn, "sinks", None) is not None:
            raise NpuMoeError(f"{type(attn).__name__} uses attention sinks, which the static attention graph does "
                              "not implement; convert with --no-attention")
        cfg, idx = getattr(attn, "config", None), getattr(attn, "layer_idx", None)
        types, window = getattr(cfg, "layer_types", None), getattr(cfg, "sliding_window", None)
        if types and idx is not None and types[idx] == "sliding_attention" and window and context > window:
            raise NpuMoeError(f"layer {idx} uses sliding-window attention ({window}) but the graph's context is "
                              f"{context}; use --context <= {window} or --no-attention")
        self.kv, self.context = kv, int(context)
        self.head_dim = int(attn.head_dim)
        self.n_heads = attn.q_proj.out_features // self.head_dim
        self.n_kv = attn.k_proj.out_features // self.head_dim
        self.scaling = float(getattr(attn, "scaling", self.head_dim ** -0.5))
        for name in ("q_proj", "k_proj", "v_proj", "o_proj"):
            src = getattr(attn, name)
            lin = nn.Linear(src.in_features, src.out_features, bias=src.bias is not None)
            lin.load_state_dict({k: v.detach().float() for k, v in src.state_dict().items()})
            setattr(self, name, lin.requires_grad_(False))
        self.q_norm_w = self._norm(attn, "q_norm")
        self.k_norm_w = self._norm(attn, "k_norm")
        # decided here, in python: a traced shape comparison would become a graph constant with a TracerWarning
        w = self.q_norm_w
        self.norm_mode = "none" if w is None else "head" if w.numel() == self.head_dim else "full"
        self.eps = float(getattr(getattr(attn, "q_norm", None), "variance_epsilon", 1e-6))
        self.eps = max(self.eps, 1e-6)  # fp16-safe epsilon (ANCHORS 3.1)
        # rotate_half(x) = [-x2, x1] as a matmul with a constant +-1 matrix: no slice/concat copies in the graph
        d, half = self.head_dim, self.head_dim // 2
        rot = torch.zeros(d, d)
        rot[torch.arange(half) + half, torch.arange(half)] = -1.0
        rot[torch.arange(half), torch.arange(half) + half] = 1.0
        self.register_buffer("rotate_half", rot)
        if kv == "state":
            shape = (1, self.n_kv, self.context, self.head_dim)
            self.register_buffer("k_cache", torch.zeros(shape, dtype=torch.float16))
            self.register_buffer("v_cache", torch.zeros(shape, dtype=torch.float16))

    @staticmethod
    def _norm(attn, name):
        mod = getattr(attn, name, None)
        if mod is None or not hasattr(mod, "weight"):
            return None
        return nn.Parameter(mod.weight.detach().float().clone(), requires_grad=False)

    def _rms(self, x, w):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * w

    def _project(self, x, proj, norm_w, n):
        """proj(x) -> [1, n, S, D], with the q/k RMSNorm per head (Qwen3) or over all heads (OLMoE)."""
        y = proj(x)
        if norm_w is not None and self.norm_mode == "full":
            y = self._rms(y, norm_w)
        y = self._heads(y, n)
        return self._rms(y, norm_w) if norm_w is not None and self.norm_mode == "head" else y

    def _rope(self, x, cos, sin):
        return x * cos + torch.matmul(x, self.rotate_half) * sin

    # shapes come from python ints and -1 only: a traced x.shape becomes an 'int' op coremltools cannot convert
    def _heads(self, y, n):  # [1, S, n*D] -> [1, n, S, D]
        return y.reshape(1, -1, n, self.head_dim).transpose(1, 2)

    def forward(self, x, cos, sin, mask, write, k_cache=None, v_cache=None):
        q = self._rope(self._project(x, self.q_proj, self.q_norm_w, self.n_heads), cos, sin)
        k = self._rope(self._project(x, self.k_proj, self.k_norm_w, self.n_kv), cos, sin)
        v = self._heads(self.v_proj(x), self.n_kv)
        keep = 1.0 - write.sum(dim=-1, keepdim=True)  # [T, 1]: 0 where this chunk writes
        if self.kv == "state":
            self.k_cache.mul_(keep.to(self.k_cache.dtype)).add_(torch.matmul(write, k).to(self.k_cache.dtype))
            self.v_cache.mul_(keep.to(self.v_cache.dtype)).add_(torch.matmul(write, v).to(self.v_cache.dtype))
            k_all, v_all = self.k_cache.to(x.dtype), self.v_cache.to(x.dtype)
        else:
            k_all = k_cache * keep + torch.matmul(write, k)
            v_all = v_cache * keep + torch.matmul(write, v)
        # GQA without repeat_kv: the query heads of one kv head (contiguous in HF order) share one matmul
        qg = q.reshape(1, self.n_kv, -1, self.head_dim)
        scores = torch.matmul(qg, k_all.transpose(2, 3)).reshape(1, self.n_heads, -1, self.context)
        probs = torch.softmax(scores * self.scaling + mask, dim=-1)
        out = torch.matmul(probs.reshape(1, self.n_kv, -1, self.context), v_all)
        out = out.reshape(1, self.n_heads, -1, self.head_dim).transpose(1, 2).reshape(1, -1, self.n_heads * self.head_dim)
        y = self.o_proj(out)
        return y if self.kv == "state" else (y, k_all, v_all)


def chunk_inputs(positions, context: int, head_dim: int, rope_theta: float = 10000.0, valid_before=None):
    """Host-side inputs of ChunkAttention for a chunk at `positions` (ints): cos, sin [S, D], mask [1,1,S,T],
    write [T, S]. Cache slot t holds position t; slots < positions[0] are already written (or `valid_before`)."""
    pos = torch.as_tensor(positions, dtype=torch.float32)
    s = pos.numel()
    inv = 1.0 / (rope_theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))
    ang = pos[:, None] * inv[None, :]
    emb = torch.cat([ang, ang], dim=-1)
    slots = torch.arange(context, dtype=torch.float32)
    mask = torch.where(slots[None, :] <= pos[:, None], 0.0, MASK_MIN)[None, None]
    write = (slots[:, None] == pos[None, :]).to(torch.float32)
    if int(pos.max()) >= context:
        raise NpuMoeError(f"chunk positions up to {int(pos.max())} do not fit a KV cache of {context}; "
                          "build the attention graph with a larger context")
    return emb.cos(), emb.sin(), mask, write
