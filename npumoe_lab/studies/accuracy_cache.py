"""On-disk cache of the accuracy curve's reference records (accuracy_scoring.ReferenceRecord), one file per sample.

The dropless reference of a sample depends only on the model's weights, the dtype it computes in, the task and its
difficulty setting (options and prompt length), the sample seed and index, and the prefill chunk; so a re-run, or
a second curve over the same samples (other percentiles, other saliency rules, other plans), loads it instead of
running the reference forward (and, for generation tasks, the greedy decode) again. The key holds every one of
those parts; any change gives another key, so a stale record is never read. The sample's own token ids are hashed
into the file name as well: a change in how a workload builds its prompts invalidates it too.
Layout: cache_dir()/accuracy-refs/<key of the task's parts>/<sample index>-<token ids hash>.pt
"""
from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import torch

from npumoe_lab.core.cpu_features import dtype_name
from npumoe_lab.models import model_fingerprint
from npumoe_lab.results.atomic import atomic_open
from npumoe_lab.studies.accuracy_scoring import ReferenceRecord
from npumoe_lab.utils import cache_dir, sha256_json

# bump when ReferenceRecord's content or the way it is computed changes (old files are then never read)
RECORD_VERSION = 1


def reference_key(model, workload: str, difficulty, seed: int, chunk: int) -> dict:
    """The parts a sample's reference record depends on (besides its index and token ids)."""
    return dict(model=model_fingerprint(model), dtype=dtype_name(next(model.parameters()).dtype),
                workload=workload, prompt_len=int(difficulty.prompt_len),
                options={k: difficulty.options[k] for k in sorted(difficulty.options)}, seed=int(seed),
                chunk=int(chunk), torch=str(torch.__version__), version=RECORD_VERSION)


def _ids_hash(ids) -> str:
    return hashlib.sha256(np.asarray(ids, dtype=np.int64).tobytes()).hexdigest()[:16]


class ReferenceCache:
    """Reference records of one task's samples under one key (reference_key); `folder=None`: the workbench cache."""

    def __init__(self, key: dict, folder: Path | None = None):
        self.key = key
        self.dir = Path(folder or cache_dir() / "accuracy-refs") / sha256_json(key)[:24]
        self.hits = self.misses = 0

    def _path(self, index: int, sample) -> Path:
        return self.dir / f"{index}-{_ids_hash(sample.input_ids)}.pt"

    def get(self, index: int, sample) -> ReferenceRecord | None:
        path = self._path(index, sample)
        if not path.is_file():
            self.misses += 1
            return None
        d = torch.load(path, weights_only=True)
        if d.get("key") != self.key:          # a hash collision or a hand-edited file: recompute, never trust it
            self.misses += 1
            return None
        self.hits += 1
        return ReferenceRecord(d["score"], d["top1"], d["nll"], d["generated"])

    def put(self, index: int, sample, rec: ReferenceRecord) -> None:
        with atomic_open(self._path(index, sample), "wb") as fh:   # workers share the cache: never a partial file
            torch.save(dict(key=self.key, score=float(rec.score), top1=rec.top1.cpu(), nll=float(rec.nll),
                            generated=None if rec.generated is None else [int(t) for t in rec.generated]), fh)


def cached_references(samples, cache: ReferenceCache | None, compute, on_each=None) -> list[ReferenceRecord]:
    """The reference record of every sample: from `cache` where it has one, else `compute(sample)` (then stored).
    `on_each()` after each sample (a progress bar)."""
    out = []
    for i, s in enumerate(samples):
        rec = cache.get(i, s) if cache is not None else None
        if rec is None:
            rec = compute(s)
            if cache is not None:
                cache.put(i, s, rec)
        out.append(rec)
        if on_each is not None:
            on_each()
    return out


__all__ = ["RECORD_VERSION", "ReferenceCache", "cached_references", "reference_key"]
