"""How fast this host is right now: a fixed probe timed beside every measured repeat.

The busy counters (hostload.py) see other processes and the hypervisor's steal, not a neighbouring VM that shares
this socket's L3 and memory bandwidth, nor a clock that changed. Both move a whole run: on the quiet 2-core EPYC VM
of 2026-12-04 two runs of the same kind of work (tiny naive-npu, chunk 64, prompts 238 and 292) took 0.070 and
0.051 s per chunk, every op kind alike ~30 % slower in the first, with steal 4 % and 0 % and no other process. A
host model fitted at one speed then prices a run made at another with that error, whatever its structure.

So `measure` and `run` time this probe before each repeat: the kind of work a prefill of the tiny model is made
of, small GEMM calls (compute and dispatch) and one pass over a buffer larger than the L3 (memory bandwidth),
~10 ms. A run whose probe median differs from the fit's (cpu-fit.yaml host_fit.probe_s) by more than
PROBE_LIMIT is not counted by validate-device --runs, as a busy host's run is not; measure flags its rows the same
way against the median probe of the whole measurement. The probe times the host, never the model: it is never a
fit input and never rescales a measured time.
"""
from __future__ import annotations

import math
import time

import numpy as np

# A run whose host is this much slower or faster than when the fit rows were taken is not counted: the limit sits
# above the probe's own spread on a quiet host (a few %) and below the run-to-run swings it is there to catch.
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
    """'' when `probe` is within `limit` of `reference` (or either is unknown), else why the timing is not counted
    (`against`: what the reference was taken at)."""
    if not (probe and reference and math.isfinite(probe) and math.isfinite(reference)) or probe <= 0 or reference <= 0:
        return ""
    r = probe / reference
    if abs(math.log(r)) <= math.log1p(limit):
        return ""
    word = "slower" if r > 1 else "faster"
    return (f"host {abs(r - 1):.0%} {word} than {against} (speed probe {probe * 1e3:.2f} ms vs "
            f"{reference * 1e3:.2f} ms)")


__all__ = ["PROBE_LIMIT", "probe_s", "speed_note"]
