"""`npumoe-lab fit-device`: fit a platform's declared free parameters on its chip's micro-benchmark rows."""
from __future__ import annotations

from npumoe_lab.errors import NpuMoeError


def register_cli(sub) -> None:
    p = sub.add_parser("fit-device", help="fit a platform's declared free parameters on its chip's "
                                          "micro-benchmark rows (least squares + emcee posterior)")
    p.add_argument("--platform", required=True, help="platform name, YAML path, or spec with [overrides]")
    p.add_argument("--measurements", default="data/measurements", help="measurement YAML or folder")
    p.add_argument("--out", required=True, help="folder for <platform>-fit.yaml")
    p.add_argument("--steps", type=int, default=30000, help="emcee steps per walker (the first third is burn-in)")
    p.add_argument("--walkers", type=int, default=0, help="emcee walkers (0: 4 x dimensions, at least 32)")
    p.add_argument("--seed", type=int, default=0, help="seed of the emcee walkers (default 0)")
    p.add_argument("--include-busy", action="store_true",
                   help="cpu platform: fit on rows flagged host_busy too (a busy host; the fit file says so)")
    p.set_defaults(func=_cli)


def _cli(a) -> int:
    # lazy: numpy, emcee and the platform files load only when the command runs (`--help` stays fast)
    from pathlib import Path
    import numpy as np
    from npumoe_lab.devices.fit import fit_file, fit_platform
    from npumoe_lab.devices.measurements import load_measurements
    from npumoe_lab.devices.platform import resolve_platform
    if a.steps < 30:
        raise NpuMoeError(f"--steps {a.steps} is too few for a posterior; use at least 30 (default 30000)")
    platform = resolve_platform(a.platform)
    if platform.kind == "measured":     # this host: its op-level model is fitted on `measure` rows (cpu_fit.py)
        return _host_fit(a)
    res = fit_platform(platform, load_measurements(a.measurements), steps=a.steps, walkers=a.walkers, seed=a.seed)
    err = np.abs(np.expm1(res.point_residuals))
    moved = len(res.transferred[1]) if res.transferred else 0
    print(f"fitted {len(res.names) - moved} parameters"
          f"{f' (+{moved} transferred from {res.transferred[0].name})' if moved else ''} of {platform.name} on "
          f"{len(res.rows.ids)} fit rows of "
          f"{platform.chip}: median |error| {np.median(err):.1%}, worst {err.max():.1%} (modeled vs measured); "
          f"emcee acceptance {res.acceptance:.2f}, kept steps / autocorrelation time {(res.n_steps - res.burn) / res.tau:.0f}"
          f"{' (under 50: run more --steps)' if (res.n_steps - res.burn) / res.tau < 50 else ''}; transfer sigma "
          f"(log error on kinds of work the fit rows lack) "
          f"{'none' if res.transfer_sigma is None else f'{res.transfer_sigma:.3f}'}\n" +
          "\n".join(f"  {n} = {v:.4g}  (90 % {np.percentile(res.draws[:, i], 5):.3g}-"
                    f"{np.percentile(res.draws[:, i], 95):.3g})" for i, (n, v) in enumerate(zip(res.names,
                                                                                               res.point))),
          flush=True)
    name, text = fit_file(platform, res)
    print(f"written {_write(Path(a.out) / name, text)}")
    return 0


def _write(path, text: str):
    """The fit file, after its table is printed: a full disk names it, leaves nothing behind, exits 2."""
    from npumoe_lab.cli.output import writes  # lazy: the command loads only what it runs
    from npumoe_lab.results.atomic import write_text  # lazy: the command loads only what it runs
    with writes(path.parent, "the fitted values are printed above"):
        return write_text(path, text)


def _host_fit(a) -> int:
    """`fit-device --platform cpu`: this host's op-level model fitted on `measure` rows (devices/cpu_fit.py)."""
    from pathlib import Path
    from npumoe_lab.devices.cpu_fit import FIT_FILE, fit_host, write_fit  # lazy: the command loads only what it runs
    from npumoe_lab.devices.measurements import load_measurements  # lazy: the command loads only what it runs
    res = fit_host(load_measurements(a.measurements), str(a.measurements), include_busy=a.include_busy)
    print(f"fitted {len(res['free'])} parameters of the cpu host model on {len(res['rows_used'])} fit rows of "
          f"{res['chip']} ({res['n_busy_skipped']} host_busy rows skipped, {res['n_busy_used']} used): median |error| "
          f"{res['median_abs_err']:.1%}, worst {res['worst_abs_err']:.1%} (modeled vs measured)\n" +
          "\n".join(f"  {k} = {res['params'][k]:.4g}  (90 % {res['intervals'][k][0]:.3g}-{res['intervals'][k][1]:.3g})"
                    for k in res["free"]), flush=True)
    print(f"written {_write(Path(a.out) / FIT_FILE, write_fit(res, None, str(a.measurements)))}")
    return 0
