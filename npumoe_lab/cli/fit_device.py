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
    p.add_argument("--pool", action="store_true",
                   help="--platform A,B (chips of one ANE generation): fit them jointly, the generation's compute and "
                        "per-call terms shared, each chip's bandwidth and CPU terms its own (devices/fit_pooled.py)")
    p.add_argument("--include-busy", action="store_true",
                   help="cpu platform: fit on rows flagged host_busy too (a busy host; the fit file says so)")
    p.set_defaults(func=_cli)


def _cli(a) -> int:
    # lazy: numpy, emcee and the platform files load only when the command runs (`--help` stays fast)
    from pathlib import Path
    from npumoe_lab.devices.cpu_fit import fit_cli
    from npumoe_lab.devices.fit import fit_platform
    from npumoe_lab.devices.measurements import load_measurements
    from npumoe_lab.devices.platform import resolve_platform
    if a.steps < 30:
        raise NpuMoeError(f"--steps {a.steps} is too few for a posterior; use at least 30 (default 30000)")
    if a.pool:
        from npumoe_lab.devices.fit_pooled import fit_pool      # lazy as above
        plats = [resolve_platform(x.strip()) for x in a.platform.split(",") if x.strip()]
        if len(plats) < 2:
            raise NpuMoeError(f"--pool needs two or more platforms in --platform (a comma list), got {a.platform!r}")
        results = fit_pool(plats, load_measurements(a.measurements), steps=a.steps, walkers=a.walkers, seed=a.seed)
        for plat, res in zip(plats, results):
            _say(plat, res, Path(a.out))
        return 0
    platform = resolve_platform(a.platform)
    if platform.kind == "measured":     # this host: its op-level model is fitted on `measure` rows (cpu_fit.py)
        from npumoe_lab.core.cpu_features import dtype_name, resolve_dtype   # lazy: torch, only for the cpu fit
        a.primary_dtype = dtype_name(resolve_dtype("auto"))     # host_model and the roofline: this CPU's fast dtype
        return fit_cli(a)
    res = fit_platform(platform, load_measurements(a.measurements), steps=a.steps, walkers=a.walkers, seed=a.seed)
    _say(platform, res, Path(a.out))
    return 0


def _say(platform, res, out) -> None:
    """One fitted platform's summary (errors on its fit rows, sampler health, transfer sigma, values and flags),
    printed before its fit file is written to `out`."""
    import numpy as np      # lazy: see _cli
    from npumoe_lab.devices.fit import parameter_flags      # lazy: see _cli
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
                                                                                               res.point))) +
          "".join(f"\n  FLAGGED {n}: {', '.join(fl)}" for n, fl in parameter_flags(platform, res).items()),
          flush=True)
    from npumoe_lab.devices.fit import fit_file      # lazy: see _cli
    name, text = fit_file(platform, res)
    print(f"written {_write(out / name, text)}")


def _write(path, text: str):
    """The fit file, after its table is printed: a full disk names it, leaves nothing behind, exits 2."""
    from npumoe_lab.cli.output import writes  # lazy: the command loads only what it runs
    from npumoe_lab.results.atomic import write_text  # lazy: the command loads only what it runs
    with writes(path.parent, "the fitted values are printed above"):
        return write_text(path, text)
