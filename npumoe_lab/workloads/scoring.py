"""Scoring one sample: prefill (pluggable: the engine passes its own), then the NORMAL model path for decoding.

- generate: greedy `workload.max_new_tokens` steps, one token at a time with the cache; task metric via
  `workload.score_generation`.
- choice: lm-eval style; for each choice a deep copy of the prefill cache, summed log-probs of the choice tokens
  (the first from the prefill's last logits). `score` = accuracy (argmax of summed log-likelihood); `acc_norm`
  uses the log-likelihood divided by the choice's length in characters (lm-eval's acc_norm).
- perplexity: mean NLL over the prompt's predicted tokens (positions 1..T-1); `score` = that NLL.
- next-token: `workload.score_next(sample, last_logits)` (e.g. the target among the top-k), no decoding.
"""
from __future__ import annotations

import copy
import math

from npumoe_lab.errors import NpuMoeError
from npumoe_lab.utils import progress
from npumoe_lab.workloads.base import Sample, Workload, quiet_kwargs


def default_prefill(model, input_ids):
    """prefill_fn(model, input_ids [1,T]) -> (logits [1,T,V], cache)."""
    out = model(input_ids=input_ids, use_cache=True)
    return out.logits, out.cache


def _step(model, token_ids, past):
    import torch
    out = model(input_ids=torch.tensor([token_ids], dtype=torch.long), cache=past, use_cache=True)
    return out.logits, out.cache


def _next_token_nll(logits, targets):
    """-log p(target) per position of [T, V] logits, in row blocks: no [T, V] log-softmax temporary (1.2 GB at a
    real vocabulary and a 2k prompt); each row's value is the one a whole-tensor log_softmax gives."""
    import torch
    from npumoe_lab.results.metrics import row_blocks   # lazy: metrics imports torch, this module must not
    return torch.cat([-torch.log_softmax(logits[b].float(), -1).gather(1, targets[b, None]).squeeze(1)
                      for b in row_blocks(*logits.shape)])


def evaluate_sample(model, tokenizer, sample: Sample, workload: Workload, prefill_fn=None) -> dict:
    import torch
    import torch.nn.functional as F
    prefill_fn = prefill_fn or default_prefill
    ids = torch.tensor([sample.input_ids], dtype=torch.long)
    res = {"score": None, "nll": None, "last_logits": None, "score_name": workload.metric}
    with torch.no_grad():
        logits, past = prefill_fn(model, ids)
        if logits.shape[:2] != ids.shape:
            raise NpuMoeError(f"prefill_fn returned logits of shape {tuple(logits.shape)}; expected "
                              f"[1, {ids.shape[1]}, V]")
        last = logits[0, -1].float()
        res["last_logits"] = last.detach().clone()
        if sample.kind == "perplexity":
            nll = _next_token_nll(logits[0, :-1], ids[0, 1:])
            res["nll"] = float(nll.mean())
            res["n_tokens"] = int(nll.numel())
            res["score"] = res["nll"]
        elif sample.kind == "next-token":
            res["score"] = float(workload.score_next(sample, last))
        elif sample.kind == "generate":
            eos = getattr(tokenizer, "eos_token_id", None)
            out_ids, nxt, cur = [], int(last.argmax()), past
            for step in range(workload.max_new_tokens):
                out_ids.append(nxt)
                if nxt == eos or step == workload.max_new_tokens - 1:
                    break
                lg, cur = _step(model, [nxt], cur)
                nxt = int(lg[0, -1].argmax())
            text = tokenizer.decode(out_ids, skip_special_tokens=True)
            res["generated_ids"] = out_ids
            res["generated_text"] = text
            res["score"] = float(workload.score_generation(sample, text))
            if hasattr(workload, "recall"):
                res["recall"] = float(workload.recall(sample, text))
        elif sample.kind == "choice":
            if not sample.choices or sample.label is None:
                raise NpuMoeError("a choice sample needs `choices` and `label`")
            first_lp = F.log_softmax(last, dim=-1)
            lls = []
            for ch in sample.choices:
                c = list(tokenizer.encode(ch, add_special_tokens=False, **quiet_kwargs(tokenizer)))
                if not c:
                    raise NpuMoeError(f"choice {ch!r} encodes to no tokens")
                ll = float(first_lp[c[0]])
                if len(c) > 1:
                    lg, _ = _step(model, c[:-1], copy.deepcopy(past))
                    lp = F.log_softmax(lg[0].float(), dim=-1)
                    ll += float(lp.gather(1, torch.tensor(c[1:])[:, None]).sum())
                lls.append(ll)
            pred = max(range(len(lls)), key=lambda i: lls[i])
            norm = [ll / max(1, len(ch)) for ll, ch in zip(lls, sample.choices)]
            pred_norm = max(range(len(norm)), key=lambda i: norm[i])
            res.update(choice_logliks=lls, pred=pred, score=float(pred == sample.label),
                       acc_norm=float(pred_norm == sample.label))
        else:
            raise NpuMoeError(f"unknown sample kind {sample.kind!r}; expected generate | choice | perplexity | next-token")
    return res


def evaluate(model, tokenizer, workload: Workload, prompt_len: int, n: int, seed: int = 0, prefill_fn=None,
             show_progress: bool = True) -> dict:
    """Scores n samples; returns {'mean': ..., 'n': n, 'rows': [...]} (perplexity: mean = token-weighted NLL,
    'ppl' = exp(mean))."""
    samples = workload.samples(tokenizer, prompt_len, n, seed)
    rows = []
    for s in progress(samples, desc=f"{workload.name}@{prompt_len}", disable=not show_progress or None):
        r = evaluate_sample(model, tokenizer, s, workload, prefill_fn)
        r.pop("last_logits")
        r["meta"] = s.meta
        rows.append(r)
    if workload.kind == "perplexity":
        tot = sum(r["n_tokens"] for r in rows)
        mean = sum(r["nll"] * r["n_tokens"] for r in rows) / tot
        return {"mean": mean, "ppl": math.exp(mean), "n": n, "rows": rows}
    return {"mean": sum(r["score"] for r in rows) / len(rows), "n": n, "rows": rows}
