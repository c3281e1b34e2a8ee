"""`fit-device`: fit a platform's declared free parameters on its chip's micro-benchmark rows.

The platform YAML declares what is free (`fit: [{param: npu_graph_peak_flops, low: .., high: ..}, ...]`, log-uniform
priors on [low, high]). Only rows with the platform's `chip` and role `fit` are used (whole-model rows are
validate-only by the loader's rule). A platform with the graph-level NPU parameters is fitted with that structure
(graph_cost.py; the written YAML has `graph_model` on); one without them with its own structure.

- Point: least squares on log(predicted / measured) over log-parameters within the bounds (scipy least_squares,
  several starts: the sourced values and seeded random points in the box); power rows compare the modeled power
  of their work (floor + (active - floor) x utilisation, graph_cost.call_power) with the measured watts. Rows of
  confidence L count with twice the noise (CONF_SIGMA).
- Posterior: emcee (affine-invariant ensemble) over the log-parameters plus a log-noise sigma (the model's error
  in log time, log-uniform on [0.01, 2]); likelihood normal in log(predicted / measured). Draws are kept so that
  others can sample parameters (`Platform.posterior`; price.with_draws).
Output: `OUT/<name>-fit.yaml`, a full platform YAML (sourced values kept; fitted ones marked `fitted on rows
[...]`, with 5/50/95 % intervals) with `npu.graph_model` on and a `posterior:` block.
"""
from __future__ import annotations

import argparse
import datetime as dt
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import yaml

from npumoe_lab.errors import NpuMoeError
from npumoe_lab.utils import progress
from npumoe_lab.devices.cpu_fit import fit_cli
from npumoe_lab.devices.measurements import load_measurements
from npumoe_lab.devices.platform import resolve_platform
from npumoe_lab.devices.price import op_columns, platform_params, power, price, with_draws
from npumoe_lab.devices.workload import row_op

SIGMA_BOUNDS = (0.01, 2.0)


CONF_SIGMA = {"H": 1.0, "M": 1.0, "L": 2.0}      # a row's noise in units of sigma: L rows count half as much


@dataclass(frozen=True)
class RowSet:
    """Measurement rows ready for vectorised pricing: op columns of every row, and which rows measure power."""
    ids: tuple
    ops: dict                   # op_columns of every row (power rows: the work that ran while power was read)
    measured: np.ndarray        # seconds, or watts for power rows
    is_power: np.ndarray        # bool (N,)
    weight: np.ndarray          # 1 / CONF_SIGMA of each row's confidence

    @staticmethod
    def of(df) -> "RowSet":
        ops = op_columns([(r.device, row_op(r)) for r in df.itertuples()], paths=list(df.path))
        is_power = df.measured_s.isna().to_numpy()
        measured = np.where(is_power, df.power_w.to_numpy(float), df.measured_s.to_numpy(float))
        return RowSet(tuple(df.id), ops, measured, is_power,
                      np.array([1.0 / CONF_SIGMA[c] for c in df.confidence]))

    def predicted(self, params: dict) -> np.ndarray:
        """Modeled seconds or watts (D, rows)."""
        t = price(params, self.ops)
        return np.where(self.is_power, power(params, self.ops, t), t) if self.is_power.any() else t

    def log_residuals(self, params: dict) -> np.ndarray:
        """log(predicted / measured) (D, rows) in the order of `ids`."""
        return np.log(self.predicted(params) / self.measured)


def fit_rows(df, platform):
    """The platform chip's fit rows."""
    rows = df[(df.chip == platform.chip) & (df.role == "fit")]
    return rows.reset_index(drop=True)


GRAPH_NEEDS = ("graph_peak_flops", "attention_flops", "decompress_params_s")


def fits_graph_structure(platform) -> bool:
    """A platform whose NPU role has the graph-level parameters is fitted with that structure (graph_model 1);
    one without them (e.g. the host's `cpu` platform before it gains them) with its own structure."""
    return all(getattr(platform.npu, k) is not None for k in GRAPH_NEEDS)


def _base_params(platform) -> dict:
    base = platform_params(platform)
    if fits_graph_structure(platform):
        base["npu_graph_model"] = np.array([1.0])
    return base


@dataclass
class FitResult:
    names: list
    point: np.ndarray           # (P,) fitted values (linear units)
    draws: np.ndarray           # (S, P) posterior draws
    sigma: np.ndarray           # (S,) posterior draws of the log-noise sigma
    rows: RowSet
    point_residuals: np.ndarray
    acceptance: float
    tau: float                  # largest integrated autocorrelation time over the parameters (steps)
    n_walkers: int
    n_steps: int
    burn: int


def fit_platform(platform, df, steps: int = 8000, walkers: int = 0, seed: int = 0, starts: int = 8) -> FitResult:
    """Least squares point and emcee posterior of the platform's `fit:` parameters on its chip's fit rows."""
    import logging

    import emcee
    from scipy.optimize import least_squares
    logging.getLogger("emcee").setLevel(logging.ERROR)   # its short-chain warning: we report steps / tau ourselves
    if not platform.fit:
        raise NpuMoeError(f"platform {platform.name!r} declares no free parameters; add a fit: list of "
                          "{param, low, high} to its YAML (see m2-max.yaml)")
    rows = fit_rows(df, platform)
    names = [f["param"] for f in platform.fit]
    if len(rows) < len(names):
        raise NpuMoeError(f"platform {platform.name!r} (chip {platform.chip}) has {len(rows)} fit rows for "
                          f"{len(names)} free parameters; add fit rows for this chip or declare fewer parameters")
    lo = np.log([f["low"] for f in platform.fit])
    hi = np.log([f["high"] for f in platform.fit])
    rs, base = RowSet.of(rows), _base_params(platform)

    def resid(x):                                   # x: (D, P) log-parameters -> (D, rows), confidence-weighted
        return rs.log_residuals(with_draws(base, names, np.exp(x))) * rs.weight

    rng = np.random.default_rng(seed)
    x_src = np.clip(np.log([float(np.ravel(base[n])[0]) for n in names]), lo + 1e-9, hi - 1e-9)
    x0s = [x_src] + [lo + (hi - lo) * rng.uniform(0.05, 0.95, len(names)) for _ in range(starts)]
    best = min((least_squares(lambda x: resid(x[None, :])[0], x0, bounds=(lo, hi), x_scale="jac")
                for x0 in x0s), key=lambda r: r.cost)
    ndim = len(names) + 1
    nw = walkers or max(4 * ndim, 32)
    nw += nw % 2
    r0 = resid(best.x[None, :])[0]
    s0 = float(np.clip(np.sqrt(np.mean(r0 ** 2)), SIGMA_BOUNDS[0] * 1.5, SIGMA_BOUNDS[1] / 1.5))
    slo, shi = np.log(SIGMA_BOUNDS)

    def log_prob(theta):                            # (W, P+1), vectorised over walkers
        x, ls = theta[:, :-1], theta[:, -1]
        inside = np.all((x > lo) & (x < hi), axis=1) & (ls > slo) & (ls < shi)
        xs = np.where(inside[:, None], x, best.x)
        r = resid(xs)
        lp = -0.5 * np.sum(r ** 2, axis=1) / np.exp(2 * ls) - r.shape[1] * ls   # r already weighted
        return np.where(inside, lp, -np.inf)

    start = np.column_stack([best.x + 1e-3 * (hi - lo) * rng.standard_normal((nw, len(names))),
                             np.log(s0) + 1e-2 * rng.standard_normal(nw)])
    start[:, :-1] = np.clip(start[:, :-1], lo + 1e-9, hi - 1e-9)
    sampler = emcee.EnsembleSampler(nw, ndim, log_prob, vectorize=True,
                                    moves=[(emcee.moves.DEMove(), 0.8), (emcee.moves.DESnookerMove(), 0.2)])
    sampler.random_state = np.random.RandomState(seed).get_state()
    for _ in progress(sampler.sample(start, iterations=steps), total=steps, desc=f"fit {platform.name}"):
        pass
    burn = steps // 3
    tau = float(np.nanmax(sampler.get_autocorr_time(discard=burn, quiet=True)))
    chain = sampler.get_chain(discard=burn, flat=True)
    keep = chain[np.random.default_rng(seed).choice(len(chain), size=min(400, len(chain)), replace=False)]
    return FitResult(names, np.exp(best.x), np.exp(keep[:, :-1]), np.exp(keep[:, -1]), rs, r0 / rs.weight,
                     float(np.mean(sampler.acceptance_fraction)), tau, nw, steps, burn)


def _sig(v: float) -> float:
    return float(f"{v:.5g}")


def fitted_yaml(platform, res: FitResult, today: str) -> dict:
    """A full platform YAML: the platform's parameters, the fitted ones replaced and marked, graph model on."""
    p = platform.params
    name = f"{platform.name}-fit"
    ids = list(res.rows.ids)
    doc = {"name": name, "description": f"{platform.description} -- free parameters fitted by fit-device on "
                                       f"{len(ids)} micro-benchmark rows of {platform.chip} ({today})",
           "kind": p["kind"], "chip": platform.chip, "npu_shares_cpu": p["npu_shares_cpu"],
           "assumptions": list(p.get("assumptions", [])) + [
               "Fitted by fit-device (devices/fit.py); fitted values are marked in their source."],
           "npu": {k: dict(v) for k, v in p["npu"].items()}, "cpu": {k: dict(v) for k, v in p["cpu"].items()}}
    if fits_graph_structure(platform):
        doc["npu"]["graph_model"] = {**doc["npu"].get("graph_model", {"unit": "flag", "note": "0 roofline, 1 graph"}),
                                     "value": 1, "source": "fit-device: the graph-level structure (the one fitted)",
                                     "confidence": "M"}
    for i, knob in enumerate(res.names):
        role, _, key = knob.partition("_")
        entry = doc[role][key]
        q5, q50, q95 = (np.percentile(res.draws[:, i], q) for q in (5, 50, 95))
        prior = next(f for f in platform.fit if f["param"] == knob)
        entry.update(
            value=_sig(res.point[i]), confidence="M",
            source=f"fitted on rows [{', '.join(ids)}] (fit-device {today}: least squares on log time; emcee "
                   f"posterior)",
            note=f"was {entry['value']!r} ({entry['source']}); 90 % interval {_sig(q5)}-{_sig(q95)} {entry['unit']}; "
                 f"prior log-uniform [{prior['low']:g}, {prior['high']:g}]",
            interval={"p5": _sig(q5), "p50": _sig(q50), "p95": _sig(q95)})
    doc["fit"] = [dict(f) for f in platform.fit]
    doc["posterior"] = {
        "method": "emcee EnsembleSampler (DE 0.8 + DE-snooker 0.2) over log-parameters and a log-noise sigma; "
                  "likelihood normal in log(predicted/measured time or power)",
        "rows": ids, "params": list(res.names), "n_walkers": res.n_walkers, "n_steps": res.n_steps,
        "burn": res.burn, "acceptance": round(res.acceptance, 3), "autocorr_steps_max": round(res.tau, 1),
        "kept_steps_over_autocorr": round((res.n_steps - res.burn) / res.tau, 1),
        "point_median_abs_error": round(float(np.median(np.abs(np.expm1(res.point_residuals)))), 4),
        "draws": [[_sig(v) for v in d] for d in res.draws], "sigma_log": [_sig(s) for s in res.sigma]}
    return doc


def write_fit(platform, res: FitResult, out: Path) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{platform.name}-fit.yaml"
    doc = fitted_yaml(platform, res, dt.date.today().isoformat())
    text = yaml.safe_dump(doc, sort_keys=False, width=120, default_flow_style=None)
    path.write_text(f"# Written by `npumoe-lab fit-device --platform {platform.source}` ({len(res.rows.ids)} fit "
                    f"rows). Fitted values are marked in their source.\n" + text)
    return path


def register_cli(sub) -> None:
    p = sub.add_parser("fit-device", help="fit a platform's declared free parameters on its chip's "
                                          "micro-benchmark rows (least squares + emcee posterior)")
    p.add_argument("--platform", required=True, help="platform name, YAML path, or spec with [overrides]")
    p.add_argument("--measurements", default="data/measurements", help="measurement YAML or folder")
    p.add_argument("--out", required=True, help="folder for <platform>-fit.yaml")
    p.add_argument("--steps", type=int, default=8000, help="emcee steps per walker (the first third is burn-in)")
    p.add_argument("--walkers", type=int, default=0, help="emcee walkers (0: 4 x dimensions, at least 32)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--include-busy", action="store_true",
                   help="cpu platform: fit on rows flagged host_busy too (a busy host; the fit file says so)")
    p.set_defaults(func=_cli)


def _cli(a: argparse.Namespace) -> int:
    if a.steps < 30:
        raise NpuMoeError(f"--steps {a.steps} is too few for a posterior; use at least 30 (default 8000)")
    platform = resolve_platform(a.platform)
    if platform.kind == "measured":     # this host: its op-level model is fitted on `measure` rows (cpu_fit.py)
        return fit_cli(a)
    res = fit_platform(platform, load_measurements(a.measurements), steps=a.steps, walkers=a.walkers, seed=a.seed)
    path = write_fit(platform, res, Path(a.out))
    err = np.abs(np.expm1(res.point_residuals))
    print(f"fitted {len(res.names)} parameters of {platform.name} on {len(res.rows.ids)} fit rows of "
          f"{platform.chip}: median |error| {np.median(err):.1%}, worst {err.max():.1%} (modeled vs measured); "
          f"emcee acceptance {res.acceptance:.2f}, kept steps / autocorrelation time {(res.n_steps - res.burn) / res.tau:.0f}"
          f"{' (under 50: run more --steps)' if (res.n_steps - res.burn) / res.tau < 50 else ''}\n" +
          "\n".join(f"  {n} = {v:.4g}  (90 % {np.percentile(res.draws[:, i], 5):.3g}-"
                    f"{np.percentile(res.draws[:, i], 95):.3g})" for i, (n, v) in enumerate(zip(res.names,
                                                                                               res.point))) +
          f"\nwritten {path}")
    return 0


__all__ = ["fit_platform", "fit_rows", "write_fit", "fitted_yaml", "RowSet", "FitResult", "register_cli",
           "SIGMA_BOUNDS"]
