"""Clocks: what turns the engine's operation records (ops.Op) into timeline Events.

`Clock` is the protocol the engine and the prefill drivers speak: `run(op, fn, *args)` runs `fn` (when given) and
records the op; `record(op, wall)` records an op timed elsewhere (forward hooks); `layer_stats` keeps the drop/pad
counts. `TimelineClock` puts each op on the platform's timeline: measured wall time on a measured platform, the
cost model's estimate of the op's FLOPs/bytes/calls on a modeled one (never both for one number). `NullClock` runs
ops untimed (a plain forward of an attached model).
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Protocol

from npumoe_lab.execution.ops import Op
from npumoe_lab.execution.timeline import Event


class Clock(Protocol):
    measured: bool

    def run(self, op: Op, fn, *args, deps=None): ...          # -> (fn's result or None, event index or None)

    def record(self, op: Op, wall: float, deps=None): ...     # -> event index or None

    def layer_stats(self, chunk: int, layer: int, stats) -> None: ...


class NullClock:
    """Runs ops without timing them."""
    measured = False

    def run(self, op, fn, *args, deps=None):
        return (fn(*args) if fn is not None else None), None

    def record(self, op, wall, deps=None):
        return None

    def layer_stats(self, chunk, layer, stats):
        pass


@dataclass
class TimelineClock:
    """Events of one prefill on `platform`; `measured`: wall time of each op, else the platform's cost model."""
    platform: object
    measured: bool
    events: list = field(default_factory=list)
    stats: list = field(default_factory=list)    # (chunk, layer, LayerStats)
    ops: list = field(default_factory=list)      # (Op, deps, wall) as recorded: the timeline before pricing
    _priced: dict = field(default_factory=dict, repr=False)   # (role, OpCost) -> modeled seconds (pure, so memoised)

    @property
    def source(self) -> str:
        return "measured" if self.measured else "modeled"

    def run(self, op: Op, fn, *args, deps=None):
        t0 = time.perf_counter()
        result = fn(*args) if fn is not None else None
        return result, self.record(op, time.perf_counter() - t0, deps)

    def record(self, op: Op, wall: float, deps=None):
        """`deps=None`: after the previous event (program order); else the given event indices."""
        if deps is None:
            deps = (len(self.events) - 1,) if self.events else ()
        elif None in deps:                   # an untimed dependency (NullClock upstream) imposes no order
            deps = tuple(d for d in deps if d is not None)
        self.ops.append((op, deps, wall))
        if self.measured:
            seconds = wall
        else:    # static shapes repeat across layers and chunks: each distinct cost is priced once
            key = (op.role, op.cost)
            seconds = self._priced.get(key)
            if seconds is None:
                seconds = self._priced[key] = self.platform.device(op.role).estimate(op.cost)
        self.events.append(Event.trusted(op.name, op.chunk, op.layer, op.role, float(seconds), op.cost.flops,
                                         op.cost.bytes, self.source, deps, op.cost.calls))
        return len(self.events) - 1

    def layer_stats(self, chunk, layer, stats):
        self.stats.append((chunk, layer, stats))

    def repriced(self, platform) -> "TimelineClock":
        """The same ops on another modeled platform (a simulation prices one op stream on several platforms)."""
        other = TimelineClock(platform, measured=self.measured, stats=self.stats)
        for op, deps, wall in self.ops:
            other.record(op, wall, deps)
        return other


__all__ = ["Clock", "NullClock", "TimelineClock"]
