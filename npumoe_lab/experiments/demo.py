"""`make demo` (`python -m npumoe_lab.experiments.demo --out results/demo`) and the small helpers the notebooks call.

The demo: calibrate the bundled tiny model, build the plans (profile + plan JSON saved in the output folder), run
the small ablation sweep `sweeps/demo.yaml` (notebook 05_baselines: every variant, measured on this CPU and modeled
on M2 Max) through `run_sweep`, draw every figure with `make_all_figures`, and write `SUMMARY.md`.
The notebooks' own helpers live in `notebook_helpers.py`.
"""
from __future__ import annotations

import multiprocessing
import os
import shutil
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import pandas as pd

from npumoe_lab.errors import NpuMoeError
from npumoe_lab.viz.plot_helpers import default_knobs
from npumoe_lab.results.stats import change_statement
from npumoe_lab.utils import REPO_ROOT, kernel_env

DEMO_SWEEP = REPO_ROOT / "sweeps" / "demo.yaml"
FIGURE_NOTES = {
    "baselines": "TTFT, energy per token, CPU cycles per variant (paper main figure); `baselines-<platform>` one "
                 "platform each",
    "ablation": "TTFT speedup of npumoe-base -> -t -> -tg -> npumoe over npumoe-base, each step's drop rate in its "
                "label; the paper's values drawn only on its own setting (Phi-3.5-MoE, M2 Ultra)",
    "accuracy": "accuracy change vs the dropless reference against drop rate (exact 95 % bounds; n stated)",
    "tiers": "padding vs drop rate per configuration",
    "grouping": "group size vs TTFT / energy / NPU calls",
    "residency": "hot threshold vs TTFT / energy",
    "popularity": "calibration: load share per expert and layer",
    "paper": "the paper's three models simulated (modeled M2 Max / M2 Ultra): main figure and ablation",
    "ttft": "TTFT against npumoe's drop rate over a tier-percentile sweep (bundled model, modeled), the "
                    "paper's 10-22 % band shaded, baselines as lines",
}
# what every demo cell's notebook (05_baselines) imports and loads first
WARM_UP = ("from npumoe_lab.experiments import notebook_helpers as nb\n"
           "from npumoe_lab.experiments import runner\nfrom npumoe_lab.viz import plots\n"
           "nb.load({model!r}, {dtype!r})")
SUMMARY_COLUMNS = ("ttft_s", "energy_per_token_mj", "cpu_cycles", "n_npu_calls", "drop_rate", "score")
PLAN_COLUMNS = ("n_npu_groups", "n_cpu_groups", "npu_expert_flop_share")    # what each plan did (footprint.py)


# -- the demo ---------------------------------------------------------------------------------------------------
def summary_markdown(df: pd.DataFrame, sources: dict) -> str:
    """SUMMARY.md: variant x platform table (medians over cells/repeats) + ablation ratios next to the paper's."""
    # lazy: the demo's parts load only when it runs (python -m ... --help stays quick)
    from npumoe_lab.planning.variants import ABLATION, PAPER_ABLATION_SPEEDUP, VARIANTS
    lines = ["# npumoe-lab demo: summary", ""]
    lines += [f"- {k}: {v}" for k, v in sources.items()]
    lines += ["", "Each metric carries its own source, copied from the rows (`timing_source`, `energy_source`, "
              "`cycles_source`): **measured** (run on this host, wall clock), **modeled** (the device cost model of "
              "`npumoe_lab/devices/platforms/<name>.yaml`, with its sourced parameters; `npumoe-lab platforms` lists "
              "them), or both combined: a measured row's energy is `measured-time x modeled-power` (busy time x the "
              "platform's watts per core) and its CPU cycles `measured-cpu-time x modeled-clock` (process CPU time x "
              "the nominal clock) or `measured-time x threads x modeled-clock` (wall time x torch threads x the "
              "nominal clock). Numerics (drop rate, score) are real in both: the model runs on this CPU.", ""]
    if "host_busy" in df.columns and df["host_busy"].fillna(False).astype(bool).any():
        busy = df[df["host_busy"].fillna(False).astype(bool)]
        lines += [f"**Measured rows were taken on a busy host** ({len(busy)} of "
                  f"{int((df.get('platform_kind') == 'measured').sum()) or len(busy)} measured rows flagged "
                  f"`host_busy`; e.g. {busy['host_busy_reason'].iloc[0]}): their times are not what a quiet "
                  "machine gives. Modeled rows are unaffected.", ""]
    knob = df["percentile"].notna() if "percentile" in df.columns else pd.Series(False, index=df.index)
    matched, df = df[knob], default_knobs(df[~knob]) if (~knob).any() else df
    for (p, c), g in df.groupby(["prompt_len", "chunk"]):
        lines += [f"## prompt {p} tokens, chunk {c} (median of {int(g.groupby(['variant', 'platform']).size().max())}"
                  f" row(s) per cell)", "",
                  "| variant | platform | TTFT source | TTFT (s) | energy source | energy/token (mJ) | cycles source | "
                  "CPU cycles | NPU calls | NPU groups (expert FLOP share) | drop rate | score |",
                  "|---|---|---|---:|---|---:|---|---:|---:|---:|---:|---:|"]
        cols = {c_: "median" for c_ in SUMMARY_COLUMNS + PLAN_COLUMNS if c_ in g.columns}
        srcs = {c_: _one_label for c_ in SOURCE_COLUMNS}
        agg = g.assign(**{c_: g[c_] if c_ in g.columns else "not recorded" for c_ in SOURCE_COLUMNS}).groupby(
            ["platform", "variant"], sort=False).agg({**cols, **srcs}).reset_index()
        order = {v: i for i, v in enumerate(VARIANTS)}
        agg = agg.sort_values(["platform", "variant"], key=lambda s: s.map(order) if s.name == "variant" else s)
        for r in agg.itertuples():
            groups = (f"{r.n_npu_groups:.0f} of {r.n_npu_groups + r.n_cpu_groups:.0f} "
                      f"({r.npu_expert_flop_share:.0%})" if hasattr(r, "n_npu_groups") and r.n_cpu_groups == r.n_cpu_groups
                      else "-")
            lines.append(f"| {r.variant} | {r.platform} | {r.timing_source} | {r.ttft_s:.4g} | {r.energy_source} | "
                         f"{r.energy_per_token_mj:.4g} | {r.cycles_source} | {r.cpu_cycles:.3g} | {r.n_npu_calls:.0f} "
                         f"| {groups} | {r.drop_rate:.1%} | {r.score:.3f} |")
        lines += ["", *_degenerate_lines(agg.assign(model="tiny", prompt_len=p, chunk=c))]
        lines += ["", "Ablation: TTFT speedup over npumoe-base at each step's own drop rate (paper, PAPER.md 5.5: "
                  + " / ".join(f"{PAPER_ABLATION_SPEEDUP[v]:.2f}" for v in ABLATION) + ")", ""]
        lines += _ablation_table(agg)
        mg = matched[(matched.prompt_len == p) & (matched.chunk == c)] if len(matched) else matched
        if len(mg):
            pct = ", ".join(f"{x:g}" for x in sorted(mg["percentile"].unique()))
            lines += ["", f"The same steps at a matched drop rate (each calibrated on the workload's own text, "
                      f"capacities at load percentile {pct}):", ""]
            lines += _ablation_table(mg.groupby(["platform", "variant"], sort=False).agg(
                ttft_s=("ttft_s", "median"), drop_rate=("drop_rate", "median"),
                timing_source=("timing_source", "first")).reset_index())
        lines += ["", *_accuracy_lines(g), ""]
    return "\n".join(lines)


SOURCE_COLUMNS = ("timing_source", "energy_source", "cycles_source")


def _one_label(values: pd.Series) -> str:
    """The rows' own label of a metric; several (e.g. repeats of different provenance) are all named."""
    labels = sorted({str(v) for v in values.dropna()})
    return " + ".join(labels) if labels else "not recorded"


def _degenerate_lines(agg: pd.DataFrame) -> list[str]:
    """npumoe = anemll where its plan leaves no expert group on the NPU; and the note that one variant name is a
    different plan per platform (the NPU groups column says which)."""
    from npumoe_lab.sim.degenerate import npu_idle_note   # lazy, as above
    out = npu_idle_note(agg)
    if "n_npu_groups" in agg.columns and agg[agg.variant == "npumoe"].n_npu_groups.nunique() > 1:
        out.append("The same variant name is a different plan on each platform: npumoe's residency is chosen for "
                   "the platform's cost model (NPU groups column).")
    return out + [""] if out else []


def _ablation_table(agg: pd.DataFrame) -> list[str]:
    """Speedups over npumoe-base, each with the drop rate of its step (a speedup bought with drops is another
    accuracy point); a step equal to an earlier one (or npumoe = anemll) is marked, not reported as a speedup."""
    # lazy: the demo's parts load only when it runs (python -m ... --help stays quick)
    from npumoe_lab.planning.variants import ABLATION, PAPER_ABLATION_SPEEDUP
    from npumoe_lab.sim.degenerate import equal_to
    same = equal_to(agg.assign(model="-", prompt_len=0, chunk=0))
    lines = ["| platform | timing | " + " | ".join(ABLATION) + " |", "|---|---|" + "---:|" * len(ABLATION)]
    for plat, pg in agg.groupby("platform", sort=False):
        t, d = pg.set_index("variant").ttft_s, pg.set_index("variant").drop_rate
        if "npumoe-base" not in t:
            continue
        cells = [(f"= {same[('-', plat, 0, 0, v)]} (no speedup of its own)" if ("-", plat, 0, 0, v) in same else
                  f"{t['npumoe-base'] / t[v]:.2f}x at {d[v]:.1%} drop") + f" (paper {PAPER_ABLATION_SPEEDUP[v]:.2f}x)"
                 if v in t else "-" for v in ABLATION]
        lines.append(f"| {plat} | {pg.timing_source.iloc[0]} | " + " | ".join(cells) + " |")
    return lines


def _accuracy_lines(g: pd.DataFrame) -> list[str]:
    """Exact bounds of each variant's accuracy change (discordant pairs), with top-1 agreement and KL, which
    still move when the task score saturates."""
    if "accuracy_lost" not in g.columns:
        return []
    out = ["Accuracy vs reference (same samples; exact 95% bounds from the discordant pairs):", ""]
    for r in g[g.variant != "reference"].drop_duplicates(["variant", "platform"]).itertuples():
        out.append(f"- {r.variant} @ {r.platform}: " + change_statement(
            r.accuracy_lost, r.accuracy_gained, r.n_samples, r.accuracy_loss_bound, r.accuracy_exact_low,
            r.accuracy_exact_high) + f"; top-1 agreement {r.top1_agree:.3f}, KL {r.kl:.3g}")
    return out


def _plan_check(df: pd.DataFrame, saved: dict) -> str:
    """Are the plans the sweep ran (default rows) the saved ones? The matched-drop-rate rerun (rows with a
    percentile) is calibrated on the workload itself, so its plans are counted apart."""
    if "plan_hash" not in df:
        return "none recorded"
    rerun = df["percentile"].notna() if "percentile" in df else pd.Series(False, index=df.index)
    used = set(df.loc[~rerun, "plan_hash"].dropna()) - {"None", "nan"}
    extra = len(set(df.loc[rerun, "plan_hash"].dropna()) - {"None", "nan"})
    note = f" (+ {extra} plan(s) of the matched-drop-rate rerun, built in the notebook)" if extra else ""
    if not used:
        return "none recorded" + note
    missing = used - set(saved)
    if missing:
        return f"{len(used)} distinct; {len(missing)} NOT among the saved plans (built with other knobs)" + note
    return f"{len(used)} distinct, each identical (hash) to a saved plan in `plans/`" + note


def _archive_stale_sweep(sweep_dir: Path, fingerprint: str) -> None:
    """A re-run resumes the sweep (cells with DONE.json are skipped), but rows of another model (e.g. before the
    tiny model was retrained) must not be mixed in: move such a sweep folder aside to `_previous/`."""
    # lazy: the demo's parts load only when it runs (python -m ... --help stays quick)
    from npumoe_lab.results.store import load_results
    if not sweep_dir.is_dir():
        return
    try:
        old = set(load_results(sweep_dir, include_failed=True)["model_fingerprint"].dropna())
    except (NpuMoeError, KeyError):
        return
    if old and old != {fingerprint}:
        dest = sweep_dir.parent / "_previous" / time.strftime("sweep-%Y%m%d-%H%M%S")
        dest.parent.mkdir(parents=True, exist_ok=True)
        sweep_dir.rename(dest)
        print(f"[demo] {sweep_dir} holds rows of another model; moved to {dest}", flush=True)


def draw_figures(out: Path) -> list[Path]:
    """Every figure of the tiny model's sweep (+ each platform's baselines on its own) and one popularity heatmap
    per calibration profile, all on one colour scale. The paper-scale rows get their own figures
    (paper_scale_section): their facets would crowd these."""
    # lazy: the demo's parts load only when it runs (python -m ... --help stays quick)
    from npumoe_lab.viz.plots import make_all_figures, plot_baselines, plot_popularity_heatmap, save_figure, shared_vmax
    from npumoe_lab.results.store import load_results  # lazy, as above
    figs = make_all_figures(out / "sweep", out / "figures")
    profiles = sorted(p.parent for p in (out / "profiles").glob("*/counts.parquet"))
    top = shared_vmax(profiles)
    for prof in profiles:
        name = "popularity" if len(profiles) == 1 else f"popularity-{prof.name}"
        figs += save_figure(plot_popularity_heatmap(prof, vmax=top), out / "figures", name)
    from npumoe_lab.viz.end_to_end import plot_e2e  # lazy, as above
    for plat, g in load_results(out / "sweep").groupby("platform"):
        figs += save_figure(plot_baselines(g), out / "figures", f"baselines-{plat}")
        if "e2e_s" in g and g.e2e_s.notna().any():      # rows with decode steps: e2e as prefill + decode
            figs += save_figure(plot_e2e(g[g.e2e_s.notna()]), out / "figures", f"e2e-{plat}")
    return figs + drop_curve_figures(out, profiles)


def drop_curve_figures(out: Path, profiles) -> list[Path]:
    """TTFT against npumoe's drop rate over a tier-percentile sweep on the calibrated model (the geometry of the
    profile's model, the bundled one unless the profile names another folder; the demo's own calibration profile as
    the routing; modeled m2-max and m2-ultra), one figure per profile's chunk."""
    # lazy: the demo's parts load only when it runs (python -m ... --help stays quick)
    from npumoe_lab.models import TINY_MODEL_DIR
    from npumoe_lab.planning.profile import CalibrationProfile
    from npumoe_lab.sim.operating_point import percentile_sweep
    from npumoe_lab.viz.drop_curve import plot_ttft_vs_drop
    from npumoe_lab.viz.plots import save_figure
    figs = []
    for prof in profiles:
        profile = CalibrationProfile.load(prof)
        chunk, config = profile.chunk, Path(str(profile.meta.get("model", ""))) / "config.json"
        geometry = config if profile.meta.get("model") and config.is_file() else TINY_MODEL_DIR / "config.json"
        rows = percentile_sweep(str(geometry), f"profile:{prof}", "m2-max,m2-ultra",
                                prompt_len=2 * chunk, chunk=chunk)
        name = "ttft-vs-drop" if len(profiles) == 1 else f"ttft-vs-drop-{prof.name}"
        figs += save_figure(plot_ttft_vs_drop(rows), out / "figures", name)
    return figs


# draws: the 90 % interval of every modeled metric over parameter draws, drawn as the figures' whiskers
PAPER_SCALE = dict(geometry="qwen3-30b-a3b,phi-3.5-moe,phi-tiny-moe", routing="synthetic:gini=0.6",
                   platforms="m2-max,m2-ultra", variants="all", prompt_len=1024, chunk=512, draws=200)


def paper_scale_section(out: Path) -> tuple[str, list]:
    """The paper's three models simulated (geometry + routing statistics, no weights; all modeled): rows in
    `paper-scale/`, the main figure and ablation of that grid, and the SUMMARY section saying what it shows."""
    # lazy: the demo's parts load only when it runs (python -m ... --help stays quick)
    from npumoe_lab.viz.plots import plot_ablation, plot_baselines, save_figure
    from npumoe_lab.sim.report import paper_scale_markdown
    from npumoe_lab.sim.run import simulate
    print("[demo] simulating the paper's models (Qwen3-30B-A3B, Phi-3.5-MoE, Phi-tiny-MoE) ...", flush=True)
    df = simulate(**PAPER_SCALE, out=out / "paper-scale")
    figs = save_figure(plot_baselines(df), out / "figures", "paper-scale-baselines") + \
        save_figure(plot_ablation(df), out / "figures", "paper-scale-ablation")
    args = " ".join(f"--{k.replace('_', '-').rstrip('s') if k in ('platforms', 'variants') else k.replace('_', '-')} "
                    f"{v}" for k, v in PAPER_SCALE.items())
    return (f"## Paper scale, simulated (`npumoe-lab simulate {args}`)\n\n" + paper_scale_markdown(df) + "\n",
            figs)


# the demo's accuracy curve: small n so the demo stays fast (the n = 300 curve is bench/accuracy_curve.py)
DEMO_ACCURACY = {"n": 10, "percentiles": "50,80,100"}


def start_accuracy_curve(out: Path, options: dict):
    """`npumoe-lab accuracy` in its own process (studies/ sits above experiments/: run, not imported), started
    beside the figures; returns the Popen."""
    import subprocess
    args = [sys.executable, "-m", "npumoe_lab.cli", "accuracy", "--out", str(out / "accuracy"), "--threads", "1"]
    for k, v in options.items():
        args += [f"--{k.replace('_', '-')}", str(v)]
    log = open(out / "accuracy.log", "w")
    return subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "NPUMOE_NO_PROGRESS": "1"})


# the recorded n = 300 curve (bench/accuracy_curve.py on this repo's host): SUMMARY quotes its verdict, labelled
RECORDED_ACCURACY = Path(__file__).resolve().parents[2] / "docs" / "figures" / "ACCURACY-tiny-n300.md"


def _verdict_part(md_text: str) -> str:
    return md_text.split("## Verdict", 1)[1].split("## Rows", 1)[0].strip()


def accuracy_section(out: Path, proc, options: dict, recorded: Path = RECORDED_ACCURACY) -> str:
    """SUMMARY's accuracy section: the verdict of the demo's small curve (ACCURACY.md), its n and bound said
    plainly, then the verdict of the recorded n = 300 curve (not re-run by the demo), where the repo has it."""
    rc = proc.wait()
    md = out / "accuracy" / "ACCURACY.md"
    flags = " ".join(f"--{k.replace('_', '-')} {v}" for k, v in options.items())
    n = max(int(options.get("n", 1)), 1)
    head = (f"## Accuracy vs drop rate (`npumoe-lab accuracy {flags}`: n = {n} samples per task)\n\n"
            f"At n = {n} the exact bounds are wide: with no sample lost the one-sided 95 % bound on the loss is still "
            f"{100 * (1 - 0.05 ** (1 / n)):.1f} points (1.1 points needs n >= 271 and no sample lost), so this run "
            "shows the curve works and cannot decide the paper's \"< 1.1 %\" claim. The verdict is the n = 300 curve "
            f"below. This run's rows, figure: `{out / 'accuracy'}`.\n\n")
    if rc != 0 or not md.is_file():
        text = head + f"The accuracy curve failed (exit {rc}); see `{out / 'accuracy.log'}`.\n"
    else:
        text = head + _verdict_part(md.read_text()) + "\n"
    if recorded.is_file():
        rec = recorded.read_text()
        text += (f"\n### The verdict at n = 300 (recorded, not re-run by the demo: `{recorded.name}` in docs/figures/, "
                 "from `bench/accuracy_curve.py`; README \"Accuracy that can tell variants apart\")\n\n"
                 + rec.split("\n\n", 2)[1].strip() + "\n\n" + _verdict_part(rec) + "\n")
    else:
        text += "\nNo recorded n = 300 curve in this checkout (docs/figures/ACCURACY-tiny-n300.md): run make bench.\n"
    return text


def run_demo(out, sweep=DEMO_SWEEP, workers: int = 1, accuracy: dict | None = None, fresh: bool = False) -> Path:
    """`fresh`: re-measure every measured cell of the sweep (run_sweep(fresh=True)) instead of resuming."""
    import yaml

    t0 = time.time()
    # lazy: the demo's parts load only when it runs (python -m ... --help stays quick); the sweep's first, so that
    # its kernel starts before this process imports the rest
    from npumoe_lab.experiments.sweep import prewarm, run_sweep
    from npumoe_lab.experiments.sweep_spec import load_spec
    out = Path(out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    kernel_env()
    spec = load_spec(sweep)
    p = spec.parameters
    chunks = spec.grid.get("chunk", [p.get("chunk", 256)])
    model_name = p.get("model", "tiny")
    # the sweep's kernel starts now and imports + loads the cells' model while this process imports, loads and
    # calibrates (nothing is timed before the sweep); workers > 1 start their own kernels
    warming = prewarm(sweep, out / "sweep", WARM_UP.format(model=model_name, dtype=p.get("dtype", "auto")),
                      fresh=fresh) if workers == 1 else None
    # lazy, as above: torch, transformers and the engine load while the kernel starts
    from npumoe_lab.core.cpu_features import resolve_dtype
    from npumoe_lab.models import load_model, model_fingerprint
    from npumoe_lab.devices import as_platform
    from npumoe_lab.planning.knobs import PlanKnobs
    from npumoe_lab.planning.plan import variant_plan
    from npumoe_lab.planning.variants import VARIANTS
    from npumoe_lab.execution.calibrate import calibration_profile
    from npumoe_lab.experiments.runner import PLAN_KNOBS
    from npumoe_lab.results.store import load_results
    # the simulated rows are redrawn below; last run's must not mix into the sweep's figures (make_all_figures(out))
    shutil.rmtree(out / "paper-scale", ignore_errors=True)
    # the cells' dtype (05_baselines: nb.load(model, dtype)), so their calibration and plans are these
    model, tok = load_model(model_name, dtype=resolve_dtype(p.get("dtype", "auto")))
    print(f"[demo] calibrating {model_name} ({p.get('calib_workload', 'mixed')}, "
          f"{p.get('calib_tokens', 8192)} tokens) and building plans ...", flush=True)
    saved_plans = {}
    for c in chunks:
        # the runner's cached calibration: the sweep's cells load this very profile instead of recalibrating
        prof = calibration_profile(model, tok, p.get("calib_workload", "mixed"), c, p.get("calib_tokens", 8192),
                                   p.get("seed", 0))
        prof.save(out / "profiles" / f"chunk{c}")
        (out / "profiles" / f"chunk{c}" / "summary.txt").write_text(prof.summary().to_string(index=False) + "\n")
        knobs = PlanKnobs.given({k: p.get(k) for k in PLAN_KNOBS})
        for plat in [x.strip() for x in str(p.get("platforms", "cpu,m2-max")).split(",") if x.strip()]:
            platform = as_platform(plat)
            for v in [v for v in VARIANTS.values() if v.experts == "plan"]:
                # exactly the plan run_experiment builds for the sweep's cells (same function, same knobs)
                plan = variant_plan(prof, v.name, model, platform, knobs)
                plan.save(out / "plans" / f"{v.name}-{plat}-chunk{c}.json")
                saved_plans[plan.hash] = f"{v.name}-{plat}-chunk{c}.json"
    _archive_stale_sweep(out / "sweep", model_fingerprint(model))
    del model
    if warming is not None:
        warming.join()
    stages = {"imports, model load, calibration and plans": time.time() - t0}
    print(f"[demo] running the sweep {sweep} ({len(spec.cells())} cells) ...", flush=True)
    report = run_sweep(sweep, out / "sweep", workers=workers, fresh=fresh)
    stages["sweep"] = time.time() - t0 - sum(stages.values())
    print(report.summary(), flush=True)
    if not report.ok and not report.done and not report.skipped:
        raise NpuMoeError(f"every cell of the demo sweep failed; see {out / 'sweep' / 'cells'}/*/executed.ipynb")
    # the sweep's figures and the paper-scale simulation share nothing and are each single-threaded: side by side
    # in two processes (after the sweep, whose measured rows need a quiet host); a fresh interpreter, not a fork
    # of this torch process
    accuracy = DEMO_ACCURACY if accuracy is None else accuracy
    curve = start_accuracy_curve(out, accuracy)
    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
        simulated = pool.submit(paper_scale_section, out)
        print("[demo] drawing figures ...", flush=True)
        figs = draw_figures(out)
        df = load_results(out / "sweep")
        stages["figures"] = time.time() - t0 - sum(stages.values())
        paper_scale, paper_figs = simulated.result()
    figs += paper_figs
    stages["paper-scale simulation (beside the figures)"] = time.time() - t0 - sum(stages.values())
    accuracy_md = accuracy_section(out, curve, accuracy)
    stages[f"accuracy curve, n = {accuracy.get('n')} (beside the figures)"] = time.time() - t0 - sum(stages.values())
    sources = {"model": f"`{model_name}`" + (" (the bundled data/models/npumoe-tiny)" if model_name == "tiny" else ""),
               "sweep": f"`{Path(sweep).relative_to(REPO_ROOT) if Path(sweep).is_relative_to(REPO_ROOT) else sweep}`"
                        f" -> `{out / 'sweep'}` ({len(report.done) + len(report.skipped)} cells ok, "
                        f"{len(report.failed)} failed)",
               "sweep parameters": "`" + yaml.safe_dump({**spec.parameters, **spec.grid}, default_flow_style=True,
                                                         width=400).strip() + "`",
               "calibration profiles / plans": f"`{out / 'profiles'}`, `{out / 'plans'}` (the plan of every "
                                               "plan-based variant and platform, built as `run_experiment` builds it)",
               "plans used by the sweep": _plan_check(df, saved_plans),
               "figures": f"`{out / 'figures'}` ({len(figs) if figs is not None else 0} files)",
               "host": df["host"].iloc[0] if "host" in df else "?",
               "git commit": df["git_commit"].iloc[0] if "git_commit" in df else "?",
               "wall time of the demo": f"{time.time() - t0:.0f} s (" + ", ".join(
                   f"{k} {v:.1f} s" for k, v in stages.items()) + "; measured on this host)"}
    path = out / "SUMMARY.md"
    pngs = sorted(p.name for p in figs if p.suffix == ".png")
    path.write_text(summary_markdown(df, sources) + "\n" + accuracy_md + "\n" + paper_scale + "\n## Figures (`figures/`, PNG + PDF)\n\n"
                    + "\n".join(f"- `{n}`: {FIGURE_NOTES.get(n.split('.')[0].split('-')[0], '')}" for n in pngs)
                    + "\n")
    print(f"[demo] done in {time.time() - t0:.0f} s ({sources['wall time of the demo'].split('(', 1)[1]}: {path}",
          flush=True)
    if not report.ok:
        raise NpuMoeError(f"{len(report.failed)} sweep cell(s) failed (the summary covers the others); see "
                          f"{out / 'sweep' / 'cells'}/<cell>/executed.ipynb and re-run to retry them")
    return path
