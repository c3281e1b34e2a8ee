"""`lm-heldout`: perplexity on held-out long documents. Sample i is the i-th window of domain DOMAINS[i % 4]:
[bos] + heldout tokens [j*(L-1) : (j+1)*(L-1)] with j = i // 4 (non-overlapping, from the start of
data/text/<domain>/heldout.txt; wraps around when the file is exhausted). The score is the mean NLL over the
L-1 predicted tokens (perplexity = exp of the token-weighted mean)."""
from __future__ import annotations

from npumoe_lab.workloads.base import DOMAINS, Sample, Workload, bos_id, eval_haystack


def heldout_windows(tokenizer, domain: str, prompt_len: int, n: int | None = None) -> list[list[int]]:
    toks = eval_haystack(tokenizer).tokens[domain]
    body = prompt_len - len(bos_id(tokenizer))
    n_full = len(toks) // body
    n = n_full if n is None else n
    out = []
    for j in range(n):
        start = (j % max(n_full, 1)) * body
        out.append(bos_id(tokenizer) + list(toks[start:start + body]))
    return out


class LmHeldout(Workload):
    name = "lm-heldout"
    kind = "perplexity"
    description = ("perplexity on non-overlapping prompt_len windows of the bundled held-out text of each domain "
                   "(data/text/<domain>/heldout.txt); score = mean NLL (lower is better)")
    max_new_tokens = 0
    metric = "nll"
    chance = float("nan")

    def samples(self, tokenizer, prompt_len: int, n: int, seed: int = 0) -> list[Sample]:
        self.check_prompt_len(tokenizer, prompt_len, minimum=16)
        per = {d: heldout_windows(tokenizer, d, prompt_len, (n + 3) // 4) for d in DOMAINS}
        out = []
        for i in range(n):
            d = DOMAINS[i % 4]
            out.append(Sample(per[d][i // 4], "perplexity", meta={"domain": d, "window": i // 4}))
        return out
