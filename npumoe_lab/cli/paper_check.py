"""`npumoe-lab paper-check`: the device model against every number of the paper's results it can predict."""
from __future__ import annotations

import time
from pathlib import Path

from npumoe_lab.cli.decode_flags import add_decode_arguments, check_decode_args
from npumoe_lab.cli.output import save_png, writes


def _paper_check(a) -> int:
    # lazy: pandas, torch and matplotlib load only when the command runs (`--help` stays fast)
    import pandas as pd
    from npumoe_lab.results.store import write_rows
    from npumoe_lab.sim.figures import paper_check_figure
    from npumoe_lab.sim.claim_sobol import sobol_lines
    from npumoe_lab.sim.papercheck import GRID, fitted_platforms, markdown, paper_check, side_by_side
    from npumoe_lab.sim.papercheck_e2e import e2e_markdown, e2e_table
    from npumoe_lab.viz import figcheck
    check_decode_args(a)
    t0 = time.perf_counter()
    from npumoe_lab.sim.operating_point import both_points_markdown, chosen_percentiles   # lazy: pandas, as above
    fits = fitted_platforms(GRID["platforms"], a.fitted) if a.fitted else {}
    sobol = a.sobol if a.draws else 0
    dec = dict(decode_tokens=a.decode_tokens, decode_policy=a.decode_policy, with_metrics=True)
    points = ("default", "paper") if a.operating_point == "both" else (a.operating_point,)
    tables, grids, mets = {}, {}, {}
    for i, op in enumerate(points):            # the same comparison once per operating point
        tables[op], s_, grids[op], mets[op] = paper_check(a.routing, a.seed, not a.no_sensitivity and i == 0,
                                                          draws=a.draws, sobol=sobol if i == 0 else 0,
                                                          operating_point=op, **dec)
        sens = s_ if i == 0 else sens
    table, df, metrics = tables[points[0]], grids[points[0]], mets[points[0]]
    out = Path(a.out)
    text = markdown(table, sens, a.routing) + "\n".join(sobol_lines(table.attrs.get("claims_sobol", []))) + "\n"
    text += f"\n(operating point: {points[0]})\n" if len(points) == 1 else ""
    if "paper" in tables:
        text += both_points_markdown(tables, grids)
    ftable = fdf = fmetrics = None
    if fits:                   # the same check on the fitted platforms, side by side
        ftable, _, fdf, fmetrics = paper_check(a.routing, a.seed, False, platform_map=fits, draws=a.draws,
                                               sobol=sobol, **dec)
        text += side_by_side(table, ftable, fits) + "\n".join(sobol_lines(ftable.attrs.get("claims_sobol", []))) + "\n"
    etables = []                # the end-to-end table at each operating point (the fitted platforms at the first)
    for i, op in enumerate(points):
        et = e2e_table(grids[op], mets[op], fdf if i == 0 else None, fmetrics if i == 0 else None)
        text += f"\n(end to end, operating point: {op})\n" + e2e_markdown(et)
        etables.append(et.assign(operating_point=op))
    etable = pd.concat(etables, ignore_index=True)
    print(text + f"\n{len(table)} quantities in {time.perf_counter() - t0:.0f} s", flush=True)   # before any write
    with writes(out, "the table is printed above"):
        write_rows(df, out / "grid")
        if "paper" in tables:
            write_rows(grids["paper"], out / "grid-paper-point")
            tables["paper"].to_csv(out / "paper_check_paper_point.csv", index=False)
            chosen_percentiles(grids["paper"]).to_csv(out / "operating_points.csv", index=False)
        if fits:
            write_rows(fdf, out / "grid-fitted")
            ftable.to_csv(out / "paper_check_fitted.csv", index=False)
        out.mkdir(parents=True, exist_ok=True)
        (out / "PAPERCHECK.md").write_text(text)
        table.to_csv(out / "paper_check.csv", index=False)
        etable.to_csv(out / "paper_check_e2e.csv", index=False)
        fig = paper_check_figure(table)
        figcheck.record("paper-check", fig)
        save_png(fig, out / "paper_check.png")
    print(f"written to {out} (PAPERCHECK.md, paper_check.csv, paper_check_e2e.csv, paper_check.png, grid/"
          + (", operating_points.csv, paper_check_paper_point.csv, grid-paper-point/" if "paper" in tables else "")
          + ")")
    return 0


def register_cli(sub) -> None:
    p = sub.add_parser("paper-check", help="the device model against every number of the paper's results it can "
                                           "predict (table + figure), with the parameters each is sensitive to")
    p.add_argument("--routing", default="synthetic:gini=0.6",
                   help="routing source, as in `npumoe-lab simulate` (default synthetic:gini=0.6: the paper gives none)")
    p.add_argument("--seed", type=int, default=0, help="seed of the sampled routing (default 0)")
    p.add_argument("--no-sensitivity", action="store_true", help="skip the per-quantity sensitivity runs")
    p.add_argument("--fitted", default=None, help="a folder of fit-device outputs (<platform>-fit.yaml, e.g. "
                                                  "data/fits): the check is rerun on them, side by side")
    p.add_argument("--draws", type=int, default=100,
                   help="parameter draws for each quantity's 90%% interval (the platform's posterior, else a prior from its sourced alternatives; 0: none; "
                        "default 100)")
    p.add_argument("--sobol", type=int, default=128,
                   help="Saltelli base sample N of each claim's Sobol indices and its 'to settle' line (a power of "
                        "two; 0: none; default 128)")
    add_decode_arguments(p)
    p.add_argument("--operating-point", default="both", choices=("both", "default", "paper"),
                   help="both (default): the check at the shipped knobs and at the paper's drop rate (the tier "
                        "percentile solved for npumoe's 10-22%% drop; operating_points.csv says which); or one")
    p.add_argument("--out", default="results/paper-check", help="folder (default results/paper-check)")
    p.set_defaults(func=_paper_check)
