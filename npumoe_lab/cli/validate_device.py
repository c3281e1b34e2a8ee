"""`npumoe-lab validate-device`: predict every measurement row of a platform's chip (validation.csv, VALIDATION.md,
a predicted-vs-measured figure); with --runs, held-out measured runs re-priced by a host fit."""
from __future__ import annotations


def _register_device(sub) -> None:
    p = sub.add_parser("validate-device", help="predict every measurement row of a platform's chip; write "
                                               "validation.csv, VALIDATION.md and a predicted-vs-measured figure")
    p.add_argument("--platform", required=True, help="platform name, YAML path (e.g. a fit), or spec with [overrides]")
    p.add_argument("--measurements", default="data/measurements", help="measurement YAML or folder")
    p.add_argument("--out", required=True, help="folder for validation.csv, VALIDATION.md, validation.png")
    p.add_argument("--seed", type=int, default=0, help="seed of the predictive-noise draws")
    p.set_defaults(func=_validate_device)


def _validate_device(a) -> int:
    # lazy: pandas and matplotlib load only when the command runs (`--help` stays fast)
    from npumoe_lab.devices.platform import resolve_platform
    from npumoe_lab.devices.validate import figure, validate_device
    res, text = validate_device(a.platform, a.measurements, None, a.seed)
    print(text, flush=True)
    _write(a.out, res, text, figure=lambda: figure(res, resolve_platform(a.platform)))
    print(f"written to {a.out} (validation.csv, VALIDATION.md, validation.png)")
    return 0


def _write(out, res, text, figure=None) -> None:
    """validation.csv, VALIDATION.md (and the figure) after the table is printed, each atomically: a full disk
    names the file, leaves nothing behind (no 0-byte csv, no empty folder) and exits 2."""
    from pathlib import Path
    from npumoe_lab.cli.output import save_png, writes  # lazy: the command loads only what it runs
    from npumoe_lab.results.atomic import write_text  # lazy: the command loads only what it runs
    out = Path(out)
    with writes(out, "the table is printed above"):
        write_text(out / "validation.csv", res.to_csv(index=False))
        write_text(out / "VALIDATION.md", text)
        if figure is not None:
            save_png(figure(), out / "validation.png")


def register_cli(sub):
    """validate-device (devices/validate.py's parser) plus --runs: held-out measured runs re-priced by a host fit."""
    _register_device(sub)
    p = sub.choices["validate-device"]
    p.add_argument("--runs", default=None, help="a folder of `run --platform cpu --timeline` results: re-price "
                                                "every measured row's op stream with the fitted host model")
    p.add_argument("--no-speed-anchor", action="store_true",
                   help="with --runs: compare the fit's price as is, not scaled by the speed anchor's reading at the "
                        "run over the fit rows' (the default scales; the table always shows both errors)")
    p.set_defaults(func=_cli)


def _cli(a) -> int:
    # lazy: pandas and the fitted models load only when the command runs (`--help` stays fast)
    from npumoe_lab.devices.cpu_fit import is_host_fit, validate_host_rows
    from npumoe_lab.experiments.validate_runs import report, validate_runs_by_kind, write_validation
    if a.runs is not None:
        df, by_kind = validate_runs_by_kind(a.platform, a.runs, use_anchor=not a.no_speed_anchor)
        path = write_validation(df, a.out, a.platform, a.runs, by_kind)
        print(report(df, a.platform, a.runs) + f"\nwritten {path}, runs_validation.csv and runs_by_op_kind.csv "
              "(each run's modeled minus measured seconds per op kind)")
        return 0
    if is_host_fit(a.platform):      # a fitted host model prices op-level host rows
        res, text = validate_host_rows(a.platform, a.measurements)
        print(text, flush=True)
        _write(a.out, res, text)
        print(f"written to {a.out} (validation.csv, VALIDATION.md)")
        return 0
    return _validate_device(a)
