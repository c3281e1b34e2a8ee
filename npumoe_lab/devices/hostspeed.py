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


__all__ = ["PROBE_LIMIT", "probe_s", "speed_note"]
