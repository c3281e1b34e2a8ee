"""`lm-next`: next-token accuracy on held-out text, one 0/1 outcome per sample (so paired exact bounds apply).

Sample i is a window of domain DOMAINS[i % 4] of the bundled held-out text: [bos] + prompt_len - 1 tokens from a
seeded random start, and the target is the token that follows the window. The sample scores 1 when the target
is among the model's `top_k` most likely next tokens at the prompt's last position (no decoding: the prefill's
last logits decide). `top_k` is the difficulty knob (1 = top-1 accuracy, harder; larger k, easier)."""
from __future__ import annotations

from npumoe_lab.errors import NpuMoeError
from npumoe_lab.workloads.base import DOMAINS, Sample, Workload, bos_id, eval_haystack, sample_rng


class LmNextToken(Workload):
    name = "lm-next"
    kind = "next-token"
    description = ("next-token accuracy on seeded random windows of the bundled held-out text: the token after "
                   "the window among the top_k predictions at the last position (1/0 per sample)")
    max_new_tokens = 0
    metric = "top_k_accuracy"
    chance = float("nan")

    def __init__(self, top_k: int = 1):
        if isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 1:
            raise NpuMoeError(f"lm-next: top_k must be an int >= 1; got {top_k!r}")
        self.top_k = top_k

    def samples(self, tokenizer, prompt_len: int, n: int, seed: int = 0) -> list[Sample]:
        self.check_prompt_len(tokenizer, prompt_len, minimum=16)
        hay, head = eval_haystack(tokenizer), bos_id(tokenizer)
        body = prompt_len - len(head)
        out = []
        for i in range(n):
            d = DOMAINS[i % 4]
            toks = hay.tokens[d]
            if len(toks) < body + 1:
                raise NpuMoeError(f"lm-next: the held-out {d} text has {len(toks)} tokens, fewer than prompt_len "
                                  f"{prompt_len} + 1; use a prompt_len <= {len(toks) - 1 + len(head)}")
            start = sample_rng(self.name, seed, i).randrange(0, len(toks) - body)
            ids = head + [int(t) for t in toks[start:start + body]]
            out.append(Sample(ids, "next-token", answer=str(int(toks[start + body])),
                              meta={"domain": d, "start": start, "target": int(toks[start + body]),
                                    "top_k": self.top_k}))
        return out

    def score_next(self, sample: Sample, last_logits) -> float:
        """1.0 when the target token is among the top_k of the last position's logits [V] (ties: torch.topk's)."""
        top = last_logits.float().topk(self.top_k).indices    # a tensor method: the registry stays torch-free
        return float(int(sample.meta["target"]) in top.tolist())
