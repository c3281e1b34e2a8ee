"""Per-op timeline of one prefill: events, critical-path scheduling on an NPU and a CPU queue, energy.

Each Event is one op on one role ("npu" or "cpu") with a duration that is either measured (timed for real on this
host) or modeled (DeviceModel.estimate on a platform without hardware here). `schedule` places events: each role is
a serial queue in submission order, an event starts when its queue is free and all its deps have ended, so NPU and
CPU work overlap wherever dependencies allow. On a platform whose NPU role runs on the CPU (npu_shares_cpu) both
roles share one queue. `summarize` turns a scheduled timeline into the result-row metrics.
"""
from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass

import pandas as pd

from npumoe_lab.errors import NpuMoeError
from npumoe_lab.devices.graph_cost import npu_energy_j

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

    @classmethod
    def trusted(cls, name, chunk, layer, device, duration_s, flops, nbytes, timing_source, deps, calls) -> "Event":
        """An Event from fields checked upstream (an ops.Op with its validated OpCost, a clock's own duration):
        the engine's hot path, millions per paper-scale sweep, skips the per-field checks of __init__."""
        if not (duration_s >= 0 and duration_s < math.inf) or device not in DEVICES:
            raise NpuMoeError(f"event {name!r}: duration {duration_s!r} on {device!r} is not a valid timing")
        ev = object.__new__(cls)
        ev.__dict__.update(name=name, chunk=chunk, layer=layer, device=device, duration_s=duration_s, flops=flops,
                           bytes=nbytes, timing_source=timing_source, deps=deps, calls=calls, start_s=None,
                           cpu_s=None)
        return ev

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
    ends: list[float] = []                    # end time of each placed event (a paper-scale run has millions)
    for i, ev in enumerate(events):
        placed = object.__new__(Event)           # a copy with its start time: the fields were validated already
        fields_ = placed.__dict__
        fields_.update(ev.__dict__)
        queue = "cpu" if npu_shares_cpu else fields_["device"]
        start = free[queue]
        for d in fields_["deps"]:
            if not 0 <= d < i:
                raise NpuMoeError(f"event {i} ({ev.name!r}) depends on {[d for d in ev.deps if not 0 <= d < i]}, "
                                  "which are not earlier events; submit events after everything they depend on")
            if ends[d] > start:
                start = ends[d]
        fields_["start_s"] = start
        out.append(placed)
        free[queue] = end = start + fields_["duration_s"]
        ends.append(end)
    return out


def combined_source(sources) -> str:
    s = set(sources)
    return s.pop() if len(s) == 1 else ("mixed" if s else "none")


# Provenance labels of summarize's metrics (timing_source, energy_source, cycles_source): a metric built from a
# measurement and a model parameter names both; several kinds in one run give "mixed".
MEASURED, MODELED, MIXED = "measured", "modeled", "mixed"
TIME_X_POWER = "measured-time x modeled-power"               # measured busy seconds x platform watts per core
CPU_TIME_X_CLOCK = "measured-cpu-time x modeled-clock"       # process CPU seconds (all threads) x freq_hz
TIME_X_THREADS_X_CLOCK = "measured-time x threads x modeled-clock"  # wall seconds x torch threads x freq_hz


# Result-row schema version and what `cpu_cycles` means in it (recorded in every summarized row, and in README):
# version 2 = cycles are host core-seconds x cpu.freq_hz (cores x busy time, NPU dispatch + sync included); version 1
# rows (no column) counted busy seconds x clock on one core.
ROW_SCHEMA_VERSION = 2
CYCLES_DEFINITION = "core-seconds x cpu.freq_hz (cores x busy s; NPU dispatch+sync included)"


def cpu_work(event: Event, platform, threads: int | None = None) -> tuple[float, str | None]:
    """(core-seconds, source) of the host CPU's part of one event: the ONE definition behind cpu_cycles (x clock)
    and CPU energy (x watts per core).

    core-seconds = cores used x busy seconds, where
    - a CPU-side event (the cpu role, or any role where the NPU runs on the CPU: npu_shares_cpu) keeps its cores busy
      for its whole duration: measured -> its process CPU seconds when recorded (cpu_s, every thread), else
      wall time x `threads` (the run's torch thread count); modeled -> duration x the role's cores (cpu.cores; on a
      shared platform the NPU role's host_cores);
    - an NPU call on a separate NPU costs the host its dispatch + sync: calls x npu.host_cores x (dispatch_s+sync_s),
      a modeled number whatever the event's timing source.
    Source None: the event uses no CPU.
    """
    shared = platform.npu_shares_cpu
    if event.device == "npu" and not shared:
        core_s = event.calls * platform.npu.host_call_s
        return core_s, (MODELED if core_s > 0 else None)
    if event.timing_source == "measured":
        if event.cpu_s is not None:
            return event.cpu_s, CPU_TIME_X_CLOCK
        if threads is None:
            raise NpuMoeError(f"event {event.name!r} was measured without CPU time: pass threads= (the run's "
                              f"torch thread count) to count its cores")
        return threads * event.duration_s, TIME_X_THREADS_X_CLOCK
    cores = platform.cpu.cores if event.device == "cpu" else platform.npu.host_cores
    if not cores:
        raise NpuMoeError(f"platform {platform.name!r}: the {event.device} role states no core count (cpu.cores / "
                          f"npu.host_cores); add it to the platform file")
    return cores * event.duration_s, MODELED


def _watts_per_core(platform) -> float:
    cpu = platform.cpu
    if not cpu.cores:
        raise NpuMoeError(f"platform {platform.name!r}: cpu.cores is missing; the CPU's energy is per core")
    return cpu.active_power_w / cpu.cores


def summarize(events, platform, n_tokens: int, measured_energy_j: float | None = None,
              threads: int | None = None) -> dict:
    """Result-row metrics of a timeline on `platform` (schedules it first if start times are missing).

    ttft_s = end of the critical path (the last event end); busy = summed durations per role.
    CPU accounting (cpu_work): cpu_core_s = sum of every event's host core-seconds, including NPU dispatch + sync;
    cpu_cycles = cpu_core_s x cpu.freq_hz. energy_j = NPU: active_power x busy + idle_power x (ttft - busy) (none on
    a shared platform: there the NPU role is CPU cores), plus CPU: watts per core x cpu_core_s + idle_power x
    (ttft - CPU-side busy); or measured_energy_j (RAPL) when given. `threads`: the run's torch thread count for
    measured events (None: torch's current count, which is the run's when called right after it).
    Each metric names its source: timing_source, energy_source, cycles_source (labels above).
    """
    if isinstance(n_tokens, bool) or not isinstance(n_tokens, int) or n_tokens < 1:
        raise NpuMoeError(f"n_tokens must be a positive integer (prompt tokens prefilled), got {n_tokens!r}")
    if threads is not None and (isinstance(threads, bool) or not isinstance(threads, int) or threads < 1):
        raise NpuMoeError(f"threads must be a positive integer (the run's torch thread count), got {threads!r}")
    events = list(events)
    if any(e.start_s is None for e in events):
        events = schedule(events, platform.npu_shares_cpu)
    if threads is None and any(e.timing_source == "measured" and e.cpu_s is None for e in events):
        import torch
        threads = torch.get_num_threads()
    ttft = max((e.end_s for e in events), default=0.0)
    busy = {d: sum(e.duration_s for e in events if e.device == d) for d in DEVICES}
    work = [cpu_work(e, platform, threads) for e in events]
    core_s = sum(w for w, _ in work)
    shared = platform.npu_shares_cpu
    host_busy = busy["cpu"] + (busy["npu"] if shared else 0.0)
    if measured_energy_j is not None:
        energy, energy_source = float(measured_energy_j), MEASURED
        energy_note = "RAPL package energy over the run"
    else:
        npu = platform.npu
        # the fit's power model per event (floor + (active - floor) x utilisation: graph_cost.npu_energy_j)
        npu_j = 0.0 if shared else sum(npu_energy_j(npu, e.flops, e.duration_s) for e in events if e.device == "npu") \
            + npu.idle_power_w * max(ttft - busy["npu"], 0)
        cpu_j = _watts_per_core(platform) * core_s + platform.cpu.idle_power_w * max(ttft - host_busy, 0.0)
        energy = npu_j + cpu_j
        energy_source = combined_source(MODELED if e.timing_source == "modeled" else TIME_X_POWER for e in events)
        energy_note = (f"power parameters of platform {platform.name} ({platform.hash[:12]}) x busy/idle time; "
                       f"CPU: watts per core x core-seconds")
    out = {
        "ttft_s": ttft,
        "cpu_busy_s": busy["cpu"],
        "npu_busy_s": busy["npu"],
        "cpu_core_s": core_s,
        "cpu_cycles": core_s * platform.cpu.freq_hz,
        "cpu_threads": threads,
        "n_npu_calls": sum(e.calls for e in events if e.device == "npu"),
        "energy_j": energy,
        "energy_per_token_mj": energy / n_tokens * 1e3,
        "timing_source": combined_source(e.timing_source for e in events),
        "energy_source": energy_source,
        "energy_note": energy_note,
        "cycles_source": combined_source(src for _, src in work if src is not None),
        "schema_version": ROW_SCHEMA_VERSION,
        "cycles_definition": CYCLES_DEFINITION,
        "platform_profile": platform.name,
        "platform_hash": platform.hash,
    }
    for d in DEVICES:
        out[f"timing_source_{d}"] = combined_source(e.timing_source for e in events if e.device == d)
    return out


def to_frame(events, ops=None) -> pd.DataFrame:
    """One row per event (the per-op timeline file), with end_s and deps as a space-separated string. `ops`: the
    clock's (Op, deps, wall) records of the same events (PrefillResult.ops), which add each op's `kind`, `shape`
    and `gemm` (JSON lists): what a fitted model needs to re-price a measured run op by op (validate-device --runs)."""
    rows = []
    ops = list(ops) if ops is not None else None
    if ops is not None and len(ops) != len(events):
        raise NpuMoeError(f"to_frame got {len(events)} events but {len(ops)} op records; pass the ops of the same run")
    for i, e in enumerate(events):
        row = asdict(e)
        row["deps"] = " ".join(map(str, e.deps))
        row["end_s"] = None if e.start_s is None else e.end_s
        if ops is not None:
            op = ops[i][0]
            row.update(kind=op.kind, shape=json.dumps([int(x) for x in op.shape]),
                       gemm=json.dumps(None if op.cost.gemm is None else [int(x) for x in op.cost.gemm]))
        rows.append({"event": i, **row})
    cols = ["event", "name", "chunk", "layer", "device", "start_s", "end_s", "duration_s", "flops", "bytes",
            "calls", "timing_source", "cpu_s", "deps"] + (["kind", "shape", "gemm"] if ops is not None else [])
    return pd.DataFrame(rows, columns=cols)
