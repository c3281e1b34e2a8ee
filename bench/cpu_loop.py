"""The device-model loop proven on this CPU, end to end, on held-out runs DRAWN from a declared grid (docs/CPU_LOOP.md):

  0. the draw: `--draw SEED` picks the held-out settings at random from the grid of experiments/cpu_draw.py (every
     offline workload, prompts 128-2048, chunks 32-512, all 9 variants, the bundled model and a 2-layer
     Qwen3-30B-A3B-geometry model, dtype auto and fp32); the seed and every drawn setting are printed FIRST
  1. npumoe-lab measure --device cpu        op-level micro-benchmarks (fit rows), tiny + Qwen3-30B-A3B geometry,
                                            in this CPU's fast dtype and (when a drawn run needs it) in fp32
  2. npumoe-lab fit-device --platform cpu   the host model fitted on them (cpu-fit.yaml, one fit per dtype, its
                                            Laplace posterior and cross-validated whole-prefill noise)
  3. the drawn held-out runs (never fitted), each `run --platform cpu --timeline` (measured TTFT)
  4. npumoe-lab validate-device --runs      every run's op stream re-priced by the fit of its dtype, with a 90 %
                                            interval, vs its measured TTFT

Acceptance on a QUIET host with a FRESH seed written into docs/CPU_LOOP.md before the run: median |error| <= 10 %,
worst <= 25 % (rows flagged host_busy excluded and counted), 90 % coverage >= 80 %. Without --draw the fixed
development draw (cpu_draw.DEV_SEED) runs: structure decisions are made on it and on fit-row residuals only.
Budget: <= 8 minutes on 2 quiet cores; the held-out runs get --budget-s seconds (a-priori cost per draw,
cpu_draw.estimated_s), so the number of runs depends on the seed and is printed. `--small`: a smoke test (the quick
measure grid, 3 tiny runs; its numbers prove nothing).

    make cpu-loop                               # the development draw
    make cpu-loop LOOP_ARGS="--draw 12345"      # an acceptance draw (record the seed first)
"""
from __future__ import annotations

import argparse
import ctypes
import gc
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from npumoe_lab.cli import main as cli  # noqa: E402  (after the path insert: bench runs from a checkout)
from npumoe_lab.core.cpu_features import cpu_flags, cpu_model, dtype_name, resolve_dtype  # noqa: E402
from npumoe_lab.execution.experts import detach  # noqa: E402
from npumoe_lab.experiments import cpu_draw  # noqa: E402
from npumoe_lab.experiments.geometry_model import random_model  # noqa: E402
from npumoe_lab.experiments.runner import run_experiment  # noqa: E402
from npumoe_lab.experiments.validate_runs import acceptance, summary, table_lines, validate_runs, verdict  # noqa: E402
from npumoe_lab.models import load_model  # noqa: E402

CALIB_TOKENS = 2048        # calibration of the plan variants (not timed): a quarter of the run default, for the budget
QWEN_LAYERS = 2


def step(title: str):
    print(f"\n== {title} ({time.strftime('%H:%M:%S')})", flush=True)


def _cli(args) -> None:
    rc = cli([str(a) for a in args])
    if rc:
        raise SystemExit(f"step failed: npumoe-lab {' '.join(map(str, args))} (exit {rc})")


def held_out_run(s: cpu_draw.Setting, out: Path, threads: int, qwen_cache: dict) -> None:
    """One drawn setting, measured: `run --platform cpu --timeline` (the Qwen3 geometry through the same runner)."""
    common = dict(workload=s.workload, variants=s.variant, platforms="cpu", prompt_len=s.prompt_len, chunk=s.chunk,
                  repeats=cpu_draw.repeats_of(s), n_samples=1, timeline=True, threads=threads,
                  calib_tokens=CALIB_TOKENS, out=out)
    if not s.qwen:
        run_experiment(model="tiny", dtype=s.dtype, **common)
        return
    dtype = resolve_dtype(s.dtype)
    if qwen_cache.get("dtype") != dtype:        # one Qwen3 model in memory at a time (3.7 GB bf16, 7.4 GB fp32)
        release(qwen_cache)
        _, tok = load_model("tiny")          # any tokenizer whose ids fit the vocabulary: the weights are random
        qwen_cache.update(dtype=dtype, model=random_model("qwen3-30b-a3b", QWEN_LAYERS, dtype, seed=0), tok=tok)
    run_experiment(model=(qwen_cache["model"], qwen_cache["tok"]), model_name=s.model, **common)


def release(qwen_cache: dict) -> None:
    """Drop the cached Qwen3 model now: its attachment (packed expert copies, 2.4-4.8 GB) and the model refer to each
    other, so without a collection the old model lived on beside the next one (acceptance draw 12 was OOM-killed)."""
    model = qwen_cache.get("model")
    if model is not None:
        detach(model)
    qwen_cache.clear()
    del model
    gc.collect()
    try:                  # and hand glibc's freed heap back: ~2.5 GB of the bf16 model stayed in RSS after a collect
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


def table(df, s: dict, seed: int, threads: int, seconds: float) -> str:
    flags = " ".join(sorted(f for f in cpu_flags() if f in ("avx2", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile")))
    lines = [f"CPU loop, draw seed {seed}, on {cpu_model()} (flags: {flags or 'none of avx2/avx512/amx'}), {threads} "
             f"torch threads, dtype auto = {dtype_name(resolve_dtype('auto'))}; loop wall time {seconds / 60:.1f} min",
             "", *table_lines(df), "",
             "measured = MEASURED on this host; modeled = the host model fitted on `measure` rows only (MODELED), "
             "90 % interval = its Laplace posterior x cross-validated whole-prefill noise. " + verdict(s),
             f"Acceptance (median <= 10 %, worst <= 25 %, coverage >= 80 %): {'MET' if acceptance(s) else 'NOT met'}."]
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--draw", type=int, default=cpu_draw.DEV_SEED,
                    help=f"seed of the held-out draw (default {cpu_draw.DEV_SEED}: the development draw)")
    ap.add_argument("--budget-s", type=float, default=200.0, help="a-priori seconds for the held-out runs")
    ap.add_argument("--runs", type=int, default=None, help="draw exactly this many runs instead of a budget")
    ap.add_argument("--out", default="results/cpu-loop")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--measure-repeats", type=int, default=3)
    ap.add_argument("--small", action="store_true", help="a reduced loop (smoke test; proves nothing)")
    ap.add_argument("--include-busy", action="store_true", help="fit on host_busy rows too (a busy host)")
    ap.add_argument("--reuse-fit", action="store_true",
                    help="keep OUT/measure and OUT/fit from an earlier loop on this host (its fit rows never see the "
                         "held-out draw); the table says so")
    a = ap.parse_args(argv)
    out, t0 = Path(a.out), time.perf_counter()
    torch.set_num_threads(a.threads)
    settings = cpu_draw.draw(a.draw, n=3 if a.small else a.runs, budget_s=None if a.small or a.runs else a.budget_s)
    if a.small:
        settings = [cpu_draw.Setting("tiny", x.workload, x.variant, min(x.prompt_len, 256), min(x.chunk, 128), x.dtype)
                    for x in settings]
    step("0. the held-out draw (printed before any run)")
    print(cpu_draw.describe(a.draw, settings), flush=True)
    out.mkdir(parents=True, exist_ok=True)
    (out / "draw.json").write_text(json.dumps({"seed": a.draw, "grid": cpu_draw.GRID, "budget_s": a.budget_s,
                                               "settings": cpu_draw.as_dicts(settings)}, indent=1, default=str))
    auto = dtype_name(resolve_dtype("auto"))
    dtypes = ["auto"] + (["fp32"] if auto != "fp32" and any(x.dtype == "fp32" for x in settings) else [])
    quick = ["--quick", "--geometry", "tiny"] if a.small else \
        ([] if any(x.qwen for x in settings) else ["--geometry", "tiny"])
    for d in dtypes if not a.reuse_fit else []:
        step(f"1. measure --device cpu --dtype {d}")
        _cli(["measure", "--device", "cpu", "--dtype", d, "--out", out / "measure", "--repeats", a.measure_repeats,
              "--threads", a.threads] + quick)
    if a.reuse_fit:
        fit = out / "fit" / "cpu-fit.yaml"
        if not fit.is_file():
            raise SystemExit(f"--reuse-fit: {fit} does not exist; run the loop once without --reuse-fit")
        step(f"1-2. measure and fit-device reused: {fit} (written {time.ctime(fit.stat().st_mtime)})")
    else:
        step("2. fit-device --platform cpu")
        _cli(["fit-device", "--platform", "cpu", "--measurements", out / "measure", "--out", out / "fit"]
             + (["--include-busy"] if a.include_busy else []))
    step(f"3. {len(settings)} drawn held-out runs (run --platform cpu --timeline)")
    if (out / "runs").exists():       # an earlier draw's runs would be validated with this one's: moved aside
        old = out / f"runs-before-{time.strftime('%Y%m%dT%H%M%S')}"
        (out / "runs").rename(old)
        print(f"earlier runs moved to {old}", flush=True)
    cache = {}
    for i, s in enumerate(settings):
        print(f"-- run {i + 1}/{len(settings)}: {s.label()} ({time.strftime('%H:%M:%S')})", flush=True)
        held_out_run(s, out / "runs" / f"{i + 1:03d}", a.threads, cache)
    release(cache)
    step("4. validate-device --runs")
    _cli(["validate-device", "--platform", out / "fit" / "cpu-fit.yaml", "--runs", out / "runs", "--out",
          out / "validate"])
    df = validate_runs(out / "fit" / "cpu-fit.yaml", out / "runs")
    text = table(df, summary(df), a.draw, a.threads, time.perf_counter() - t0) + (
        "\n(measure and fit reused from an earlier loop on this host: the wall time is the held-out runs' only)"
        if a.reuse_fit else "")
    (out / "README_TABLE.md").write_text(text + "\n")
    print("\n" + text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
