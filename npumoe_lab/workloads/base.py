"""Workload contract: `Sample`, `Workload`, and the token-level haystack helpers shared by the generators.

Generators work on token ids, so every prompt is EXACTLY `prompt_len` tokens: the pieces (instruction, needles,
query) are tokenized alone and the haystack window is cut to fill the rest. The same generators build the
training sequences of the tiny model (`npumoe_lab.train.trainer`) from the training split and another seed stream.
"""
from __future__ import annotations

import random
from dataclasses import dataclass, field

from npumoe_lab.errors import NpuMoeError
from npumoe_lab.workloads.texts import DOMAINS, bundled_text

__all__ = ["DOMAINS", "Sample", "Workload", "Haystack"]


@dataclass(frozen=True)
class Sample:
    input_ids: list[int]            # the prompt, EXACTLY prompt_len tokens
    kind: str                       # "generate" | "choice" | "perplexity" | "next-token"
    answer: str | None = None       # generate: the reference string
    choices: tuple[str, ...] | None = None  # choice: continuations, scored by summed log-likelihood
    label: int | None = None        # choice: index of the correct choice
    meta: dict = field(default_factory=dict)


class Workload:
    name: str = ""
    kind: str = "generate"
    description: str = ""
    max_new_tokens: int = 0
    metric: str = "exact_match"
    chance: float = 0.0

    min_prompt_len: int = 64

    def samples(self, tokenizer, prompt_len: int, n: int, seed: int = 0) -> list[Sample]:
        """n samples of exactly `prompt_len` tokens, sample i drawn by `haystack_sample` with its own seed stream
        from the held-out haystack (workloads that are not built on the haystack override this)."""
        self.check_prompt_len(tokenizer, prompt_len, minimum=self.min_prompt_len)
        hay = eval_haystack(tokenizer)
        out = []
        for i in range(n):
            sample = self.haystack_sample(tokenizer, sample_rng(self.name, seed, i), hay, prompt_len, i)
            assert len(sample.input_ids) == prompt_len, (len(sample.input_ids), prompt_len)
            out.append(sample)
        return out

    def haystack_sample(self, tokenizer, rng, hay, prompt_len: int, i: int) -> Sample:
        raise NotImplementedError(f"workload {self.name!r} defines neither samples() nor haystack_sample()")

    def score_generation(self, sample: Sample, generated_text: str) -> float:
        raise NpuMoeError(f"workload {self.name!r} is of kind {self.kind!r}; it has no generation score")

    def check_prompt_len(self, tokenizer, prompt_len: int, minimum: int = 64) -> None:
        limit = context_limit(tokenizer)
        need = prompt_len + self.max_new_tokens
        if not isinstance(prompt_len, int) or prompt_len < minimum:
            raise NpuMoeError(f"{self.name}: prompt_len must be an int >= {minimum}, got {prompt_len!r}")
        if limit is not None and need > limit:
            raise NpuMoeError(f"{self.name}: prompt_len {prompt_len} + {self.max_new_tokens} new tokens exceeds the "
                              f"model context of {limit} tokens; use a prompt_len <= {limit - self.max_new_tokens}")

    def __repr__(self):
        return f"<Workload {self.name} kind={self.kind} metric={self.metric}>"


def context_limit(tokenizer) -> int | None:
    """The context the tokenizer (and its model) declares; None when it declares none (HF's huge sentinel)."""
    lim = getattr(tokenizer, "model_max_length", None)
    if lim is None or lim > 10_000_000:
        return None
    return int(lim)


def encode(tokenizer, text: str) -> list[int]:
    """Token ids of a whole text. Texts longer than the context are cut into documents/prompts afterwards, so
    transformers' "longer than the specified maximum sequence length" warning (meant for model inputs) is off."""
    return list(tokenizer.encode(text, add_special_tokens=False, **quiet_kwargs(tokenizer)))


def quiet_kwargs(tokenizer) -> dict:
    """verbose=False for transformers tokenizers (others, e.g. the tests' character tokenizer, lack it)."""
    from transformers import PreTrainedTokenizerBase
    return {"verbose": False} if isinstance(tokenizer, PreTrainedTokenizerBase) else {}


def bos_id(tokenizer) -> list[int]:
    """[bos] when the tokenizer has one (else eos, else nothing): every prompt starts with it."""
    for attr in ("bos_token_id", "eos_token_id"):
        tid = getattr(tokenizer, attr, None)
        if tid is not None:
            return [int(tid)]
    return []


def _cache(tokenizer) -> dict:
    """Per-tokenizer cache stored on the tokenizer object (an id()-keyed dict could outlive the object)."""
    c = getattr(tokenizer, "_npumoe_cache", None)
    if c is None:
        c = {}
        try:
            object.__setattr__(tokenizer, "_npumoe_cache", c)
        except (AttributeError, TypeError):
            pass
    return c


def newline_ids(tokenizer) -> frozenset:
    """Token ids whose text contains a newline followed only by spaces (insertion points at line starts)."""
    _NL_CACHE = _cache(tokenizer)
    key = "newline_ids"
    if key not in _NL_CACHE:
        vocab = tokenizer.get_vocab() if hasattr(tokenizer, "get_vocab") else {}
        ids = []
        for i in vocab.values():
            text = tokenizer.decode([i])
            if "\n" in text and not text[text.rfind("\n") + 1:].strip(" \t"):
                ids.append(i)
        _NL_CACHE[key] = frozenset(ids)
    return _NL_CACHE[key]


class Haystack:
    """Per-domain token streams to cut windows from (eval: bundled heldout text; training: the train split)."""

    def __init__(self, tokens_by_domain: dict[str, list[int]], newline: frozenset = frozenset()):
        self.tokens = {d: t for d, t in tokens_by_domain.items() if len(t) > 0}
        self.domains = sorted(self.tokens)
        self.newline = newline

    @classmethod
    def from_texts(cls, tokenizer, texts: dict[str, str]) -> "Haystack":
        return cls({d: encode(tokenizer, t) for d, t in texts.items()}, newline_ids(tokenizer))

    def window(self, rng: random.Random, n: int, domain: str | None = None) -> tuple[list[int], str]:
        domain = domain or rng.choice(self.domains)
        toks = self.tokens[domain]
        if n <= 0:
            return [], domain
        if len(toks) < n:  # short source: wrap around
            toks = list(toks) * (n // len(toks) + 2)
        start = rng.randrange(0, len(toks) - n + 1)
        win = toks[start:start + n]
        return (win.tolist() if hasattr(win, "tolist") else list(win)), domain

    def insert(self, rng: random.Random, hay: list[int], pieces: list[list[int]],
               depths: list[float] | None = None) -> tuple[list[int], list[int]]:
        """Insert token pieces into hay (in the given order) at depths in [0, 1], snapped to the next line start
        when one is near. Returns (ids, start offsets of each piece in ids)."""
        n = len(hay)
        if depths is None:
            depths = sorted(rng.random() for _ in pieces)
        positions = []
        for d in depths:
            p = int(d * n)
            for q in list(range(p, min(n, p + 80))) + list(range(p - 1, max(0, p - 80), -1)):
                if q == 0 or hay[q - 1] in self.newline:
                    p = q
                    break
            positions.append(p)
        # keep the requested order: positions must be non-decreasing
        for i in range(1, len(positions)):
            positions[i] = max(positions[i], positions[i - 1])
        out, starts, prev = [], [], 0
        for p, piece in zip(positions, pieces):
            out.extend(hay[prev:p])
            starts.append(len(out))
            out.extend(piece)
            prev = p
        out.extend(hay[prev:])
        return out, starts


def eval_haystack(tokenizer, split: str = "heldout") -> Haystack:
    """Haystack from the bundled data/text/<domain>/<split>.txt (never seen in training)."""
    _EVAL_HAY = _cache(tokenizer)
    key = ("eval_haystack", split)
    if key not in _EVAL_HAY:
        _EVAL_HAY[key] = Haystack.from_texts(tokenizer, {d: bundled_text(d, split) for d in DOMAINS})
    return _EVAL_HAY[key]


def sample_rng(name: str, seed: int, index: int) -> random.Random:
    """One independent, reproducible stream per (workload, seed, sample index)."""
    return random.Random(f"{name}:{seed}:{index}")
