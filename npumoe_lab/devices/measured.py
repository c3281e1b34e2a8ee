"""Timing real work on this host: wall time, process CPU time, and package energy where RAPL exists.

The engine wraps each real op with `measure` (or a `Stopwatch`); the result feeds a timeline Event with
timing_source="measured". CPU time is the whole process (torch's intra-op threads included), so cpu_s can exceed
wall_s. Energy is only ever *measured* through RAPL (Linux powercap); this project's build VMs have none
(ENVIRONMENT.md §5), so energy_j is None there and the timeline models energy instead, and says so.
"""
from __future__ import annotations

import glob
import time
from dataclasses import dataclass
from pathlib import Path

from npumoe_lab.errors import NpuMoeError

RAPL_GLOB = "/sys/class/powercap/intel-rapl*"


@dataclass(frozen=True)
class Measurement:
    wall_s: float
    cpu_s: float                    # process CPU time (user + system, all threads)
    energy_j: float | None = None   # RAPL package energy; None where RAPL is absent

    def __post_init__(self):
        for f in ("wall_s", "cpu_s"):
            if not isinstance(getattr(self, f), (int, float)) or getattr(self, f) < 0:
                raise NpuMoeError(f"Measurement {f} must be a number >= 0, got {getattr(self, f)!r}")

    @property
    def timing_source(self) -> str:
        return "measured"


def rapl_domains() -> list[Path]:
    """Top-level RAPL package domains (intel-rapl:N, not subzones like intel-rapl:N:M); [] when absent."""
    out = []
    for d in sorted(glob.glob(RAPL_GLOB)):
        name = Path(d).name
        if name.count(":") == 1 and (Path(d) / "energy_uj").is_file():
            out.append(Path(d))
    return out


def rapl_available() -> bool:
    return bool(rapl_domains())


def read_rapl_uj() -> dict[Path, tuple[int, int]] | None:
    """{domain: (energy_uj, max_energy_range_uj)}; None when RAPL is absent or unreadable (e.g. permissions)."""
    out = {}
    try:
        for d in rapl_domains():
            wrap_file = d / "max_energy_range_uj"
            wrap = int(wrap_file.read_text()) if wrap_file.is_file() else 0
            out[d] = (int((d / "energy_uj").read_text()), wrap)
    except (OSError, ValueError):
        return None
    return out or None


def rapl_delta_j(before, after) -> float | None:
    """Joules between two read_rapl_uj() snapshots, handling counter wrap-around."""
    if before is None or after is None:
        return None
    total = 0
    for d, (e0, wrap) in before.items():
        e1 = after.get(d, (e0, wrap))[0]
        total += e1 - e0 if e1 >= e0 else e1 + wrap - e0
    return total / 1e6


class Stopwatch:
    """`with Stopwatch() as sw: work()` then `sw.measurement`."""

    def __init__(self, energy: bool = True):
        self._energy = energy
        self.measurement: Measurement | None = None

    def __enter__(self) -> "Stopwatch":
        self._e0 = read_rapl_uj() if self._energy else None
        self._c0 = time.process_time()
        self._t0 = time.perf_counter()
        return self

    def __exit__(self, *exc) -> None:
        wall = time.perf_counter() - self._t0
        cpu = time.process_time() - self._c0
        energy = rapl_delta_j(self._e0, read_rapl_uj()) if self._e0 is not None else None
        self.measurement = Measurement(wall, cpu, energy)


def measure(fn, *args, **kwargs):
    """Run fn(*args, **kwargs) once; returns (result, Measurement)."""
    with Stopwatch() as sw:
        result = fn(*args, **kwargs)
    return result, sw.measurement
