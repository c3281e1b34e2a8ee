"""Per-op timeline of one prefill: events, critical-path scheduling on an NPU and a CPU queue, energy.

Each Event is one op on one role ("npu" or "cpu") with a duration that is either measured (timed for real on this
host) or modeled (DeviceModel.estimate on a platform without hardware here). `schedule` places events: each role is
a serial queue in submission order, an event starts when its queue is free and all its deps have ended, so NPU and
CPU work overlap wherever dependencies allow. On a platform whose NPU role runs on the CPU (npu_shares_cpu) both
roles share one queue. `summarize` turns a scheduled timeline into the result-row metrics.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import pandas as pd

from .errors import NpuMoeError

DEVICES = ("npu", "cpu")
TIMING_SOURCES = ("measured", "modeled")


@dataclass(frozen=True)
class Event:
    name: str
    chunk: int
    layer: int                     # -1 for ops outside the layer stack (embedding, lm head)
    device: str                    # "npu" | "cpu"
    duration_s: float
    flops: float
    bytes: float
    timing_source: str             # "measured" | "modeled"
    deps: tuple[int, ...] = ()     # indices of earlier events in the same list
    calls: int = 1                 # device dispatches (NPU graph calls) in this event
    start_s: float | None = None   # set by schedule()
    cpu_s: float | None = None     # measured process CPU seconds (host runs); None when modeled

    def __post_init__(self):
        if self.device not in DEVICES:
            raise NpuMoeError(f"event {self.name!r}: device {self.device!r} is unknown; use one of {DEVICES}")
        if self.timing_source not in TIMING_SOURCES:
            raise NpuMoeError(f"event {self.name!r}: timing_source {self.timing_source!r} is unknown; "
                              f"use one of {TIMING_SOURCES}")
        for f in ("duration_s", "flops", "bytes"):
            v = getattr(self, f)
            if type(v) is float and 0 <= v < math.inf:     # the common case, checked cheaply (millions per sweep)
                continue
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
                raise NpuMoeError(f"event {self.name!r}: {f} must be a finite number >= 0, got {v!r}")
        if type(self.calls) is not int and (isinstance(self.calls, bool) or not isinstance(self.calls, int)) \
                or self.calls < 0:
            raise NpuMoeError(f"event {self.name!r}: calls must be an integer >= 0, got {self.calls!r}")
        if type(self.deps) is not tuple:          # schedule() checks that each dep is an earlier event
            object.__setattr__(self, "deps", tuple(int(d) for d in self.deps))

    @property
    def end_s(self) -> float:
        if self.start_s is None:
            raise NpuMoeError(f"event {self.name!r} has no start time; run timeline.schedule(events) first")
        return self.start_s + self.duration_s


def modeled_event(device_model, op, chunk: int, layer: int, deps=()) -> Event:
    """An Event whose duration is `device_model.estimate(op)` (a platform role from devices.get_platform)."""
    return Event(op.name, chunk, layer, device_model.role, device_model.estimate(op), op.flops, op.bytes,
                 "modeled", tuple(deps), op.calls)


def measured_event(name: str, device: str, measurement, chunk: int, layer: int, flops: float = 0.0,
                   nbytes: float = 0.0, deps=(), calls: int = 1) -> Event:
    """An Event timed on this host (a devices.measured.Measurement)."""
    return Event(name, chunk, layer, device, measurement.wall_s, flops, nbytes, "measured", tuple(deps), calls,
                 cpu_s=measurement.cpu_s)


def schedule(events, npu_shares_cpu: bool = False) -> list[Event]:
    """Start times: each event starts at max(its queue free, its deps' ends). Returns new Events."""
    events = list(events)
    free = {"npu": 0.0, "cpu": 0.0}
    out: list[Event] = []
    for i, ev in enumerate(events):
        queue = "cpu" if npu_shares_cpu else ev.device
        start = free[queue]
        for d in ev.deps:
            if not 0 <= d < i:
                raise NpuMoeError(f"event {i} ({ev.name!r}) depends on {[d for d in ev.deps if not 0 <= d < i]}, which are not earlier "
                                  "events; submit events after everything they depend on")
            end = out[d].start_s + out[d].duration_s
            if end > start:
                start = end
        placed = object.__new__(Event)           # a copy with its start time: the fields were validated already
        placed.__dict__.update(ev.__dict__)
        object.__setattr__(placed, "start_s", start)
        out.append(placed)
        free[queue] = start + ev.duration_s
    return out


def combined_source(sources) -> str:
    s = set(sources)
    return s.pop() if len(s) == 1 else ("mixed" if s else "none")


def summarize(events, platform, n_tokens: int, measured_energy_j: float | None = None) -> dict:
    """Result-row metrics of a timeline on `platform` (schedules it first if start times are missing).

    ttft_s = end of the critical path (the last event end); busy = summed durations per role;
    energy_j = sum over roles of active_power*busy + idle_power*(ttft - busy), unless measured_energy_j (RAPL) is
    given. cpu_cycles = CPU-role busy x freq, plus NPU-role busy where that role runs on the CPU (host); measured
    events contribute their process CPU seconds x freq instead (counts every thread torch used).
    """
    if isinstance(n_tokens, bool) or not isinstance(n_tokens, int) or n_tokens < 1:
        raise NpuMoeError(f"n_tokens must be a positive integer (prompt tokens prefilled), got {n_tokens!r}")
    events = list(events)
    if any(e.start_s is None for e in events):
        events = schedule(events, platform.npu_shares_cpu)
    ttft = max((e.end_s for e in events), default=0.0)
    busy = {d: sum(e.duration_s for e in events if e.device == d) for d in DEVICES}
    if measured_energy_j is not None:
        energy, energy_source = float(measured_energy_j), "measured"
        energy_note = "RAPL package energy over the run"
    else:
        energy = sum(m.active_power_w * busy[d] + m.idle_power_w * max(ttft - busy[d], 0.0)
                     for d, m in (("npu", platform.npu), ("cpu", platform.cpu)))
        energy_source = "modeled"
        energy_note = f"power parameters of platform {platform.name} ({platform.hash[:12]}) x busy/idle time"
    on_cpu = [e for e in events if e.device == "cpu" or platform.npu_shares_cpu]
    cpu_seconds = sum(e.cpu_s if e.cpu_s is not None else e.duration_s for e in on_cpu)
    out = {
        "ttft_s": ttft,
        "cpu_busy_s": busy["cpu"],
        "npu_busy_s": busy["npu"],
        "cpu_cycles": cpu_seconds * platform.cpu.freq_hz,
        "n_npu_calls": sum(e.calls for e in events if e.device == "npu"),
        "energy_j": energy,
        "energy_per_token_mj": energy / n_tokens * 1e3,
        "timing_source": combined_source(e.timing_source for e in events),
        "energy_source": energy_source,
        "energy_note": energy_note,
        "platform_profile": platform.name,
        "platform_hash": platform.hash,
    }
    for d in DEVICES:
        out[f"timing_source_{d}"] = combined_source(e.timing_source for e in events if e.device == d)
    return out


def to_frame(events) -> pd.DataFrame:
    """One row per event (the per-op timeline file), with end_s and deps as a space-separated string."""
    rows = []
    for i, e in enumerate(events):
        row = asdict(e)
        row["deps"] = " ".join(map(str, e.deps))
        row["end_s"] = None if e.start_s is None else e.end_s
        rows.append({"event": i, **row})
    cols = ["event", "name", "chunk", "layer", "device", "start_s", "end_s", "duration_s", "flops", "bytes",
            "calls", "timing_source", "cpu_s", "deps"]
    return pd.DataFrame(rows, columns=cols)
