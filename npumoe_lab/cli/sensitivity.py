"""`npumoe-lab sensitivity`: the simulation rerun at every sourced alternative of the uncertain device parameters;
which conclusions each one flips."""
from __future__ import annotations

from pathlib import Path

from npumoe_lab.cli.common import list_help, over_cells, terminal_text
from npumoe_lab.cli.output import save_png, writes


def _per_platform(a, run_one) -> tuple:
    """(platform specs of --platform, effects, probabilities): `run_one(spec)` -> (effects, probs) per platform."""
    import pandas as pd      # lazy: see _morris
    specs = [x.strip() for x in a.platform.split(",") if x.strip()]
    parts = [run_one(spec) for spec in specs]
    return (specs, pd.concat([e for e, _ in parts], ignore_index=True),
            pd.concat([p for _, p in parts], ignore_index=True))


def _morris(a) -> int:
    # lazy: pandas, SALib and torch load only when the command runs (`--help` stays fast)
    from npumoe_lab.sim.global_sensitivity import report as global_report, run_global
    specs, effects, probs = _per_platform(a, lambda spec: run_global(
        spec, a.geometry, a.routing, a.prompt_len, a.chunk, a.weights, a.trajectories, seed=a.seed))
    out = Path(a.out)
    text = (f"# Global sensitivity of the modeled conclusions: {a.geometry}, prompt {a.prompt_len}, chunk {a.chunk}, "
            f"routing {a.routing}; platforms {', '.join(specs)} (every number modeled; SALib Morris, "
            f"{a.trajectories} trajectories)\n\n" + global_report(effects, probs) + "\n")
    print(terminal_text(text), flush=True)    # first: a full disk cannot lose the report (the file keeps it whole)
    with writes(out, "the report is printed above"):
        out.mkdir(parents=True, exist_ok=True)
        effects.assign(timing_source="modeled").to_csv(out / "sensitivity_effects.csv", index=False)
        probs.assign(timing_source="modeled").to_csv(out / "sensitivity_probabilities.csv", index=False)
        (out / "SENSITIVITY.md").write_text(text)
    print(f"written to {out} (SENSITIVITY.md, sensitivity_effects.csv, sensitivity_probabilities.csv)")
    return 0


def _sobol(a) -> int:
    # lazy: pandas, SALib and torch load only when the command runs (`--help` stays fast)
    from npumoe_lab.sim.global_sensitivity import run_sobol, sobol_report
    specs, effects, probs = _per_platform(a, lambda spec: run_sobol(
        spec, a.geometry, a.routing, a.prompt_len, a.chunk, a.weights, a.sobol_n, seed=a.seed))
    out = Path(a.out)
    text = (f"# Sobol sensitivity of the modeled conclusions: {a.geometry}, prompt {a.prompt_len}, chunk {a.chunk}, "
            f"routing {a.routing}; platforms {', '.join(specs)} (every number modeled; SALib Sobol, Saltelli N = "
            f"{a.sobol_n}, over each platform's draws: posterior, prior for the rest, predictive noise)\n\n"
            + sobol_report(effects, probs) + "\n")
    print(terminal_text(text), flush=True)    # first: a full disk cannot lose the report (the file keeps it whole)
    with writes(out, "the report is printed above"):
        out.mkdir(parents=True, exist_ok=True)
        effects.assign(timing_source="modeled").to_csv(out / "sensitivity_effects.csv", index=False)
        probs.assign(timing_source="modeled").to_csv(out / "sensitivity_probabilities.csv", index=False)
        (out / "SENSITIVITY.md").write_text(text)
    print(f"written to {out} (SENSITIVITY.md, sensitivity_effects.csv, sensitivity_probabilities.csv)")
    return 0


def _sensitivity(a) -> int:
    if a.method == "morris":
        return _morris(a)
    if a.method == "sobol":
        return _sobol(a)
    # lazy: pandas, torch and matplotlib load only when the command runs (`--help` stays fast)
    from npumoe_lab.results.store import write_rows
    from npumoe_lab.sim.figures import tornado
    from npumoe_lab.viz import figcheck
    from npumoe_lab.sim.sensitivity import report, run_sensitivity
    res = run_sensitivity(a.geometry, a.platform, a.routing, a.prompt_len, a.chunk, a.weights, a.seed, a.draws)
    out = Path(a.out)
    text = (f"# Sensitivity of the modeled conclusions: {a.geometry} on {a.platform}, prompt {a.prompt_len}, chunk "
            f"{a.chunk}, routing {a.routing} (every number modeled)\n\n" + report(res) + "\n")
    print(terminal_text(text), flush=True)    # first: a full disk cannot lose the report (the file keeps it whole)
    with writes(out, "the report is printed above"):
        write_rows(res.rename(columns={"geometry": "model"}).assign(workload=a.routing.split(":")[0],
                                                                     variant="npumoe", repeat=0), out, "sensitivity")
        (out / "SENSITIVITY.md").write_text(text)
        for i, (conclusion, g) in enumerate(res.groupby("conclusion", sort=False)):
            fig = tornado(g, conclusion)
            figcheck.record(f"tornado-{i}", fig)
            save_png(fig, out / f"tornado-{i}.png")
    print(f"written to {out} (SENSITIVITY.md, sensitivity.parquet, tornado-*.png)")
    return 0


def register_cli(sub) -> None:
    p = sub.add_parser("sensitivity", help="rerun a simulation at every sourced alternative of the uncertain device "
                                           "parameters; list the conclusions each one flips")
    p.add_argument("--geometry", default="qwen3-30b-a3b", help="a bundled geometry or a config.json (default "
                                                               "qwen3-30b-a3b)")
    p.add_argument("--platform", default="m2-max",
                   help="modeled platform(s): names or platform YAMLs (e.g. a fit); a comma list = side by side "
                        "(morris only; default m2-max)")
    p.add_argument("--method", default="morris", choices=["morris", "sobol", "oat"],
                   help="morris (default): every parameter, high-confidence ones too, and the NPU cost structures "
                        "moved globally (SALib), P(holds) per conclusion; sobol: SALib Sobol S1 / ST over the "
                        "platform's draws (paper-check's claims machinery) and the measurement that would settle "
                        "each conclusion; oat: one sourced alternative at a time")
    p.add_argument("--sobol-n", type=int, default=128, help="sobol: Saltelli base sample N (a power of two)")
    p.add_argument("--trajectories", type=int, default=4, help="Morris trajectories (points = r x (factors + 1))")
    p.add_argument("--routing", default="synthetic:gini=0.6", help="routing source, as in `npumoe-lab simulate`")
    p.add_argument("--prompt-len", default="1024", help=list_help("prompt tokens", 1024))
    p.add_argument("--chunk", default="512", help=list_help("prefill chunk in tokens", 512))
    p.add_argument("--weights", default="fp16", choices=("fp16", "int8"), help="NPU weight storage (default fp16)")
    p.add_argument("--seed", type=int, default=0, help="seed of the sampled routing (default 0)")
    p.add_argument("--draws", type=int, default=200,
                   help="oat: parameter draws for the probability each conclusion holds (the platform's posterior, else a prior from its sourced alternatives; 0: none; "
                        "default 200)")
    p.add_argument("--out", default="results/sensitivity", help="folder (default results/sensitivity)")
    p.set_defaults(func=lambda a: over_cells(_sensitivity, a, {"prompt_len": "--prompt-len", "chunk": "--chunk"}))
