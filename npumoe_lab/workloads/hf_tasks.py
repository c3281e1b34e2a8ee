"""Real BoolQ (2-shot) and HellaSwag (10-shot) in lm-eval's prompt formats, scored by choice log-likelihood.

Source: a hub name (loaded with `datasets`, needs the hub or its cache) or a local path (.jsonl / .json file of
records in the exact HF format; other local files/dirs go through `datasets`). Few-shot examples come from the
same records (never the query itself) unless `fewshot_source` is given.

lm-eval formats: BoolQ `"{passage}\\nQuestion: {question}?\\nAnswer:"`, choices `" no"` / `" yes"`; HellaSwag
query `preprocess(activity_label + ": " + ctx_a + " " + ctx_b.capitalize())`, choices `" " + preprocess(ending)`.
Shots are `text + " " + target` joined by `"\\n\\n"`. Exact prompt length: at least k shots, more shots are
prepended until the prompt reaches `prompt_len - 1` tokens, then the prompt is cut from the LEFT to exactly
`prompt_len - 1` tokens and `[bos]` is prepended (meta `n_shots` counts the shots at least partly kept).
"""
from __future__ import annotations

import json
import os
import random
import re
from pathlib import Path

from npumoe_lab.errors import NpuMoeError
from npumoe_lab.workloads.base import Sample, Workload, bos_id, encode

BOOLQ_FIELDS = ("passage", "question")
HELLASWAG_FIELDS = ("activity_label", "ctx_a", "ctx_b", "endings", "label")


def load_records(source: str, split: str, required: tuple[str, ...], label_fields: tuple[str, ...] = ()) -> list:
    p = Path(source)
    if p.suffix in (".jsonl", ".json") and p.is_file():
        text = p.read_text(encoding="utf-8")
        try:
            recs = ([json.loads(l) for l in text.splitlines() if l.strip()] if p.suffix == ".jsonl"
                    else json.loads(text))
        except json.JSONDecodeError as exc:
            raise NpuMoeError(f"{p}: not valid JSON ({exc})") from exc
        where = str(p)
    else:
        try:
            import datasets
        except ImportError as exc:
            raise NpuMoeError("loading a hub dataset needs `datasets` (pip install 'npumoe-lab[datasets]') or "
                              "a local .jsonl path") from exc
        try:
            ds = (datasets.load_dataset(str(p), split=split) if p.exists() else
                  datasets.load_dataset(source, split=split))
        except Exception as exc:
            raise NpuMoeError(f"could not load dataset {source!r} split {split!r} ({type(exc).__name__}: {exc}); "
                              f"offline, pass a local .jsonl file of HF records as source=") from exc
        recs, where = [dict(r) for r in ds], f"{source}[{split}]"
    if not recs:
        raise NpuMoeError(f"{where}: no records")
    for i, r in enumerate(recs):
        for f in required:
            if f not in r:
                raise NpuMoeError(f"{where}: record {i} lacks the field {f!r} (needed fields: {', '.join(required)}"
                                  + (f", and one of {', '.join(label_fields)}" if label_fields else "") + ")")
        if label_fields and not any(f in r for f in label_fields):
            raise NpuMoeError(f"{where}: record {i} lacks the label field (one of {', '.join(label_fields)})")
    return recs


class _ChoiceTask(Workload):
    kind = "choice"
    max_new_tokens = 4
    metric = "accuracy"
    k_shot = 0
    default_source = ""
    split = "validation"
    fewshot_split = "train"

    def __init__(self, source: str | None = None, fewshot_source: str | None = None, k_shot: int | None = None):
        env = f"NPUMOE_{self.name.upper()}_SOURCE"
        self.source = source or os.environ.get(env) or self.default_source
        self.fewshot_source = fewshot_source
        self.k_shot = self.k_shot if k_shot is None else k_shot
        self._recs = self._shots = None

    # subclasses: required fields, text(doc), choices(doc), gold(doc)
    def _load(self):
        if self._recs is None:
            self._recs = load_records(self.source, self.split, self.required, self.label_fields)
            self._shots = (load_records(self.fewshot_source, self.fewshot_split, self.required, self.label_fields)
                           if self.fewshot_source else None)
        return self._recs

    def shot_text(self, doc) -> str:
        return self.text(doc) + self.choices(doc)[self.gold(doc)]

    def samples(self, tokenizer, prompt_len: int, n: int, seed: int = 0) -> list[Sample]:
        self.check_prompt_len(tokenizer, prompt_len, minimum=32)
        recs = self._load()
        if n > len(recs):
            raise NpuMoeError(f"{self.name}: asked for {n} samples but {self.source} has {len(recs)} records")
        order = list(range(len(recs)))
        random.Random(f"{self.name}:{seed}").shuffle(order)
        out = []
        for i in order[:n]:
            doc = recs[i]
            pool = self._shots if self._shots is not None else [r for j, r in enumerate(recs) if j != i]
            if not pool and self.k_shot:
                raise NpuMoeError(f"{self.name}: no records left for {self.k_shot}-shot examples")
            rng = random.Random(f"{self.name}:{seed}:{i}")
            body = encode(tokenizer, self.text(doc))
            k = 0
            shots = []
            while pool and (k < self.k_shot or len(body) + sum(map(len, shots)) < prompt_len - 1):
                s = pool[rng.randrange(len(pool))]
                shots.insert(0, encode(tokenizer, self.shot_text(s) + "\n\n"))
                k += 1
                if k > 10_000:
                    break
            ids = [t for s in shots for t in s] + body
            kept, total = k, len(ids)
            while kept and total - len(shots[k - kept]) >= prompt_len - 1:
                total -= len(shots[k - kept])
                kept -= 1
            ids = bos_id(tokenizer) + ids[len(ids) - (prompt_len - len(bos_id(tokenizer))):]
            if len(ids) != prompt_len:
                raise NpuMoeError(f"{self.name}: could not fill {prompt_len} tokens (not enough records)")
            out.append(Sample(ids, "choice", choices=tuple(self.choices(doc)), label=self.gold(doc),
                              meta={"n_shots": kept, "source": self.source, "index": i,
                                    "query_truncated": len(body) > prompt_len - 1}))
        return out


class BoolQ(_ChoiceTask):
    name = "boolq"
    description = "BoolQ yes/no QA, lm-eval format, >= 2 shots (more prepended to fill the prompt)"
    k_shot = 2
    default_source = "google/boolq"
    required = BOOLQ_FIELDS
    label_fields = ("answer", "label")
    chance = 0.5

    def text(self, doc):
        return f"{doc['passage']}\nQuestion: {doc['question']}?\nAnswer:"

    def choices(self, doc):
        return [" no", " yes"]

    def gold(self, doc):
        v = doc["label"] if "label" in doc else doc["answer"]
        return int(bool(v))


def hellaswag_preprocess(text: str) -> str:
    """lm-eval's HellaSwag text cleaning."""
    text = text.strip()
    text = text.replace(" [title]", ". ")
    text = re.sub("\\[.*?\\]", "", text)
    text = text.replace("  ", " ")
    return text


class HellaSwag(_ChoiceTask):
    name = "hellaswag"
    description = "HellaSwag commonsense completion, lm-eval format, >= 10 shots (more prepended to fill)"
    k_shot = 10
    default_source = "Rowan/hellaswag"
    required = HELLASWAG_FIELDS
    label_fields = ()
    chance = 0.25

    def text(self, doc):
        ctx = doc["ctx_a"] + " " + doc["ctx_b"].capitalize()
        return hellaswag_preprocess(doc["activity_label"] + ": " + ctx)

    def choices(self, doc):
        return [" " + hellaswag_preprocess(e) for e in doc["endings"]]

    def gold(self, doc):
        try:
            return int(doc["label"])
        except (TypeError, ValueError) as exc:
            raise NpuMoeError(f"hellaswag: label {doc['label']!r} is not an index (test split has no labels)") from exc
