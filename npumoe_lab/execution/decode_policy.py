"""Decode policies: how the greedy steps after a prefill run on the same plan (no torch: the simulate path imports it).

A decode step forwards one token per sequence with the KV cache. Where it runs is the policy's choice:

    pipeline    the paper's prototype: each step runs the prefill pipeline's static graphs, the token padded to the
                prefill chunk (attention, router, the plan's groups at their prefill capacities; pads take no capacity)
    cpu         every expert of the step on the CPU at its actual load (dynamic, dropless); attention and the dense
                parts where the variant puts them, at the step's own length (one token)
    npu-decode  resident groups on decode-shaped static graphs compiled for it (each resident expert's capacity =
                the step's tokens, so nothing is dropped), cold experts on the CPU; attention at one token

A variant without a plan (HF's experts, the dropless CPU path) runs its own experts under every policy; only the step
length differs (the padded chunk under `pipeline`, one token otherwise). `decode_tokens` N counts the greedy steps
after the prefill: the first output token comes from the prefill's last logits (TTFT), the N steps give the next N,
so a run produces N + 1 tokens and `tpot_s` = decode time / N.
"""
from __future__ import annotations

from dataclasses import replace

from npumoe_lab.errors import NpuMoeError
from npumoe_lab.execution.ops import ChunkContext
from npumoe_lab.planning.layout import ExecutionLayout

DECODE_POLICIES = ("pipeline", "cpu", "npu-decode")
DEFAULT_DECODE_TOKENS = 8       # the paper's average number of decode tokens in its end-to-end latency


def check_decode(decode_tokens, policy) -> tuple[int, str]:
    """The one check of the decode settings (CLI and API): a whole number of tokens >= 0 and a known policy."""
    if isinstance(decode_tokens, bool) or not isinstance(decode_tokens, int) or decode_tokens < 0:
        raise NpuMoeError(f"--decode-tokens {decode_tokens!r}: give a whole number of decode tokens >= 0 "
                          f"(0: prefill only; the paper's end-to-end latency uses about {DEFAULT_DECODE_TOKENS})")
    if policy not in DECODE_POLICIES:
        raise NpuMoeError(f"--decode-policy {policy!r} is not a decode policy; use one of {', '.join(DECODE_POLICIES)}")
    return decode_tokens, policy


def step_length(policy: str, chunk: int, rows: int = 1) -> int:
    """Static length of a decode step's forward: the padded prefill chunk (`pipeline`) or the step's tokens."""
    return chunk if policy == "pipeline" else rows


def step_context(policy: str, step: int, prompt_len: int, chunk: int, clock, *, rows: int = 1, numerics=True,
                 dtype_bytes: int = 2, npu_weight_bytes: int | None = None) -> ChunkContext:
    """Decode step `step` (0-based) after a prompt of `prompt_len` tokens: its index follows the prefill chunks, its
    past is the prompt plus the tokens decoded before it."""
    n_chunks = -(-prompt_len // chunk)
    return ChunkContext(index=n_chunks + step, past=prompt_len + step, n_real=rows,
                        length=step_length(policy, chunk, rows), clock=clock, numerics=numerics,
                        dtype_bytes=dtype_bytes, npu_weight_bytes=npu_weight_bytes)


def decode_layout(layout: ExecutionLayout | None, policy: str, rows: int = 1) -> ExecutionLayout | None:
    """The layout a decode step runs under `policy` (None: the variant has no plan and keeps its experts path).
    `pipeline`: the prefill plan as it is; `cpu`: every expert dynamic on the CPU; `npu-decode`: the plan's resident
    groups at capacity `rows` (decode-shaped static graphs), cold groups kept cold."""
    if layout is None or policy == "pipeline":
        return layout
    if policy == "cpu":
        return ExecutionLayout.dropless(layout.layers)
    layers = tuple(replace(lay, groups=tuple(replace(g, capacity=rows) if g.resident else g for g in lay.groups))
                   for lay in layout.layers)
    return replace(layout, layers=layers, chunk=None, plan_hash=None)


def decode_programs(layout: ExecutionLayout | None, policy: str) -> int:
    """Static programs a policy adds to the plan's: `npu-decode` compiles one decode-shaped graph per resident group
    (they count against the platform's resident-program budget); the other policies add none."""
    if layout is None or policy != "npu-decode":
        return 0
    return sum(g.resident for lay in layout.layers for g in lay.groups)


__all__ = ["DECODE_POLICIES", "DEFAULT_DECODE_TOKENS", "check_decode", "step_length", "step_context", "decode_layout",
           "decode_programs"]
