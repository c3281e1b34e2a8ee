"""How fast this host is right now: a fixed probe timed beside every measured repeat.

The busy counters (hostload.py) see other processes and the hypervisor's steal, not a neighbouring VM that shares
this socket's L3 and memory bandwidth, nor a clock that changed. Both move a whole run: on the quiet 2-core EPYC VM
of 2026-12-04 two runs of the same kind of work (tiny naive-npu, chunk 64, prompts 238 and 292) took 0.070 and
0.051 s per chunk, every op kind alike ~30 % slower in the first, with steal 4 % and 0 % and no other process. A
host model fitted at one speed then prices a run made at another with that error, whatever its structure.

So `measure` and `run` time this probe before each repeat: the kind of work a prefill of the tiny model is made
of, small GEMM calls (compute and dispatch) and one pass over a buffer larger than the L3 (memory bandwidth),
~10 ms. Each row keeps its reading (host_probe_s), the fit keeps its rows' median, and validate-device --runs
shows a run's reading beside the fit's (`speed_note`).

It is a reading, NOT an exclusion rule. From the morning of 2026-12-04 a run (and a measure row) whose probe was
more than PROBE_LIMIT off was not counted; on acceptance draw 4 (seed 3341736, docs/CPU_LOOP.md) that rule set
aside 14 of 27 held-out runs while the probe's log reading had no correlation with the runs' log error (-0.04), and
on the fit rows themselves the 1,368 it had flagged (of 7,088 with a low IQR) had the same median residual as the
rest (+2.5 % vs +2.4 %): the probe moves with the process's state, not with the host's speed for a prefill. So the
rule went, a change made after reading draw 4's errors (said there; draw 4 is spent). The probe times the host,
never the model: it is never a fit input and never rescales a measured time.

The speed anchor (experiments/speed_anchor.py): one fixed short prefill of the tiny geometry, ~65 ms. A development study on the
2-core EPYC VM, 2026-12-06 (docs/CPU_LOOP.md, "The speed anchor"; fresh timings, neither fit rows nor held-out
runs) timed the probe, 20 bf16 GEMMs, the anchor and four other prefills (bf16 and fp32; HF, static, one-expert
and dropless experts; 512-1,024 tokens) in rotation for 7 minutes. The prefills' speed moved in spells of about a
minute, 30-s medians from 0.79x to 1.19x of the whole run's; the anchor followed every prefill (30-s medians
correlated 0.96-0.98, the residual of log(prefill / anchor) sd 0.023-0.027 against 0.084-0.114 unscaled), the GEMMs
barely moved (1.10x range), and the probe moved against the prefills (correlation -0.57 to -0.74). So
`measure` and `run` time the anchor beside the probe (host_anchor_s), the fit keeps its rows' median, and
validate-device --runs multiplies a fit's price by the run's anchor over the fit's (`anchor_factor`), raised to
the fit's tracking slope (cpu_fit.anchor_tracking: how far the error of `measure`'s own prefills against the fit's
price follows their anchor, across prefills; first read repeat by repeat within a prefill, where the anchor's reading
noise pulled it towards 0): the host's speed at the run is measured, the model prices the op stream at the fit's.
Changes of the loop's structure made after reading held-out errors of earlier draws (said in docs/CPU_LOOP.md; each
is judged on a fresh seed).
"""
from __future__ import annotations

import math
import time

import numpy as np

# How far a probe reading must be from its reference before `speed_note` mentions it (a note, never a rule).
PROBE_LIMIT = 0.15
BUFFER_BYTES = 48 << 20       # > the L3 of every CPU seen here (32 MB): the pass streams from memory
_STATE: dict = {}


def _operands():
    import torch
    if "x" not in _STATE:
        g = torch.Generator().manual_seed(0)
        _STATE.update(x=torch.randn(64, 256, generator=g), w=torch.randn(256, 128, generator=g),
                      buf=torch.ones(BUFFER_BYTES // 4))
    return _STATE["x"], _STATE["w"], _STATE["buf"]


def probe_s(repeats: int = 3) -> float:
    """Median seconds of the probe (20 [64, 256] x [256, 128] fp32 GEMMs + one read of a 48 MB buffer)."""
    import torch
    x, w, buf = _operands()
    times = []
    with torch.inference_mode():
        for _ in range(repeats):
            t0 = time.perf_counter()
            for _ in range(20):
                torch.mm(x, w)
            buf.sum()
            times.append(time.perf_counter() - t0)
    return float(np.median(times))


GEOMETRY_FIELDS = ("hidden_size", "intermediate_size", "moe_intermediate_size", "num_experts", "num_local_experts",
                   "num_experts_per_tok", "num_attention_heads", "num_key_value_heads", "head_dim", "vocab_size")


def geometry_key(config) -> tuple:
    """What makes two models' prefills the same kind of work, layer count and weights apart."""
    return tuple(getattr(config, f, None) for f in GEOMETRY_FIELDS)


def anchor_factor(run_anchor, fit_anchor) -> float:
    """How much slower (> 1) the host ran a prefill at a run's anchor reading than at the fit rows' median: the
    factor a fit's price is multiplied by (1.0 when either reading is missing, e.g. a fit from before anchors)."""
    ok = all(isinstance(x, (int, float)) and math.isfinite(x) and x > 0 for x in (run_anchor, fit_anchor))
    return float(run_anchor / fit_anchor) if ok else 1.0


def speed_note(probe: float, reference: float, limit: float = PROBE_LIMIT, against: str = "when fitted") -> str:
    """'' when `probe` is within `limit` of `reference` (or either is unknown), else how far off it is (`against`:
    what the reference was taken at). Shown beside a run; it does not decide whether the run counts."""
    if not (probe and reference and math.isfinite(probe) and math.isfinite(reference)) or probe <= 0 or reference <= 0:
        return ""
    r = probe / reference
    if abs(math.log(r)) <= math.log1p(limit):
        return ""
    word = "slower" if r > 1 else "faster"
    return (f"host {abs(r - 1):.0%} {word} than {against} (speed probe {probe * 1e3:.2f} ms vs "
            f"{reference * 1e3:.2f} ms)")


__all__ = ["PROBE_LIMIT", "probe_s", "speed_note", "anchor_factor", "geometry_key"]
