"""`fewshot-cls`: k-shot in-context classification of a passage's source domain, in the shape of BoolQ /
HellaSwag prompts, scored by log-likelihood over the choices (lm-eval style). Shots fill the prompt length."""
from __future__ import annotations

import random

from npumoe_lab.errors import NpuMoeError
from npumoe_lab.workloads.base import DOMAINS, Haystack, Sample, Workload, bos_id, encode

LABELS = {"scripture": " scripture", "drama": " drama", "pydocs": " documentation", "code": " code"}
CHOICES = tuple(LABELS[d] for d in DOMAINS)
FS_INTRO = "Classify the source of each passage.\n\n"
SNIPPET = 40  # tokens per shot passage


def build_fewshot(tok, rng: random.Random, hay: Haystack, total_len: int, snippet: int = SNIPPET,
                  query_domain: str | None = None, max_shots: int | None = None, query_len: int | None = None):
    """Returns (ids, label_index, label_spans, n_shots). ids = bos intro, shots 'Passage: <snippet>\\nSource:
    <label>\\n\\n' (as many as fit, at most max_shots), then 'Passage: <query>\\nSource:'; exactly total_len
    tokens. The query passage takes the remainder, or, with `query_len`, exactly query_len tokens and the remainder
    lengthens the first shot's passage. label_spans: token spans of the shots' labels (training targets)."""
    p_ids, s_ids, sep = encode(tok, "Passage: "), encode(tok, "\nSource:"), encode(tok, "\n\n")
    label_ids = {d: encode(tok, LABELS[d]) for d in DOMAINS}
    shot_len = len(p_ids) + snippet + len(s_ids) + max(map(len, label_ids.values())) + len(sep)
    head = bos_id(tok) + encode(tok, FS_INTRO)
    q_fixed = len(p_ids) + len(s_ids)
    n_shots = max(0, (total_len - len(head) - q_fixed - (query_len or snippet)) // shot_len)
    if max_shots is not None:
        n_shots = min(n_shots, max_shots)
    # without query_len each shot's domain is drawn just before its window (the draw order of earlier versions:
    # the same seed gives the same prompts); with it all domains first, to size the first passage
    shot_domains = [rng.choice(DOMAINS) for _ in range(n_shots)] if query_len is not None else [None] * n_shots
    extra = 0
    if query_len is not None:
        used = len(head) + q_fixed + query_len + sum(len(p_ids) + snippet + len(s_ids) + len(label_ids[d])
                                                     + len(sep) for d in shot_domains)
        extra = total_len - used
        if extra < 0 or (extra and not n_shots):
            raise NpuMoeError(f"fewshot-cls: prompt_len {total_len} cannot hold a {query_len}-token query passage "
                              f"with {snippet}-token shots exactly; use a longer prompt_len or allow more shots")
    ids, spans = list(head), []
    for j, d in enumerate(shot_domains):
        d = d or rng.choice(DOMAINS)
        w, _ = hay.window(rng, snippet + (extra if j == 0 else 0), d)
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

    def __init__(self, snippet: int = SNIPPET, max_shots: int | None = None, query_len: int | None = None):
        """Difficulty knobs: `snippet` tokens per shot passage; `max_shots` caps the shots (None: as many as fit;
        fewer shots leave a longer query passage); `query_len`: the query passage's tokens (None: the remainder,
        a shorter passage is harder to classify)."""
        if isinstance(snippet, bool) or not isinstance(snippet, int) or snippet < 1:
            raise NpuMoeError(f"fewshot-cls: snippet must be an int >= 1 (tokens per shot passage); got {snippet!r}")
        if max_shots is not None and (isinstance(max_shots, bool) or not isinstance(max_shots, int)
                                      or max_shots < 0):
            raise NpuMoeError(f"fewshot-cls: max_shots must be an int >= 0 or None; got {max_shots!r}")
        if query_len is not None and (isinstance(query_len, bool) or not isinstance(query_len, int)
                                      or query_len < 1):
            raise NpuMoeError(f"fewshot-cls: query_len must be an int >= 1 or None; got {query_len!r}")
        self.snippet, self.max_shots, self.query_len = snippet, max_shots, query_len

    def haystack_sample(self, tokenizer, rng, hay, prompt_len: int, i: int) -> Sample:
        ids, label, _, k = build_fewshot(tokenizer, rng, hay, prompt_len, snippet=self.snippet,
                                         query_domain=DOMAINS[i % 4], max_shots=self.max_shots,
                                         query_len=self.query_len)
        if self.max_shots and k < min(self.max_shots, 1):
            raise NpuMoeError(f"fewshot-cls: prompt_len {prompt_len} holds no shot of {self.snippet} tokens; use a "
                              "longer prompt_len or a shorter snippet")
        return Sample(ids, "choice", choices=CHOICES, label=label, meta={"domain": DOMAINS[label], "n_shots": k})


def synthetic_text(rng: random.Random, n: int = 100) -> str:
    return FS_INTRO + "".join(f"Passage: ...\nSource:{LABELS[rng.choice(DOMAINS)]}\n\n" for _ in range(n))
