"""The paper grid simulated: 3 geometries x 2 platforms x 9 variants x prompts 1024/4096 x chunks
256/512/1024 = 324 rows through `npumoe_lab.simulate` (routing sampled, op streams as arrays, no weights, times
modeled; each row with 8 greedy decode steps, `--decode-tokens`, and their cost beside prefill-only rows, target
<= 1.2x). Prints the wall time and the process CPU time (the host is shared: CPU time is what a quiet core takes),
rows per second and the CPU it ran on (model, flags). Targets: one draw <= 10 s on 2 cores; 200 parameter draws
(the 90 % intervals) <= 60 s. `--repeats N` runs each N times and reports the median; `--engine ops` times the
per-op reference path instead. `--platforms` replaces the grid's two platforms (names, platform YAMLs, overrides),
e.g. the fitted graph-level ones: --platforms data/fits/m2-max-fit.yaml,data/fits/m2-ultra-fit.yaml. Beside the
in-process grid, the same grid through the command line (`python -m npumoe_lab simulate <GRID's flags> --out DIR`,
with --draws 0 and the CLI's default 200) as a subprocess, `--cli-repeats` times each (median; wall and the child's
CPU time, imports and writing included; 0: skip). Each command line runs with its routing draws' and plans'
caches (sim/draw_cache.py, sim/plan_cache.py) cold (empty: every draw sampled, every plan built, then written) and
warm (filled by an untimed run: read back), both printed; the in-process grid samples every draw and builds every
plan. Then the 12,800-plan sweep
(`python -m npumoe_lab sweep sweeps/simulate_10k.yaml --workers 2 --out DIR`, a fresh folder: every cell runs) the
same way, cold then warm, wall and CPU (target <= 60 s; `--no-sweep`: skip it, ~2 x 3-7 min on 2 cores)."""
from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from npumoe_lab.core.cpu_features import cpu_model  # noqa: E402  (after the path insert)
from npumoe_lab.sim.report import paper_scale_markdown  # noqa: E402
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


def cpu_line() -> str:
    return f"# host: {host_description()}; CPU: {cpu_model()}; flags: {cpu_flags()}; no torch in the simulation"


def cli_args(routing: str, draws: int, out, platforms: str = GRID["platforms"], workers: int | None = None
             ) -> list[str]:
    """The simulate command line of the grid (GRID's values as its flags; `workers` None: the CLI's default)."""
    flags = {"--geometry": GRID["geometry"], "--platforms": platforms, "--variants": GRID["variants"],
             "--prompt-len": GRID["prompt_len"], "--chunk": GRID["chunk"], "--routing": routing,
             "--draws": str(draws), "--out": str(out), **({"--workers": str(workers)} if workers else {})}
    return [sys.executable, "-m", "npumoe_lab", "simulate"] + [x for kv in flags.items() for x in kv]


def _cache_env(folder, extra: dict | None = None) -> dict:
    """The environment of a child run: this checkout first on the path, the draw and plan caches on, in `folder`
    (switched on explicitly: the in-process grid, timed first, switches them off in this process's environment,
    which a child inherited until 2026-12-04: the "warm" command lines timed before then ran with the draw cache
    off, so they were cold; docs/PERFORMANCE.md says so)."""
    return {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""),
            "NPUMOE_NO_PROGRESS": "1", "NPUMOE_CACHE_DIR": str(folder), "NPUMOE_DRAW_CACHE": "on",
            "NPUMOE_PLAN_CACHE": "on", **(extra or {})}


def timed_cli(routing: str, draws: int, repeats: int, platforms: str = GRID["platforms"],
              workers: int | None = None, cache: str = "cold", extra_env: dict | None = None):
    """(median wall s, median child CPU s (user + sys), walls): the grid's simulate command run `repeats` times,
    each in a fresh process (imports, simulation, printing and writing the rows all counted). `cache` "cold": each
    run with empty draw and plan caches (every routing draw sampled, every plan built, then written); "warm": all
    runs on caches filled by an untimed run first (read back)."""
    walls, cpus = [], []
    with tempfile.TemporaryDirectory() as kept:
        if cache == "warm":
            with tempfile.TemporaryDirectory() as out:
                subprocess.run(cli_args(routing, draws, Path(out) / "rows", platforms, workers), cwd=ROOT,
                               env=_cache_env(kept, extra_env), capture_output=True, text=True, check=True)
        for _ in range(repeats):
            with tempfile.TemporaryDirectory() as out, tempfile.TemporaryDirectory() as empty:
                before = resource.getrusage(resource.RUSAGE_CHILDREN)
                t0 = time.perf_counter()
                done = subprocess.run(cli_args(routing, draws, Path(out) / "rows", platforms, workers), cwd=ROOT,
                                      env=_cache_env(kept if cache == "warm" else empty, extra_env),
                                      capture_output=True, text=True)
                walls.append(time.perf_counter() - t0)
                after = resource.getrusage(resource.RUSAGE_CHILDREN)
            if done.returncode != 0:
                raise SystemExit(f"the simulate command failed (exit {done.returncode}): "
                                 f"{done.stderr.strip()[-500:]}")
            cpus.append(after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime)
    return statistics.median(walls), statistics.median(cpus), walls


def timed_sweep(spec: str, workers: int, cache_dir, extra_env: dict | None = None):
    """(wall s, child CPU s, cells): the sweep command run once into a fresh folder (every cell computed and
    written; imports, the pool's start-up and the rows' files included), its draw cache in `cache_dir` (empty:
    cold; filled by an earlier sweep: warm)."""
    with tempfile.TemporaryDirectory() as out:
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        t0 = time.perf_counter()
        done = subprocess.run([sys.executable, "-m", "npumoe_lab", "sweep", spec, "--out", out, "--workers",
                               str(workers)], cwd=ROOT, env=_cache_env(cache_dir, extra_env), capture_output=True,
                              text=True)
        wall = time.perf_counter() - t0
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cells = len(list(Path(out).glob("cells/*/DONE.json")))
    if done.returncode != 0:
        raise SystemExit(f"the sweep command failed (exit {done.returncode}): {done.stderr.strip()[-500:]}")
    return wall, after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime, cells


def cold() -> None:
    """Forget what a process keeps between simulations (routing sources with their calibration draws and
    profiles, plan parts, layouts and groups, FFN estimates, GEMM rate tables, template rows, point parameters):
    every timed run starts cold."""
    from npumoe_lab.planning import layout, makespan, plan
    from npumoe_lab.planning.residency import _ffn_seconds
    from npumoe_lab.sim import array_replay, stream
    from npumoe_lab.sim.run import _cached_source, _dropless
    for cache in (_cached_source, _dropless, _ffn_seconds, makespan._group_call_s, stream._layer_rows,
                  stream._pack_row):
        cache.cache_clear()
    os.environ["NPUMOE_DRAW_CACHE"] = os.environ["NPUMOE_PLAN_CACHE"] = "off"   # in process: every draw, plan (cold)
    for kept in (layout._LAYOUTS, layout._GROUPS, plan._CHECKED, makespan._RATES, array_replay._POINT):
        kept.clear()


def timed(fn, repeats: int):
    """(result of the last call, wall seconds, process CPU seconds), medians over the repeats, each run cold."""
    walls, cpus, out = [], [], None
    for _ in range(repeats):
        cold()
        t0, c0 = time.perf_counter(), time.process_time()
        out = fn()
        walls.append(time.perf_counter() - t0)
        cpus.append(time.process_time() - c0)
    return out, statistics.median(walls), statistics.median(cpus), walls


GC_MODES = {"relaxed": {"NPUMOE_RELAXED_GC": "on"}, "default": {"NPUMOE_RELAXED_GC": "off"}}


def gc_peer(a) -> None:
    """The relaxed cyclic GC (utils.relaxed_gc) against CPython's thresholds, side by side: the same commands
    alternated (the order flipped each round), each mode with its own caches: one cold sweep each, then
    `--gc-repeats` warm ones, and a warm command-line grid every round; medians of child CPU time."""
    cpu = {(what, mode): [] for what in ("cli warm", "sweep cold", "sweep warm") for mode in GC_MODES}
    with tempfile.TemporaryDirectory() as relaxed, tempfile.TemporaryDirectory() as default:
        kept = {"relaxed": relaxed, "default": default}
        for r in range(a.gc_repeats + 1):
            for mode, env in (list(GC_MODES.items())[::1 if r % 2 == 0 else -1]):
                cpu["cli warm", mode].append(timed_cli(a.routing, 0, 1, a.platforms, None, "warm", env)[1])
                if a.sweep:
                    cpu["sweep cold" if r == 0 else "sweep warm", mode].append(
                        timed_sweep("sweeps/simulate_10k.yaml", a.sweep_workers, kept[mode], env)[1])
    for what in ("cli warm", "sweep cold", "sweep warm"):
        got = {mode: cpu[what, mode] for mode in GC_MODES if cpu[what, mode]}
        if len(got) == 2:
            med = {m: statistics.median(v) for m, v in got.items()}
            print(f"cyclic GC relaxed vs CPython's thresholds, {what} ({len(got['relaxed'])} each, alternated): "
                  f"{med['relaxed']:.1f} s vs {med['default']:.1f} s child CPU (measured): CPython's take "
                  f"{med['default'] / med['relaxed']:.2f}x the relaxed CPU (runs: "
                  f"{', '.join(f'{t:.1f}' for t in got['relaxed'])} vs "
                  f"{', '.join(f'{t:.1f}' for t in got['default'])})")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--routing", default="synthetic:gini=0.6")
    ap.add_argument("--draws", type=int, default=200, help="parameter draws of the interval run (0: skip it)")
    ap.add_argument("--engine", default="array", choices=("array", "ops"))
    ap.add_argument("--out", default=None, help="write the rows of the last one-draw repeat here")
    ap.add_argument("--tables", action="store_true", help="also print the paper-scale tables")
    ap.add_argument("--platforms", "--platform", dest="platforms", default=GRID["platforms"],
                    help=f"comma list of platform specs (default {GRID['platforms']}; e.g. fitted YAMLs)")
    ap.add_argument("--cli-repeats", type=int, default=3,
                    help="runs of the grid's simulate command line per draw count (median; 0: skip)")
    ap.add_argument("--decode-tokens", type=int, default=8,
                    help="greedy decode steps of every row (default 8, the paper's; 0: prefill only)")
    ap.add_argument("--no-sweep", dest="sweep", action="store_false",
                    help="skip the 12,800-plan sweep (sweeps/simulate_10k.yaml) through the command line")
    ap.add_argument("--sweep-workers", type=int, default=2, help="--workers of the sweep command (default 2)")
    ap.add_argument("--decode-repeats", type=int, default=7,
                    help="interleaved runs of the grid at --decode-tokens and at 0 for their CPU-time ratio "
                         "(median; target <= 1.2x; 0: skip; 3 repeats spread about +-0.06 around it on a quiet "
                         "2-core VM, hence 7)")
    ap.add_argument("--gc-peer", action="store_true",
                    help="also time the command-line grid (warm) and the sweep (cold, warm) with the cyclic GC at "
                         "CPython's thresholds (NPUMOE_RELAXED_GC=off) beside the relaxed default, alternated")
    ap.add_argument("--gc-repeats", type=int, default=2, help="alternated runs of each --gc-peer pair (median)")
    a = ap.parse_args(argv)
    grid = {**GRID, "platforms": a.platforms, "decode_tokens": a.decode_tokens}
    load0 = os.getloadavg()[0]
    print(cpu_line())
    print(f"# platforms: {a.platforms}")
    df, wall, cpu, walls = timed(lambda: simulate(routing=a.routing, out=a.out, engine=a.engine, **grid), a.repeats)
    print(f"paper grid: {len(df)} rows in {wall:.1f} s wall, {cpu:.1f} s process CPU (median of {a.repeats}: "
          f"{', '.join(f'{t:.1f}' for t in walls)} s wall), {len(df) / wall:.1f} rows/s; engine {a.engine}; "
          f"load average {load0:.1f} -> {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores; target <= 10 s")
    if a.decode_repeats > 0 and a.decode_tokens:
        both = {0: [], a.decode_tokens: []}
        for _ in range(a.decode_repeats):          # side by side, interleaved: the shared host's load hits both
            for n in both:
                both[n].append(timed(lambda: simulate(routing=a.routing, engine=a.engine, **{**grid,
                                                      "decode_tokens": n}), 1)[2])
        cpu0, cpu_n = statistics.median(both[0]), statistics.median(both[a.decode_tokens])
        print(f"paper grid with --decode-tokens {a.decode_tokens} vs prefill only (0): {cpu_n:.1f} s vs {cpu0:.1f} s "
              f"process CPU (median of {a.decode_repeats}, interleaved) = {cpu_n / cpu0:.2f}x; target <= 1.2x")
    if a.draws:
        dd, wall_d, cpu_d, _ = timed(lambda: simulate(routing=a.routing, draws=a.draws, engine=a.engine, **grid),
                                     a.repeats)
        print(f"paper grid with {a.draws} parameter draws (90 % intervals, {dd.interval_source.iloc[0]}): "
              f"{len(dd)} rows in {wall_d:.1f} s wall, {cpu_d:.1f} s process CPU; target <= 60 s")
    for draws in ((0, 200) if a.cli_repeats > 0 else ()):
        for workers, cache in ((None, "cold"), (None, "warm"), (1, "cold"), (1, "warm")):
            load1 = os.getloadavg()[0]
            wall_c, cpu_c, walls_c = timed_cli(a.routing, draws, a.cli_repeats, a.platforms, workers, cache)
            how = "--workers 1" if workers else "default workers (the cores)"
            print(f"paper grid through the command line (python -m npumoe_lab simulate <grid flags> --draws {draws} "
                  f"--out DIR, {how}; imports, printing and writing included; draw + plan caches {cache}): {wall_c:.1f} s "
                  f"wall, {cpu_c:.1f} s CPU (median of {a.cli_repeats}: {', '.join(f'{t:.1f}' for t in walls_c)} s "
                  f"wall); load average {load1:.1f} -> {os.getloadavg()[0]:.1f}; target <= "
                  f"{5 if draws == 0 else 60} s")
    if a.sweep:
        with tempfile.TemporaryDirectory() as kept:
            for cache in ("cold", "warm"):        # the same draw cache: empty first, then as the first sweep left it
                load1 = os.getloadavg()[0]
                wall_s, cpu_s, cells = timed_sweep("sweeps/simulate_10k.yaml", a.sweep_workers, kept)
                print(f"10k sweep through the command line (python -m npumoe_lab sweep sweeps/simulate_10k.yaml "
                      f"--workers {a.sweep_workers} --out DIR, a fresh folder; {cells} cells x 16 plans, 8 decode "
                      f"steps each; draw + plan caches {cache}): {wall_s:.1f} s wall, {cpu_s:.1f} s CPU; load average "
                      f"{load1:.1f} -> {os.getloadavg()[0]:.1f}; target <= 60 s")
    if a.gc_peer:
        gc_peer(a)
    if a.tables:
        print(paper_scale_markdown(df))
    return 0


if __name__ == "__main__":
    sys.exit(main())
