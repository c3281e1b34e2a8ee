"""The CPU loop's held-out runs, drawn at random from a declared grid (bench/cpu_loop.py --draw SEED).

A held-out set chosen by hand can end up being the settings a model happens to fit. Here the settings are drawn
from a seed over a grid declared before any run (docs/CPU_LOOP.md): every offline workload, prompts 128-2048
(log-uniform integers), chunks 32-512 (powers of two, chunk <= prompt), all 9 variants, the bundled model and a
2-layer Qwen3-30B-A3B-geometry model with random weights, dtype auto (this CPU's fast dtype) and fp32. Structure
decisions use the fixed development draw (DEV_SEED) only; an acceptance run uses a fresh seed, written down before
the run.

How many runs: draws are taken in order from the seed's stream until their a-priori cost (`estimated_s`, a formula
fixed here, independent of any measurement) would pass the budget, so a seed and a budget fix the set. The Qwen3
runs cost 10-100x a tiny one, so the model is drawn with probability P_QWEN (declared, not tuned).
"""
from __future__ import annotations

import math
import random
from dataclasses import asdict, dataclass

from npumoe_lab.errors import NpuMoeError

OFFLINE_WORKLOADS = ("ruler-multikey", "ruler-vt", "fewshot-cls", "lm-heldout", "lm-next")   # boolq/hellaswag: hub
PROMPT_RANGE = (128, 2048)
CHUNKS = (32, 64, 128, 256, 512)
VARIANTS = ("reference", "cpu-only", "naive-npu", "anemll", "npumoe-base", "npumoe-t", "npumoe-tg", "npumoe",
            "npumoe-spill")
MODELS = ("tiny", "qwen3-30b-a3b-2layer-random")
DTYPES = ("auto", "fp32")
P_QWEN = 0.25           # share of draws on the Qwen3 geometry (each costs 10-100x a tiny run)
DEV_SEED = 20261203     # the fixed development draw: structure decisions are made on it (and fit rows) only
GRID = {"workloads": OFFLINE_WORKLOADS, "prompts": PROMPT_RANGE, "chunks": CHUNKS, "variants": VARIANTS,
        "models": MODELS, "dtypes": DTYPES, "p_qwen": P_QWEN}


@dataclass(frozen=True)
class Setting:
    model: str
    workload: str
    variant: str
    prompt_len: int
    chunk: int
    dtype: str

    @property
    def qwen(self) -> bool:
        return self.model != "tiny"

    def label(self) -> str:
        return f"{self.model} {self.workload} {self.variant} p{self.prompt_len} c{self.chunk} {self.dtype}"


def draw_one(rng: random.Random) -> Setting:
    """One setting from the grid (the order of rng calls is part of the declared draw: do not reorder)."""
    model = MODELS[1] if rng.random() < P_QWEN else MODELS[0]
    lo, hi = PROMPT_RANGE
    prompt = int(round(math.exp(rng.uniform(math.log(lo), math.log(hi)))))
    chunk = rng.choice([c for c in CHUNKS if c <= prompt])
    return Setting(model=model, workload=rng.choice(OFFLINE_WORKLOADS), variant=rng.choice(VARIANTS),
                   prompt_len=prompt, chunk=chunk, dtype=rng.choice(DTYPES))


# a-priori seconds of one prefill (2 cores, bf16; fp32 x1.5), from the 2026-12-02 quiet-host loop's order of
# magnitude: tiny ~20 ms per chunk + 0.1 ms per token; Qwen3 2 layers ~0.3 s per chunk (its 2.4 GB of experts
# streamed) + 1.5 ms per token. Only sizes the draw to a budget; never compared with anything.
_PER_CHUNK = {"tiny": 0.02, "qwen": 0.3}
_PER_TOKEN = {"tiny": 1e-4, "qwen": 1.5e-3}
_SLOW_VARIANTS = {"npumoe-base": 2.3, "naive-npu": 1.5}


def prefill_s(s: Setting) -> float:
    kind = "qwen" if s.qwen else "tiny"
    t = math.ceil(s.prompt_len / s.chunk) * _PER_CHUNK[kind] + s.prompt_len * _PER_TOKEN[kind]
    return t * _SLOW_VARIANTS.get(s.variant, 1.0) * (1.5 if s.dtype == "fp32" else 1.0)


def repeats_of(s: Setting) -> int:
    """Timed repeats: 5 for sub-second prefills (a 3-repeat IQR is half the range of three values), else 3."""
    return 5 if prefill_s(s) < 1.0 else 3


def estimated_s(s: Setting, calib_tokens: int = 2048) -> float:
    """A-priori seconds of one drawn run: warm-up + repeats, plus the plan variants' calibration prefill."""
    calib = 0.0 if s.variant in ("reference", "cpu-only", "anemll") else \
        prefill_s(Setting(s.model, s.workload, "reference", calib_tokens, 512, s.dtype))
    return (repeats_of(s) + 1) * prefill_s(s) + calib + (3.0 if s.qwen else 0.5)


def min_prompt_len(workload: str) -> int:
    """The shortest prompt a workload builds (ruler tasks need room for their needles and question)."""
    from npumoe_lab.workloads import get_workload    # lazy: the workload registry, only when drawing
    return int(get_workload(workload).min_prompt_len)


def draw(seed: int, budget_s: float | None = None, n: int | None = None, max_n: int = 400) -> list[Setting]:
    """The held-out settings of `seed`: the first `n` draws, or (budget_s) draws in order while their estimated
    cost fits the budget (at least one). Deterministic per (seed, budget_s, n)."""
    if (budget_s is None) == (n is None):
        raise NpuMoeError("draw needs exactly one of budget_s (seconds) or n (a number of runs)")
    if n is not None and n < 1 or budget_s is not None and not budget_s > 0:
        raise NpuMoeError(f"draw needs n >= 1 or budget_s > 0; got n={n}, budget_s={budget_s}")
    rng, out, spent = random.Random(seed), [], 0.0
    while len(out) < (n or max_n):
        s = draw_one(rng)
        if s.prompt_len < min_prompt_len(s.workload):    # a setting the workload cannot build: drawn again
            continue
        if budget_s is not None:
            cost = estimated_s(s)
            if out and spent + cost > budget_s:
                break
            spent += cost
        out.append(s)
    return out


def describe(seed: int, settings: list[Setting]) -> str:
    """What was drawn, printed before any run (the record of the pre-registered set)."""
    lines = [f"held-out draw: seed {seed}, {len(settings)} runs (estimated {sum(map(estimated_s, settings)):.0f} s) "
             f"from the grid {GRID}"]
    lines += [f"  {i + 1:3d}. {s.label()}" for i, s in enumerate(settings)]
    return "\n".join(lines)


def as_dicts(settings) -> list[dict]:
    return [asdict(s) for s in settings]


__all__ = ["GRID", "DEV_SEED", "Setting", "draw", "draw_one", "describe", "estimated_s", "repeats_of", "as_dicts",
           "OFFLINE_WORKLOADS", "VARIANTS", "CHUNKS", "MODELS", "DTYPES"]
