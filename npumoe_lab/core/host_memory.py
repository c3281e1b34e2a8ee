"""Keep freed memory in the process, so a measured prefill does not pay the host's page faults.

glibc's malloc serves every block above its mmap threshold (at most 32 MB) with a fresh mmap and unmaps it on free.
A prefill of the Qwen3-30B-A3B geometry allocates such blocks in every chunk (eager attention's [heads, t, keys]
scores and softmax, 64 MB at 512 x 1,024 in fp32; the LM head's [t, vocab] logits, 311 MB), so each chunk
first-touches them again: 400k minor page faults (1.6 GB) per 1-layer fp32 prefill of 1,024 tokens in chunks of 512.
On these VMs a fault's cost is bimodal, set by the hypervisor (virtio balloon / free page reporting), not by the
process: the same attention op (512 tokens over 512 past, 71,684 faults) took 0.20 s or 0.66-0.89 s from one
prefill to the next, and `measure` read it at 0.13-0.83 s across prefills of one window (2026-12-07, 2-core Xeon:
docs/CPU_LOOP.md). No cost model can price which mode a run meets.

`keep_freed_memory()` turns glibc's mmap off for blocks (M_MMAP_MAX 0) and raises the trim threshold to 2 GB
(M_TRIM_THRESHOLD), so freed blocks stay in the heap and the next chunk reuses them without faults (the same
prefill: 0 faults after the first; alternated processes, its TTFT 0.77x in fp32 and 0.94x in bf16 of glibc's
policy: docs/PERFORMANCE.md). The price: the process keeps its peak heap until it exits (above it, what exceeds
2 GB is returned; peak RSS +0.2-0.6 GB on that prefill). A freed block is reused when a request fits in it: torch's
64-byte-aligned request of exactly a freed block's size can miss it (small blocks allocated after it keep it from
the heap's top), and then the heap grows instead (a loop of 64 MB tensors did so in 8 of 12 processes); the
prefills above settle after the first. Every prefill through the engine applies it (timed or not:
`run`, `measure`, accuracy, bench), and every measured row records the policy in force (`host_malloc`);
`NPUMOE_MALLOC=system` keeps glibc's own policy (rows then say `system`). Elsewhere than Linux with glibc it does
nothing and says so.
"""
from __future__ import annotations

import ctypes
import os
import platform

from npumoe_lab.errors import NpuMoeError

ENV = "NPUMOE_MALLOC"
M_TRIM_THRESHOLD, M_MMAP_MAX = -1, -4            # glibc's mallopt parameters (malloc.h)
TRIM_BYTES = 2**31 - 1                            # mallopt takes an int: the largest trim threshold it can hold
_STATE = {"policy": None}


def _glibc():
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return None
    try:
        return ctypes.CDLL("libc.so.6")
    except OSError:
        return None


def keep_freed_memory() -> str:
    """Apply the policy once per process (see the module doc) and return it: 'keep-freed', 'system' (NPUMOE_MALLOC=
    system) or 'system (no glibc)'. One clear error for an unknown NPUMOE_MALLOC value."""
    want = os.environ.get(ENV, "keep").strip().lower()
    if want not in ("keep", "system"):
        raise NpuMoeError(f"{ENV}={os.environ[ENV]!r}: use 'keep' (the default: freed memory stays in the process, "
                          "no page faults in measured prefills) or 'system' (glibc's own policy)")
    if _STATE["policy"] == "keep-freed":
        return _STATE["policy"]                   # applied once: it cannot be taken back in this process
    if want == "system":
        _STATE["policy"] = "system"
        return _STATE["policy"]
    libc = _glibc()
    ok = libc is not None and libc.mallopt(M_MMAP_MAX, 0) == 1 and libc.mallopt(M_TRIM_THRESHOLD, TRIM_BYTES) == 1
    _STATE["policy"] = "keep-freed" if ok else "system (no glibc)"
    return _STATE["policy"]


def malloc_policy() -> str:
    """The policy in force in this process, as rows record it (`host_malloc`): 'system' until one is applied."""
    return _STATE["policy"] or "system"


__all__ = ["keep_freed_memory", "malloc_policy", "ENV"]
