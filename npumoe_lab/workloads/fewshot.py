"""`fewshot-cls`: k-shot in-context classification of a passage's source domain, in the shape of BoolQ /
HellaSwag prompts, scored by log-likelihood over the choices (lm-eval style). Shots fill the prompt length."""
from __future__ import annotations

import random

from npumoe_lab.workloads.base import DOMAINS, Haystack, Sample, Workload, bos_id, encode

LABELS = {"scripture": " scripture", "drama": " drama", "pydocs": " documentation", "code": " code"}
CHOICES = tuple(LABELS[d] for d in DOMAINS)
FS_INTRO = "Classify the source of each passage.\n\n"
SNIPPET = 40  # tokens per shot passage


def build_fewshot(tok, rng: random.Random, hay: Haystack, total_len: int, snippet: int = SNIPPET,
                  query_domain: str | None = None):
    """Returns (ids, label_index, label_spans, n_shots). ids = bos intro, shots 'Passage: <snippet>\\nSource:
    <label>\\n\\n' (as many as fit), then 'Passage: <query>\\nSource:'; exactly total_len tokens (the query
    passage takes the remainder). label_spans: token spans of the shots' labels (training targets)."""
    p_ids, s_ids, sep = encode(tok, "Passage: "), encode(tok, "\nSource:"), encode(tok, "\n\n")
    label_ids = {d: encode(tok, LABELS[d]) for d in DOMAINS}
    shot_len = len(p_ids) + snippet + len(s_ids) + max(map(len, label_ids.values())) + len(sep)
    head = bos_id(tok) + encode(tok, FS_INTRO)
    q_fixed = len(p_ids) + len(s_ids)
    n_shots = max(0, (total_len - len(head) - q_fixed - snippet) // shot_len)
    ids, spans = list(head), []
    for _ in range(n_shots):
        d = rng.choice(DOMAINS)
        w, _ = hay.window(rng, snippet, d)
        ids += p_ids + w + s_ids
        spans.append((len(ids), len(ids) + len(label_ids[d])))
        ids += label_ids[d] + sep
    qd = query_domain or rng.choice(DOMAINS)
    q_len = total_len - len(ids) - q_fixed
    w, _ = hay.window(rng, q_len, qd)
    ids += p_ids + w + s_ids
    return ids, DOMAINS.index(qd), spans, n_shots


class FewShotCls(Workload):
    name = "fewshot-cls"
    kind = "choice"
    description = ("k-shot in-context classification of a passage's source (scripture / drama / documentation / "
                   "code), shots fill the prompt; accuracy by summed log-likelihood of the choices")
    max_new_tokens = 4
    metric = "accuracy"
    chance = 0.25

    min_prompt_len = 128

    def haystack_sample(self, tokenizer, rng, hay, prompt_len: int, i: int) -> Sample:
        ids, label, _, k = build_fewshot(tokenizer, rng, hay, prompt_len, query_domain=DOMAINS[i % 4])
        return Sample(ids, "choice", choices=CHOICES, label=label, meta={"domain": DOMAINS[label], "n_shots": k})


def synthetic_text(rng: random.Random, n: int = 100) -> str:
    return FS_INTRO + "".join(f"Passage: ...\nSource:{LABELS[rng.choice(DOMAINS)]}\n\n" for _ in range(n))
