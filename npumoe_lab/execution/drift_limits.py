"""The drift monitor's limits and recalibration policies, apart from the monitor (drift.py): the CLI's `drift` flags
list them with their defaults without importing numpy, pandas or torch."""
from __future__ import annotations

from dataclasses import dataclass

from npumoe_lab.errors import NpuMoeError

POLICIES = ("off", "warn", "rebuild")


@dataclass(frozen=True)
class DriftLimits:
    """A record is flagged when any limit is crossed. Defaults sit above the per-chunk noise of 128-token chunks
    of the calibration domain itself, measured on the bundled model (plan on scripture, lm-heldout scripture, 16
    chunks x 4 layers: max JS 0.25, min overlap 0.5, max drop excess 0.025, max pad excess 0.012) and below what
    scripture -> code gives (JS >= 0.33, drop excess >= 0.10 before any rebuild); docs/DESIGN.md "Drift"."""
    drop_excess: float = 0.05     # observed - expected drop rate (absolute)
    pad_excess: float = 0.05      # observed - expected padding share of the static slots (absolute)
    js: float = 0.3               # Jensen-Shannon distance, base 2
    hot_overlap: float = 0.5      # flagged below this share of the calibrated hot set
    hot_k: int | None = None      # hot-set size; None: a quarter of the experts (the top tier's bucket)

    def __post_init__(self):
        for name in ("drop_excess", "pad_excess", "js", "hot_overlap"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 <= v <= 1:
                raise NpuMoeError(f"drift limit {name}={v!r} must be a number in [0, 1]")
        if self.hot_k is not None and (isinstance(self.hot_k, bool) or not isinstance(self.hot_k, int)
                                       or self.hot_k < 1):
            raise NpuMoeError(f"drift limit hot_k={self.hot_k!r} must be an integer >= 1 (or None)")


def as_limits(limits) -> DriftLimits:
    if limits is None:
        return DriftLimits()
    if isinstance(limits, DriftLimits):
        return limits
    if isinstance(limits, dict):
        unknown = sorted(set(limits) - set(DriftLimits.__dataclass_fields__))
        if unknown:
            raise NpuMoeError(f"unknown drift limit(s) {unknown}; valid: {', '.join(DriftLimits.__dataclass_fields__)}")
        return DriftLimits(**limits)
    raise NpuMoeError(f"limits must be a DriftLimits or a dict, got {type(limits).__name__}")
