"""How busy the host was while a measured run took its timings.

A measured wall time means little when other work shares the cores (on this project's 2-core VMs a busy host
turned 0.14 s into 3.4 s and flipped the variant ordering). `HostLoad` samples the kernel's counters around each
measured call: the CPU time every process on the host used (psutil.cpu_times, i.e. /proc/stat) minus this
process's own (psutil.Process.cpu_times, children included), the hypervisor's steal time, and the 1-minute
load average. Only the accumulated seconds of the measured calls count, so the untimed work in between (scoring,
plan building) does not dilute or inflate the reading.

Those counters tick at USER_HZ (10 ms). Summed over calls of ~0.1 ms (a micro-benchmark's op), a single tick landing
in a block reads as "others used 3.6 cores" on a quiet 2-core host (the 2026-12-02 baseline flagged 142 of 1133
measure rows so, 17 of 27 group rows). So the reading is taken over the measured calls only when they add up to at
least MIN_RESOLVED_S; shorter, over the whole span from the first call to the last (own CPU time subtracted, as
always), and when even the span is shorter, over the span extended by a wait to MIN_RESOLVED_S (at most 0.2 s,
once per HostLoad): the host's load around the calls, the closest reading the ticks can resolve.
"""
from __future__ import annotations

import os
import warnings

import numpy as np

from npumoe_lab.devices.hostspeed import probe_s
from npumoe_lab.errors import NpuMoeWarning

# Limits of a quiet host. Others' CPU: more than a quarter of a core on average during the measured calls is
# enough to move a 2-thread timing by tens of percent. Steal: 2 % of the wall time (was 5 % until 2026-12-04: on the
# quiet host's development draw of the CPU loop the two runs with steal 4.2 % and 4.5 % were ~30 % slower than runs
# of the same work at <= 1.1 %, every op kind alike, as a neighbouring VM sharing the socket makes them). IQR: the
# spread of the repeats, relative to their median.
OTHER_CORES_LIMIT = 0.25
STEAL_LIMIT = 0.02
IQR_LIMIT = 0.25
# 20 ticks of /proc/stat: a reading is off by up to ~2 ticks per core, i.e. +-0.1 cores here, under half the limit
MIN_RESOLVED_S = 0.2


class HostBusyWarning(NpuMoeWarning):
    """Measured timings were taken on a host that was not quiet (see the rows' host_* columns)."""


def _busy_s(t) -> float:
    # psutil's Linux fields: idle and iowait are not busy; guest time is already inside user
    return sum(getattr(t, f, 0.0) for f in ("user", "nice", "system", "irq", "softirq", "steal"))


class HostLoad:
    """Accumulates others' CPU seconds, steal and wall time over `with load.measuring():` blocks."""

    def __init__(self):
        import psutil
        self._psutil = psutil
        self._me = psutil.Process()
        self.wall_s = self.other_cpu_s = self.steal_s = 0.0
        self._first = self._last = None          # snapshots at the first call's start and the last call's end
        self._window = None                      # the reading over the extended span, once taken
        self.load1 = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
        self.n_cpus = psutil.cpu_count() or 1
        self.probes: list[float] = []            # hostspeed.probe_s before each repeat (untimed, outside blocks)
        self.anchors: list[float] = []           # the speed anchor's readings (experiments/speed_anchor.py)

    def probe(self, anchor=None) -> float:
        """Time the host speed probe (hostspeed.py) now, between measured blocks, and keep it; `anchor`: a timer
        of the speed anchor, read right after it and kept too. Returns the probe."""
        self.probes.append(probe_s())
        if anchor is not None:
            self.anchors.append(anchor())
        return self.probes[-1]

    def _snapshot(self):
        import time
        sysc = self._psutil.cpu_times()
        own = self._me.cpu_times()
        own_s = own.user + own.system + own.children_user + own.children_system
        return time.perf_counter(), _busy_s(sysc), getattr(sysc, "steal", 0.0), own_s

    def measuring(self):
        load = self

        class _Block:
            def __enter__(self):
                self.start = load._snapshot()
                if load._first is None:
                    load._first = self.start

            def __exit__(self, *exc):
                end = load._last = load._snapshot()
                load._window = None
                wall, busy, steal, own = (b - a for a, b in zip(self.start, end))
                load.wall_s += wall
                load.other_cpu_s += max(busy - steal - own, 0.0)
                load.steal_s += steal
                return False
        return _Block()

    def _reading(self) -> tuple[float, float]:
        """(others' cores, steal share) over the measured calls, or over their whole span when the calls are too
        short for the counters' ticks (module doc); NaN when neither is long enough."""
        if self.wall_s >= MIN_RESOLVED_S:
            return self.other_cpu_s / self.wall_s, self.steal_s / (self.wall_s * self.n_cpus)
        if self._first is None:
            return float("nan"), float("nan")
        end = self._last
        if end[0] - self._first[0] < MIN_RESOLVED_S:
            if self._window is None:
                import time
                time.sleep(max(MIN_RESOLVED_S - (end[0] - self._first[0]), 0.0))
                self._window = self._snapshot()
            end = self._window
        wall, busy, steal, own = (b - a for a, b in zip(self._first, end))
        return max(busy - steal - own, 0.0) / wall, steal / (wall * self.n_cpus)

    def columns(self, times) -> dict:
        """Row columns: host load during the measured calls, the repeats' median/IQR, the busy flag and why."""
        other, steal = self._reading()
        t = np.asarray([x for x in times if x is not None and np.isfinite(x)], dtype=float)
        med = float(np.median(t)) if t.size else float("nan")
        iqr = float(np.subtract(*np.percentile(t, [75, 25]))) if t.size else float("nan")
        reasons = []
        if other > OTHER_CORES_LIMIT:
            reasons.append(f"other processes used {other:.2f} cores")
        if steal > STEAL_LIMIT:
            reasons.append(f"steal {steal:.0%}")
        if t.size >= 3 and med > 0 and iqr / med > IQR_LIMIT:
            reasons.append(f"TTFT IQR {iqr / med:.0%} of the median")
        probe = float(np.median(self.probes)) if self.probes else float("nan")
        anchor = float(np.median(self.anchors)) if self.anchors else float("nan")
        return dict(host_load1=self.load1, host_other_cores=other, host_steal_frac=steal, host_probe_s=probe,
                    host_anchor_s=anchor,
                    ttft_median_s=med, ttft_iqr_s=iqr, n_repeats=int(t.size),
                    host_busy=bool(reasons), host_busy_reason="; ".join(reasons))


def others_cores(window_s: float = 0.5) -> tuple[float, int]:
    """(cores other processes used over the next `window_s`, this host's logical CPUs): a probe before a measured
    run, the same counters as `HostLoad` (own CPU time subtracted, steal apart)."""
    import time
    load = HostLoad()
    with load.measuring():
        time.sleep(window_s)
    return load.other_cpu_s / max(load.wall_s, 1e-9), load.n_cpus


def uncontended_threads(others: float, n_cpus: int, wanted: int) -> int:
    """Threads that do not oversubscribe the cores others use: `wanted` minus the cores others hold (rounded up
    past OTHER_CORES_LIMIT of a core), at least 1."""
    import math
    held = math.ceil(others - OTHER_CORES_LIMIT) if others > OTHER_CORES_LIMIT else 0
    return max(1, min(wanted, n_cpus - held))


def warn_if_busy(rows) -> bool:
    """One warning for a whole run naming the busy configurations; True when it warned."""
    busy = [r for r in rows if r.get("host_busy")]
    if not busy:
        return False
    cells = sorted({f"{r['variant']}@{r['platform']}: {r['host_busy_reason']}" for r in busy})
    shown = "; ".join(cells[:4]) + (f"; ... ({len(cells) - 4} more)" if len(cells) > 4 else "")
    warnings.warn(f"measured timings taken on a busy host ({shown}); rows are flagged host_busy=True. Re-run on a "
                  "quiet machine, with --threads 1 (fewer threads than the cores others use: torch's threads "
                  "otherwise wait on each other), or with more --repeats before trusting them.", HostBusyWarning, stacklevel=4)
    return True
