"""`npumoe-lab simulate`: paper-scale prefill from a model's geometry and routing statistics (no weights; times
modeled)."""
from __future__ import annotations

import os
import time

from npumoe_lab.cli.decode_flags import add_decode_arguments, check_decode_args
from npumoe_lab.cli.knob_flags import add_knob_arguments, knobs_from_args
from npumoe_lab.cli.output import writes
from npumoe_lab.cli.operating_point import add_operating_point_argument
from npumoe_lab.utils import REPO_ROOT

WEIGHT_FORMATS = ("fp16", "int8")    # = sim.run.WEIGHT_FORMATS (not imported: torch; tests/test_cli checks)


def bundled_geometries() -> list[str]:
    """= sim.geometries.list_geometries(), read without importing transformers (for the help text)."""
    return sorted(p.stem for p in (REPO_ROOT / "data" / "geometries").glob("*.json"))


LONG_TABLE_ROWS = 20     # more rows than this: one line per cell, variants side by side (every row is in --out)


def _s(v) -> str:
    return "-" if v != v else f"{v:.3g}"


def summary_table(df) -> str:
    """The rows as a table with their 90 % intervals (ttft_s_lo/hi over parameter draws); a big grid as one line
    per (model, platform, prompt_len, chunk) with each variant's "TTFT s [lo-hi]" side by side."""
    has_iv = {"ttft_s_lo", "ttft_s_hi"} <= set(df.columns)
    if len(df) <= LONG_TABLE_ROWS:
        cols = ["model", "platform", "prompt_len", "chunk", "variant", "ttft_s", *(["ttft_s_lo", "ttft_s_hi"]
                if has_iv else []), "tpot_s", "e2e_s", *(["e2e_s_lo", "e2e_s_hi"] if has_iv else []),
                "energy_per_token_mj", "cpu_cycles", "n_npu_calls", "npu_programs", "feasible", "percentile",
                "drop_rate", "pad_rate"]
        return df[[c for c in cols if c in df.columns]].to_string(index=False)
    cell = df.apply(lambda r: _s(r.ttft_s) + (f" [{_s(r.ttft_s_lo)}-{_s(r.ttft_s_hi)}]" if has_iv else ""),
                    axis=1)
    wide = df.assign(cell=cell).pivot_table(index=["model", "platform", "prompt_len", "chunk"], columns="variant",
                                            values="cell", aggfunc="first", sort=False)
    return (f"TTFT s{' [90 % interval over parameter draws]' if has_iv else ''} (modeled), {len(df)} rows "
            f"(every column in the rows under --out):\n" + wide.reset_index().to_string(index=False))


def _simulate(a) -> int:
    # lazy: torch, pandas and the engine load only when the command runs (`--help` stays fast)
    import pandas as pd
    from npumoe_lab.sim.report import ratios
    from npumoe_lab.sim.run import save_simulation, simulate_with_timelines
    if a.no_cache:      # the workers inherit both (sim/draw_cache.py, sim/plan_cache.py)
        os.environ["NPUMOE_DRAW_CACHE"] = os.environ["NPUMOE_PLAN_CACHE"] = "off"
    knobs = knobs_from_args(a)
    check_decode_args(a)
    t0 = time.perf_counter()
    df, timelines = simulate_with_timelines(a.geometry, a.routing, a.platforms, a.variants, a.prompt_len, a.chunk,
                                            a.weights, a.seed, a.timeline, draws=a.draws,
                                            engine=a.engine, workers=a.workers, decode_tokens=a.decode_tokens,
                                            decode_policy=a.decode_policy, operating_point=a.operating_point,
                                            off_band=a.off_band, **knobs)
    with pd.option_context("display.width", 200, "display.max_columns", 20, "display.max_rows", 400):
        print(summary_table(df))
        sp = ratios(df, "ttft_s")
        if not sp.empty:
            print("\nnpumoe TTFT speedup (baseline / npumoe, modeled):\n"
                  + sp.to_string(index=False, float_format=lambda x: f"{x:.2f}"))
    print(f"\n{len(df)} rows (timing modeled, numerics none; routing {df.routing_source.iloc[0]}, measured Gini of "
          f"the sampled counts {df.routing_gini.iloc[0]:.3f}) in {time.perf_counter() - t0:.1f} s", flush=True)
    with writes(a.out, "the table is printed above"):     # printed first: a full disk cannot lose it
        save_simulation(df, timelines, a.out)
    print(f"written to {a.out}")
    return 0


def register_cli(sub) -> None:
    p = sub.add_parser("simulate", help="paper-scale prefill from a model's geometry and routing statistics "
                                        "(no weights; times modeled)")
    p.add_argument("--geometry", default="qwen3-30b-a3b",
                   help=f"comma list of {', '.join(bundled_geometries())} or config.json paths")
    p.add_argument("--routing", default="synthetic:gini=0.6",
                   help="synthetic:gini=G[,layer_overlap=L,workload_overlap=W,concentration=A,doc_concentration=D,"
                        "calibration=MIX,workload=MIX,seed=N] (unset fields: the measured defaults of "
                        "data/routing/tiny-defaults.yaml) | profile:DIR[,run=DIR2|,workload_overlap=W] | "
                        "tiny[:workload=NAME] | counts:NAME|DIR[,calib=D1+D2,eval=D] | trace:NAME|DIR[,phase=P] | "
                        "a routing-import folder | real (real routing data of data/routing/: docs/ROUTING.md)")
    p.add_argument("--platforms", "--platform", dest="platforms", default="m2-max",
                   help="comma list of modeled platforms (default m2-max)")
    p.add_argument("--variants", "--variant", dest="variants", default="all",
                   help="comma list of variants, or 'all' (default)")
    p.add_argument("--prompt-len", default="1024", help="comma list of prompt lengths (default 1024)")
    p.add_argument("--chunk", default="512", help="comma list of prefill chunks (default 512)")
    p.add_argument("--weights", default="fp16", choices=WEIGHT_FORMATS,
                   help="NPU weight storage: fp16, or int8 dequantized on the NPU (half the bytes streamed)")
    p.add_argument("--seed", type=int, default=0, help="seed of the sampled routing (default 0)")
    add_knob_arguments(p, with_defaults=False)       # unset: each variant's plan defaults
    add_decode_arguments(p)
    add_operating_point_argument(p)
    p.add_argument("--off-band", default="error", choices=("error", "closest"),
                   help="--operating-point paper where no percentile reaches the band: error (exit 2, the default) "
                        "or closest (simulate there; rows say op_in_band False)")
    p.add_argument("--timeline", action="store_true", help="also write the per-op timelines")
    p.add_argument("--no-cache", action="store_true",
                   help="sample every routing draw and build every plan afresh (default: calibration and prompt "
                        "draws and the built plans are read from the keyed caches cache_dir()/draws and "
                        "cache_dir()/plans where a run with the same key wrote them: the same rows either way; = "
                        "NPUMOE_DRAW_CACHE=off NPUMOE_PLAN_CACHE=off)")
    p.add_argument("--draws", type=int, default=200,
                   help="parameter draws for the 90%% interval columns (*_lo/_hi) (the platform's posterior, else a prior from its sourced alternatives; 0: none; "
                        "default 200)")
    p.add_argument("--engine", default="array", choices=("array", "ops"),
                   help="array: op streams as arrays (fast, default); ops: the per-op replay (the reference)")
    p.add_argument("--workers", type=int, default=None,
                   help="processes over the grid's (geometry, chunk) units, the same rows (default: the cores this "
                        "process may use; 1: in one process)")
    p.add_argument("--out", default="results/simulate", help="results folder (default results/simulate)")
    p.set_defaults(func=_simulate)
