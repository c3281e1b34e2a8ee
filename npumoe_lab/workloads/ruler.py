"""RULER-style synthetic long-context tasks on a natural-text haystack: multi-key needle retrieval
(`ruler-multikey`, after RULER niah_multikey) and variable tracking (`ruler-vt`).

`build_multikey` / `build_vt` return a `TaskSeq`: context ids (bos + instruction + haystack with the inserted
pieces) followed by (query, answer) pairs. Evaluation uses one query and stops before its answer; training
(`npumoe_lab.train.trainer`) appends several answered queries and puts extra loss weight on the answers.
"""
from __future__ import annotations

import random
import re
from dataclasses import dataclass, field

from npumoe_lab.errors import NpuMoeError
from npumoe_lab.workloads.base import Haystack, Sample, Workload, bos_id, encode

ADJECTIVES = ("lively", "quiet", "brave", "calm", "eager", "fancy", "gentle", "happy", "jolly", "kind", "proud",
              "silly", "witty", "zealous", "ancient", "bitter", "bright", "clever", "crimson", "dusty", "early",
              "faint", "golden", "hollow", "icy", "jagged", "lucky", "misty", "narrow", "olive", "purple", "rapid",
              "rusty", "shiny", "sturdy", "tender", "vast", "wild", "young", "noisy")
NOUNS = ("tiger", "river", "castle", "falcon", "garden", "hammer", "island", "jacket", "kettle", "lantern",
         "meadow", "needle", "orange", "pepper", "quartz", "rabbit", "saddle", "teapot", "umbrella", "violin",
         "walnut", "yacht", "zebra", "anchor", "basket", "candle", "dragon", "engine", "feather", "glacier",
         "harbor", "igloo", "jungle", "kitten", "lemon", "mirror", "nectar", "otter", "pillow", "rocket")

MK_INTRO = ("Some special magic numbers are hidden within the following text. Make sure to memorize it. "
            "I will quiz you about the numbers afterwards.\n")
MK_NEEDLE = "One of the special magic numbers for {key} is: {value}.\n"
# The answer prefix restates the needle's own wording ("... for {key} is:"), as RULER's answer prefix restates the
# question: a small model can then answer by matching the key's tokens (induction) instead of paraphrase.
MK_QUERY = ("\nWhat is the special magic number for {key} mentioned in the provided text? "
            "The special magic number for {key} is:")
VT_INTRO = "Memorize and track the chain(s) of variable assignment hidden in the following text.\n"
# Assignments are written source-first (R's `value -> name`), and the answer walks the chain in the same notation,
# so each hop is a forward lookup of the name that follows the previous one (RULER writes `VAR B = VAR A`, whose
# hops are backward lookups a 14M-parameter model did not learn in 112 CPU-minutes; see the model card).
VT_FIRST = "ASSIGN {value} -> {name}.\n"
VT_LINK = "ASSIGN {prev} -> {name}.\n"
VT_QUERY = ("\nQuestion: Find all variables that are assigned the value {value} in the text above. "
            "Answer: There are {n} of them. Following the chain of assignments: {value}")


@dataclass
class TaskSeq:
    context: list[int]
    queries: list[tuple[list[int], list[int], str]]  # (query ids, answer ids, answer text)
    meta: dict = field(default_factory=dict)

    def training_ids(self, eos: list[int]) -> tuple[list[int], list[int]]:
        """ids = context + q1 a1 . q2 a2 ...; mask marks answer tokens (targets to up-weight)."""
        ids, mask = list(self.context), [0] * len(self.context)
        for q, a, _ in self.queries:
            ids += q
            mask += [0] * len(q)
            ids += a
            mask += [1] * len(a)
        return ids, mask


def random_keys(rng: random.Random, n: int, key_nouns: int | None = None) -> list[str]:
    """n distinct 'adjective-noun' keys; `key_nouns` draws the nouns from only that many (keys then share their
    last word, the one right before 'is:', so matching it alone no longer finds the asked needle)."""
    adjs, nouns = ADJECTIVES, NOUNS
    if key_nouns is not None:
        if key_nouns * len(ADJECTIVES) < n:
            raise NpuMoeError(f"key_nouns={key_nouns} makes only {key_nouns * len(ADJECTIVES)} distinct keys for "
                              f"{n} needles; use more key_nouns or fewer needles")
        nouns = rng.sample(NOUNS, key_nouns)
    pairs = set()
    while len(pairs) < n:
        pairs.add(f"{rng.choice(adjs)}-{rng.choice(nouns)}")
    return rng.sample(sorted(pairs), n)


def random_values(rng: random.Random, n: int, lo: int, hi: int) -> list[int]:
    vals = set()
    while len(vals) < n:
        vals.add(rng.randint(lo, hi))
    return rng.sample(sorted(vals), n)


def _fill(rng, tok, hay: Haystack, total: int, head: list[int], pieces: list[list[int]], tail_len: int,
          domain=None, depths=None):
    budget = total - len(head) - sum(map(len, pieces)) - tail_len
    if budget < 16:
        raise NpuMoeError(f"prompt length {total} is too short for {len(pieces)} inserted pieces "
                          f"({sum(map(len, pieces))} tokens) plus the query; use a longer prompt_len")
    window, domain = hay.window(rng, budget, domain)
    body, starts = hay.insert(rng, window, pieces, depths)
    return head + body, [s + len(head) for s in starts], domain


def build_multikey(tok, rng: random.Random, hay: Haystack, total_len: int, n_needles: int = 4,
                   n_queries: int = 1, answered_last: bool = False, domain: str | None = None,
                   key_nouns: int | None = None) -> TaskSeq:
    """total_len counts the context + all queries (+ all answers if answered_last; else the last answer is
    excluded: evaluation prompt). `key_nouns`: see random_keys."""
    keys = random_keys(rng, n_needles, key_nouns)
    values = [str(v) for v in random_values(rng, n_needles, 100_000, 9_999_999)]
    needles = [encode(tok, MK_NEEDLE.format(key=k, value=v)) for k, v in zip(keys, values)]
    asked = rng.sample(range(n_needles), min(n_queries, n_needles))
    queries = []
    for i in asked:
        queries.append((encode(tok, MK_QUERY.format(key=keys[i])), encode(tok, f" {values[i]}."), values[i]))
    tail = sum(len(q) + len(a) for q, a, _ in queries)
    if not answered_last:
        tail -= len(queries[-1][1])
    head = bos_id(tok) + encode(tok, MK_INTRO)
    ctx, starts, domain = _fill(rng, tok, hay, total_len, head, needles, tail, domain)
    return TaskSeq(ctx, queries, {"keys": keys, "values": values, "asked": asked, "n_needles": n_needles,
                                  "domain": domain, "needle_pos": starts})


def random_names(rng: random.Random, n: int) -> list[str]:
    names = set()
    while len(names) < n:
        names.add("".join(rng.choice("ABCDEFGHIJKLMNOPQRSTUVWXYZ") for _ in range(5)))
    return rng.sample(sorted(names), n)


def build_vt(tok, rng: random.Random, hay: Haystack, total_len: int, n_vars: int = 3, n_chains: int = 2,
             n_queries: int = 1, answered_last: bool = False, domain: str | None = None,
             vary_len: bool = False) -> TaskSeq:
    lens = [rng.randint(2, n_vars + 1) if vary_len else n_vars for _ in range(n_chains)]
    names = random_names(rng, sum(lens))
    values = [str(v) for v in random_values(rng, n_chains, 10_000, 99_999)]
    chains, k = [], 0
    for c in range(n_chains):
        chains.append(names[k:k + lens[c]])
        k += lens[c]
    # statements of all chains interleaved at random depths, order kept inside each chain
    slots = []
    for c, chain in enumerate(chains):
        for j in range(len(chain)):
            slots.append((c, j))
    depths = sorted(rng.random() for _ in slots)
    rng.shuffle(slots)
    order = {c: iter(sorted(j for cc, j in slots if cc == c)) for c in range(n_chains)}
    seq = [(c, next(order[c])) for c, _ in slots]
    texts = []
    for c, j in seq:
        chain = chains[c]
        texts.append(VT_FIRST.format(name=chain[0], value=values[c]) if j == 0
                     else VT_LINK.format(name=chain[j], prev=chain[j - 1]))
    pieces = [encode(tok, t) for t in texts]
    asked = rng.sample(range(n_chains), min(n_queries, n_chains))
    queries = []
    for c in asked:
        queries.append((encode(tok, VT_QUERY.format(value=values[c], n=len(chains[c]))),
                        encode(tok, "".join(f" -> {v}" for v in chains[c]) + ".\n"), " ".join(chains[c])))
    tail = sum(len(q) + len(a) for q, a, _ in queries)
    if not answered_last:
        tail -= len(queries[-1][1])
    head = bos_id(tok) + encode(tok, VT_INTRO)
    ctx, starts, domain = _fill(rng, tok, hay, total_len, head, pieces, tail, domain, depths)
    return TaskSeq(ctx, queries, {"chains": chains, "values": values, "asked": asked, "domain": domain,
                                  "statements": texts})


def check_count(workload: str, option: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise NpuMoeError(f"{workload}: {option} must be an int >= 1; got {value!r}")
    return value


def parse_names(text: str) -> list[str]:
    """Variable names in a generated answer: 5-uppercase-letter words before the first newline/question."""
    text = text.split("\n")[0].split("Question")[0]
    return re.findall(r"\b[A-Z]{5}\b", text)


class MultiKey(Workload):
    name = "ruler-multikey"
    kind = "generate"
    description = ("RULER niah_multikey: several 'special magic number' needles in a natural-text haystack "
                   "(bundled held-out text), retrieve the value of one key; exact match on the number")
    max_new_tokens = 12
    metric = "exact_match"
    chance = 0.0

    def __init__(self, n_needles: int = 4, key_nouns: int | None = None):
        """Difficulty knobs: `n_needles` key-value needles in the haystack (one is asked; the rest distract);
        `key_nouns`: keys drawn from only that many nouns (None: all 40), so distractor keys end like the asked
        one."""
        self.n_needles = check_count("ruler-multikey", "n_needles", n_needles)
        self.key_nouns = None if key_nouns is None else check_count("ruler-multikey", "key_nouns", key_nouns)
        if self.key_nouns is not None and self.key_nouns * len(ADJECTIVES) < self.n_needles:
            raise NpuMoeError(f"ruler-multikey: key_nouns={key_nouns} makes only {key_nouns * len(ADJECTIVES)} "
                              f"distinct keys for {n_needles} needles; use more key_nouns")

    min_prompt_len = 256

    def haystack_sample(self, tokenizer, rng, hay, prompt_len: int, i: int) -> Sample:
        t = build_multikey(tokenizer, rng, hay, prompt_len, self.n_needles, n_queries=1,
                           domain=hay.domains[i % len(hay.domains)], key_nouns=self.key_nouns)
        q, _, ans = t.queries[-1]
        key = t.meta["keys"][t.meta["asked"][-1]]
        return Sample(t.context + q, "generate", answer=ans,
                      meta={"domain": t.meta["domain"], "n_needles": self.n_needles, "key": key,
                            "needle_pos": t.meta["needle_pos"]})

    def score_generation(self, sample: Sample, generated_text: str) -> float:
        m = re.search(r"\d+", generated_text)
        return float(m is not None and m.group(0) == sample.answer)


class VariableTracking(Workload):
    name = "ruler-vt"
    kind = "generate"
    description = ("RULER variable tracking: chains 'ASSIGN 12345 -> ABCDE.' 'ASSIGN ABCDE -> FGHIJ.' hidden in a "
                   "natural-text haystack with distractor chains; list all variables holding a value; exact set match")
    max_new_tokens = 24
    metric = "exact_match"
    chance = 0.0

    def __init__(self, n_vars: int = 3, n_chains: int = 2, vary_len: bool = False):
        """Difficulty knobs: `n_vars` hops per chain, `n_chains` chains (one is asked; the rest distract);
        `vary_len`: each chain 2..n_vars+1 hops long instead (a mix of easy and hard chains)."""
        self.n_vars = check_count("ruler-vt", "n_vars", n_vars)
        self.n_chains = check_count("ruler-vt", "n_chains", n_chains)
        if not isinstance(vary_len, bool):
            raise NpuMoeError(f"ruler-vt: vary_len must be True or False; got {vary_len!r}")
        self.vary_len = vary_len

    min_prompt_len = 256

    def haystack_sample(self, tokenizer, rng, hay, prompt_len: int, i: int) -> Sample:
        t = build_vt(tokenizer, rng, hay, prompt_len, self.n_vars, self.n_chains, n_queries=1,
                     domain=hay.domains[i % len(hay.domains)], vary_len=self.vary_len)
        q, _, ans = t.queries[-1]
        c = t.meta["asked"][-1]
        return Sample(t.context + q, "generate", answer=ans,
                      meta={"domain": t.meta["domain"], "n_vars": self.n_vars, "n_chains": self.n_chains,
                            "value": t.meta["values"][c], "chains": t.meta["chains"]})

    def recall(self, sample: Sample, generated_text: str) -> float:
        ref = set(sample.answer.split())
        return len(ref & set(parse_names(generated_text))) / len(ref)

    def score_generation(self, sample: Sample, generated_text: str) -> float:
        return float(set(parse_names(generated_text)) == set(sample.answer.split()))


def synthetic_text(rng: random.Random, n: int = 400) -> str:
    """Task-template text (no haystack) for training the tokenizer: needles, queries, VT statements."""
    lines = [MK_INTRO, VT_INTRO]
    for _ in range(n):
        k, v = random_keys(rng, 1)[0], rng.randint(100_000, 9_999_999)
        lines.append(MK_NEEDLE.format(key=k, value=v) + MK_QUERY.format(key=k) + f" {v}.\n")
        a, b, c = random_names(rng, 3)
        val = rng.randint(10_000, 99_999)
        lines.append(VT_FIRST.format(name=a, value=val) + VT_LINK.format(name=b, prev=a)
                     + VT_LINK.format(name=c, prev=b) + VT_QUERY.format(value=val, n=3) + f" -> {a} -> {b} -> {c}.\n")
    return "".join(lines)
