"""The paper grid simulated (issue 14): 3 geometries x 2 platforms x 9 variants x prompts 1024/4096 x chunks
256/512/1024 = 324 rows through `npumoe_lab.simulate` (routing replayed on the engine, no weights, times modeled).
Prints the wall time, rows per second and the CPU it ran on (model, flags, threads); the target is <= 60 s on
2 cores. `--repeats N` runs the grid N times and reports the median (this machine is shared and noisy)."""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from npumoe_lab.sim.report import paper_scale_markdown  # noqa: E402  (after the path insert)
from npumoe_lab.sim.run import simulate  # noqa: E402
from npumoe_lab.utils import host_description  # noqa: E402

GRID = dict(geometry="qwen3-30b-a3b,phi-3.5-moe,phi-tiny-moe", platforms="m2-max,m2-ultra", variants="all",
            prompt_len="1024,4096", chunk="256,512,1024")


def cpu_flags() -> str:
    flags = set()
    for line in Path("/proc/cpuinfo").read_text().splitlines() if Path("/proc/cpuinfo").exists() else []:
        if line.startswith("flags"):
            flags = set(line.split(":", 1)[1].split())
            break
    wanted = ("avx2", "avx512f", "avx512_bf16", "avx512_fp16", "amx_tile", "amx_bf16")
    return " ".join(f for f in wanted if f in flags) or "unknown"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--routing", default="synthetic:gini=0.6")
    ap.add_argument("--out", default=None, help="write the rows of the last repeat here")
    a = ap.parse_args(argv)
    times, cpu, df = [], [], None
    load0 = os.getloadavg()[0]
    for r in range(a.repeats):
        t0, c0 = time.perf_counter(), time.process_time()
        df = simulate(routing=a.routing, out=a.out if r == a.repeats - 1 else None, **GRID)
        times.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
    med, med_cpu = statistics.median(times), statistics.median(cpu)
    print(f"# host: {host_description()}; CPU flags: {cpu_flags()}; torch threads during the simulation: 1")
    print(f"paper grid: {len(df)} rows in {med:.1f} s wall (median of {a.repeats}: "
          f"{', '.join(f'{t:.1f}' for t in times)} s), {len(df) / med:.1f} rows/s; process CPU time {med_cpu:.1f} s "
          f"(what a quiet core would take); load average {load0:.1f} -> {os.getloadavg()[0]:.1f} on "
          f"{os.cpu_count()} cores; target <= 60 s")
    print(paper_scale_markdown(df))
    return 0


if __name__ == "__main__":
    torch.set_num_threads(2)
    sys.exit(main())
