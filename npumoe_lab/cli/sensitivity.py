"""`npumoe-lab sensitivity`: the simulation rerun at every sourced alternative of the uncertain device parameters;
which conclusions each one flips."""
from __future__ import annotations

from pathlib import Path

from npumoe_lab.cli.output import save_png, writes


def _sensitivity(a) -> int:
    # lazy: pandas, torch and matplotlib load only when the command runs (`--help` stays fast)
    from npumoe_lab.results.store import write_rows
    from npumoe_lab.sim.figures import tornado
    from npumoe_lab.viz import figcheck
    from npumoe_lab.sim.sensitivity import report, run_sensitivity
    res = run_sensitivity(a.geometry, a.platform, a.routing, a.prompt_len, a.chunk, a.weights, a.seed)
    out = Path(a.out)
    text = (f"# Sensitivity of the modeled conclusions: {a.geometry} on {a.platform}, prompt {a.prompt_len}, chunk "
            f"{a.chunk}, routing {a.routing} (every number modeled)\n\n" + report(res) + "\n")
    print(text, flush=True)                  # first: a full disk cannot lose the report
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
    p.add_argument("--platform", default="m2-max", help="one modeled platform (default m2-max)")
    p.add_argument("--routing", default="synthetic:gini=0.6", help="routing source, as in `npumoe-lab simulate`")
    p.add_argument("--prompt-len", type=int, default=1024, help="prompt tokens (default 1024)")
    p.add_argument("--chunk", type=int, default=512, help="prefill chunk in tokens (default 512)")
    p.add_argument("--weights", default="fp16", choices=("fp16", "int8"), help="NPU weight storage (default fp16)")
    p.add_argument("--seed", type=int, default=0, help="seed of the sampled routing (default 0)")
    p.add_argument("--out", default="results/sensitivity", help="folder (default results/sensitivity)")
    p.set_defaults(func=_sensitivity)
