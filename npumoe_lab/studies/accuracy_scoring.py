"""Per-sample outcomes of the accuracy curve: the reference computed ONCE per sample, every plan scored against it.

The reference record keeps only what the comparisons need (top-1 token per prompt position, the prompt's mean
NLL, the task score, and for generation tasks the greedy continuation), not the [T, V] logits, so n = 300
samples of every task fit in memory. A plan's generation is decoded against the reference's continuation:
one teacher-forced forward over the reference's tokens finds the first step where the plan's greedy choice
differs; only from there on is it decoded token by token. Greedy decoding is deterministic, so this yields the
tokens `scoring.evaluate_sample` would (up to last-bit differences between a multi-token and a one-token forward,
which can only flip an exact tie; tests/test_accuracy_curve.py holds the two paths equal on the tiny model).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from npumoe_lab.execution.experts import dropless_executor, set_executor
from npumoe_lab.execution.runtime import PrefillConfig, chunked_prefill
from npumoe_lab.workloads.scoring import evaluate_sample


@dataclass
class ReferenceRecord:
    score: float
    top1: torch.Tensor                 # [T] argmax of the reference's logits at every prompt position
    nll: float                         # mean NLL of the prompt's own tokens (positions 1..T-1)
    generated: list[int] | None        # the reference's greedy continuation (generate tasks)


def top1_tokens(logits: torch.Tensor) -> torch.Tensor:
    """argmax over the vocabulary of [T, V] logits: on fp32 (bf16 / fp16 widen exactly, so the same indices, first
    of ties, NaN first as in the narrow type; torch's CPU argmax is ~2x faster on fp32 than on bf16)."""
    return logits.float().argmax(-1)


def prompt_nll(logits: torch.Tensor, ids: list[int]) -> float:
    """Mean next-token NLL of the prompt under prefill logits [1, T, V] (predicting ids[1:])."""
    lp = F.log_softmax(logits[0, :-1].float(), dim=-1)
    return float(-lp.gather(1, torch.tensor(ids[1:])[:, None]).mean())


@torch.no_grad()
def reference_record(model, tokenizer, sample, workload, chunk: int, pad_id: int) -> ReferenceRecord:
    """The reference's record of one sample; the model must be in its reference (HF experts) configuration."""
    res = chunked_prefill(model, torch.tensor([sample.input_ids]), PrefillConfig.untimed(chunk, pad_id))
    top1, nll = top1_tokens(res.logits[0]), prompt_nll(res.logits, sample.input_ids)
    ev = evaluate_sample(model, tokenizer, sample, workload, prefill_fn=lambda m, ids: (res.logits,
                                                                                      res.past_key_values))
    return ReferenceRecord(float(ev["score"]), top1, nll, ev.get("generated_ids"))


def _step(model, token_ids, cache):
    out = model(input_ids=torch.tensor([token_ids], dtype=torch.long), cache=cache, use_cache=True)
    return out.logits, out.cache


def greedy_against(model, last_logits, cache, ref_ids: list[int], max_new: int, eos) -> list[int]:
    """Greedy continuation of a prefill (its last logits [V] and cache), found by checking the reference's
    continuation `ref_ids` in one forward and decoding step by step only after the first disagreement.
    Stopping as `evaluate_sample`: at eos or after max_new tokens."""
    nxt, gen = int(last_logits.argmax()), []
    if ref_ids and nxt == ref_ids[0]:
        if len(ref_ids) == 1:
            return list(ref_ids)
        lg, cache = _step(model, ref_ids[:-1], cache)
        pred = lg[0].argmax(-1).tolist()           # pred[i] continues ref_ids[:i + 1]
        diff = next((i for i in range(len(pred)) if pred[i] != ref_ids[i + 1]), None)
        if diff is None:
            return list(ref_ids)
        gen, nxt = list(ref_ids[:diff + 1]), pred[diff]
        extra = len(ref_ids) - 1 - (diff + 1)      # keep the prompt and the agreed tokens only
        if extra:
            cache.crop(-extra)                     # (transformers' crop takes a negative count here)
    for step in range(len(gen), max_new):
        gen.append(nxt)
        if nxt == eos or step == max_new - 1:
            break
        lg, cache = _step(model, [nxt], cache)
        nxt = int(lg[0, -1].argmax())
    return gen


@torch.no_grad()
def plan_outcome(model, tokenizer, sample, workload, res, ref: ReferenceRecord) -> dict:
    """Score, prompt NLL and top-1 agreement of one plan's prefill `res` (PrefillResult) against the reference.
    Decoding after the prefill runs the normal dropless path (NPUMoE applies to prefill only)."""
    prev = set_executor(model, dropless_executor) if getattr(model, "_npumoe", None) is not None else None
    try:
        agree = float((top1_tokens(res.logits[0]) == ref.top1).float().mean())
        nll = prompt_nll(res.logits, sample.input_ids)
        if sample.kind == "generate":
            gen = greedy_against(model, res.logits[0, -1], res.past_key_values, ref.generated or [],
                                 workload.max_new_tokens, getattr(tokenizer, "eos_token_id", None))
            score = float(workload.score_generation(sample, tokenizer.decode(gen, skip_special_tokens=True)))
        else:
            score = float(evaluate_sample(model, tokenizer, sample, workload,
                                          prefill_fn=lambda m, ids: (res.logits, res.past_key_values))["score"])
    finally:
        if prev is not None:
            set_executor(model, prev)
    return {"score": score, "nll": nll, "top1_agree": agree}
