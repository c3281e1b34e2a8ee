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
- Transfer sigma (the predictive error on a kind of work the fit rows lack): leave one group of fit rows out (a
  group = device/kind, e.g. npu/gemm; power rows are never held out), refit the point by least squares from the
  SOURCED values on the rest, predict the held-out rows; the root mean square of those log errors (confidence-
  weighted as above) is `posterior.transfer_sigma_log`. Fit rows only: no validate row enters it.
  validate-device and simulations use it as the noise of work whose group is not fitted (whole forwards, runs).
- Transfer of parameters: a platform YAML may say `transfer: {platform: data/fits/<chip>-fit.yaml, params: [...],
  note: ...}`: those parameters are taken from that fit (its point, and its posterior draws paired at random with
  this fit's draws: the two data sets are disjoint), not fitted here; with fewer than two groups of its own the
  transfer sigma is that fit's too. Used for the M2 Ultra, whose Core ML path runs one model on one ANE cluster of
  the M2 Max's generation (docs/sources/DEVICE_MODEL.md §7).
Output: `OUT/<name>-fit.yaml`, a full platform YAML (sourced values kept; fitted ones marked `fitted on rows
[...]`, with 5/50/95 % intervals) with `npu.graph_model` on and a `posterior:` block.
"""
from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import yaml

from npumoe_lab.errors import NpuMoeError
from npumoe_lab.utils import REPO_ROOT, progress
from npumoe_lab.devices.platform import PLATFORM_DIR, get_platform, parse_platform_spec
from npumoe_lab.devices.price import op_columns, platform_params, power, price, with_draws
from npumoe_lab.devices.workload import row_op
from npumoe_lab.devices.fit_flags import parameter_flags, priors_of

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
NOT_HELD_OUT = ("power",)       # power rows predict watts, not time: never a held-out group of the transfer sigma


def row_group(device: str, kind: str) -> str:
    """The cross-validation group of a row: its device and kind of work (npu/gemm, cpu/model_forward...)."""
    return f"{device}/{kind}"


def _raw_yaml(platform) -> dict:
    """The platform's own YAML (top-level keys platform.py does not read, e.g. `transfer`)."""
    base = parse_platform_spec(platform.source or platform.name)[0]
    path = Path(base) if base.endswith((".yaml", ".yml")) or "/" in base else PLATFORM_DIR / f"{base}.yaml"
    return yaml.safe_load(path.read_text()) if path.is_file() else {}


def transfer_spec(platform):
    """(source fit Platform, [param, ...], note) of the YAML's `transfer:` block, or None."""
    t = _raw_yaml(platform).get("transfer")
    if not t:
        return None
    if not (isinstance(t, dict) and isinstance(t.get("platform"), str) and isinstance(t.get("params"), list)
            and t["params"]):
        raise NpuMoeError(f"platform {platform.name!r}: transfer must be {{platform: <fit YAML>, params: [...], "
                          f"note: ...}}, got {t!r}")
    path = Path(t["platform"]) if Path(t["platform"]).is_absolute() else REPO_ROOT / t["platform"]
    if not path.is_file():
        raise NpuMoeError(f"platform {platform.name!r}: transfer source {t['platform']} does not exist; run "
                          f"fit-device for that platform first (it writes it)")
    src = get_platform(str(path))
    post = src.posterior or {}
    missing = [n for n in t["params"] if n not in (post.get("params") or [])]
    if missing:
        raise NpuMoeError(f"platform {platform.name!r}: transfer source {t['platform']} has no posterior for "
                          f"{missing}; transfer only parameters that fit fitted")
    return src, list(t["params"]), str(t.get("note", ""))


def _least_squares(resid, x0s, lo, hi):
    from scipy.optimize import least_squares
    return min((least_squares(lambda x: resid(x[None, :])[0], x0, bounds=(lo, hi), x_scale="jac")
                for x0 in x0s), key=lambda r: r.cost)


def _identified(rs, base, names, x, step: float = 0.05) -> np.ndarray:
    """Which parameters move the rows' log residuals at x (a finite-difference column above 1e-6). The others
    have no gradient there; freeing them would only let the optimiser's trust-region steps drift them."""
    probe = np.vstack([x, x + step * np.eye(len(x))])
    r = rs.log_residuals(with_draws(base, names, np.exp(probe)))
    return np.max(np.abs(r[1:] - r[0]), axis=1) > 1e-6


def transfer_cv(rows, base, names, lo, hi, x_src) -> dict:
    """Leave-one-group-out cross-validation of the point fit on fit rows only (module doc): {group: [weighted log
    errors of its held-out rows]}. Each refit starts from the sourced values alone and frees only the parameters
    the remaining rows move (_identified), so a parameter that only the held-out group identifies stays where the
    sources put it (as it would for a new kind of work)."""
    groups = np.array([row_group(d, k) for d, k in zip(rows.device, rows.kind)], dtype=object)
    out = {}
    for g in sorted(set(groups)):
        if g.split("/", 1)[1] in NOT_HELD_OUT:
            continue
        train, test = rows[groups != g].reset_index(drop=True), rows[groups == g].reset_index(drop=True)
        if train.empty:
            continue
        rs_tr, rs_te = RowSet.of(train), RowSet.of(test)
        free = _identified(rs_tr, base, names, x_src)
        x = x_src.copy()
        if free.any():
            def resid(xf):                                   # (1, free) -> (1, rows): the others stay sourced
                full = np.tile(x_src, (len(xf), 1))
                full[:, free] = xf
                return rs_tr.log_residuals(with_draws(base, names, np.exp(full))) * rs_tr.weight
            x[free] = _least_squares(resid, [x_src[free]], lo[free], hi[free]).x
        out[str(g)] = (rs_te.log_residuals(with_draws(base, names, np.exp(x[None, :])))[0] * rs_te.weight).tolist()
    return out


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
    cv: dict = None             # {group: [held-out weighted log errors]} (transfer_cv); {} when under 2 groups
    transfer_sigma: float | None = None     # RMS of the cv errors (or the transfer source's); None: no estimate
    transferred: tuple = ()     # (source platform, [params], note) from the YAML's transfer block, or ()
    fitted_groups: tuple = ()   # device/kind groups of the fit rows
    pooled: dict | None = None  # fit_pooled: {"chips": [...], "shared": [...], "priors": {param: (low, high)},
                                # "rows": [ids of every chip's fit rows]}


def fit_platform(platform, df, steps: int = 30000, walkers: int = 0, seed: int = 0, starts: int = 8) -> FitResult:
    """Least squares point and emcee posterior of the platform's `fit:` parameters on its chip's fit rows."""
    import logging

    import emcee
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
    spec = transfer_spec(platform)
    if spec:                                        # transferred parameters: the source fit's point values
        src, tnames, _ = spec
        clash = [n for n in tnames if n in names]
        if clash:
            raise NpuMoeError(f"platform {platform.name!r}: {clash} are both fitted and transferred; list each in "
                              "fit: or in transfer: only")
        src_params = platform_params(src)
        base = {**base, **{n: src_params[n] for n in tnames}}

    def resid(x):                                   # x: (D, P) log-parameters -> (D, rows), confidence-weighted
        return rs.log_residuals(with_draws(base, names, np.exp(x))) * rs.weight

    rng = np.random.default_rng(seed)
    x_src = np.clip(np.log([float(np.ravel(base[n])[0]) for n in names]), lo + 1e-9, hi - 1e-9)
    x0s = [x_src] + [lo + (hi - lo) * rng.uniform(0.05, 0.95, len(names)) for _ in range(starts)]
    best = _least_squares(resid, x0s, lo, hi)
    cv = transfer_cv(rows, base, names, lo, hi, x_src)
    errs = [e for v in cv.values() for e in v]
    tsigma = float(np.sqrt(np.mean(np.square(errs)))) if len(cv) >= 2 else None
    if tsigma is None and spec and (spec[0].posterior or {}).get("transfer_sigma_log") is not None:
        tsigma = float(spec[0].posterior["transfer_sigma_log"])     # too few groups here: the source's estimate
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
    pick = np.random.default_rng(seed)
    keep = chain[pick.choice(len(chain), size=min(400, len(chain)), replace=False)]
    point, draws, out_names = np.exp(best.x), np.exp(keep[:, :-1]), list(names)
    if spec:                                        # append the transferred columns: source draws at random
        src, tnames, _ = spec
        sd = np.asarray(src.posterior["draws"], dtype=float)
        cols = [src.posterior["params"].index(n) for n in tnames]
        draws = np.column_stack([draws, sd[pick.choice(len(sd), size=len(draws))][:, cols]])
        point = np.concatenate([point, [float(np.ravel(base[n])[0]) for n in tnames]])
        out_names += tnames
    groups = tuple(sorted({row_group(d, k) for d, k in zip(rows.device, rows.kind)}))
    return FitResult(out_names, point, draws, np.exp(keep[:, -1]), rs, r0 / rs.weight,
                     float(np.mean(sampler.acceptance_fraction)), tau, nw, steps, burn, cv, tsigma,
                     spec or (), groups)


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
    src, tnames, tnote = res.transferred or (None, [], "")
    for i, knob in enumerate(res.names):
        role, _, key = knob.partition("_")
        entry = doc[role][key]
        q5, q50, q95 = (np.percentile(res.draws[:, i], q) for q in (5, 50, 95))
        interval = f"90 % interval {_sig(q5)}-{_sig(q95)} {entry['unit']}"
        if knob in tnames:
            source = (f"transferred from {src.name} (fit-device {today}: its least-squares point; its posterior "
                      f"draws paired at random with this fit's)")
            note = f"{tnote} {interval}"
        else:
            low, high = priors_of(platform, res)[knob]
            pool = res.pooled or {}
            if knob in pool.get("shared", ()):
                source = (f"fitted jointly for the generation pool {'+'.join(pool['chips'])} on rows "
                          f"[{', '.join(pool['rows'])}] (fit-device --pool {today}: one value shared by the chips; "
                          "least squares on log time; emcee posterior)")
            else:
                source = (f"fitted on rows [{', '.join(ids)}] (fit-device {today}: least squares on log time; emcee "
                          "posterior" + (f"; chip-level term of the pool {'+'.join(pool['chips'])})" if pool else ")"))
            note = f"{interval}; prior log-uniform [{low:g}, {high:g}]"
        entry.update(value=_sig(res.point[i]), confidence="M", source=source,
                     note=f"was {entry['value']!r} ({entry['source']}); {note}",
                     interval={"p5": _sig(q5), "p50": _sig(q50), "p95": _sig(q95)})
    doc["fit"] = [{"param": k, "low": lo, "high": hi} for k, (lo, hi) in priors_of(platform, res).items()]
    flags = parameter_flags(platform, res)
    for knob, fl in flags.items():
        role, _, key = knob.partition("_")
        doc[role][key]["note"] += "; FLAGGED: " + ", ".join(fl)
    doc["posterior"] = {
        "method": "emcee EnsembleSampler (DE 0.8 + DE-snooker 0.2) over log-parameters and a log-noise sigma; "
                  "likelihood normal in log(predicted/measured time or power)",
        "rows": ids, "params": list(res.names), "n_walkers": res.n_walkers, "n_steps": res.n_steps,
        "burn": res.burn, "acceptance": round(res.acceptance, 3), "autocorr_steps_max": round(res.tau, 1),
        "kept_steps_over_autocorr": round((res.n_steps - res.burn) / res.tau, 1),
        "point_median_abs_error": round(float(np.median(np.abs(np.expm1(res.point_residuals)))), 4),
        "fitted_groups": list(res.fitted_groups),
        "transfer_sigma_log": None if res.transfer_sigma is None else _sig(res.transfer_sigma),
        "transfer_sigma_method": (
            "leave one device/kind group of fit rows out, refit the point from the sourced values, predict it; RMS "
            "of the held-out log errors (fit rows only); the noise of work whose group is not fitted"
            if res.cv and len(res.cv) >= 2 else
            f"under two groups of fit rows here: taken from {src.name}" if res.transfer_sigma is not None else
            "none: under two groups of fit rows and no transfer source (intervals on other kinds of work use the "
            "fit noise only and are too narrow)"),
        "transfer_cv": {g: {"rows": len(v), "rms_log": _sig(float(np.sqrt(np.mean(np.square(v)))))}
                        for g, v in (res.cv or {}).items()},
        "transferred": {"platform": src.name, "params": list(tnames), "note": tnote} if src else None,
        "flags": flags,
        "pooled": None if not res.pooled else {k: res.pooled[k] for k in ("chips", "shared")},
        "point_value": "the least-squares point (each parameter's `value`); its posterior median is `interval.p50`",
        "draws": [[_sig(v) for v in d] for d in res.draws], "sigma_log": [_sig(s) for s in res.sigma]}
    return doc


def fit_file(platform, res: FitResult) -> tuple[str, str]:
    """(file name, YAML text) of a fit: what `write_fit` writes (the CLI prints its table before writing)."""
    doc = fitted_yaml(platform, res, dt.date.today().isoformat())
    text = yaml.safe_dump(doc, sort_keys=False, width=120, default_flow_style=None)
    return f"{platform.name}-fit.yaml", (f"# Written by `npumoe-lab fit-device --platform {platform.source}` "
                                          f"({len(res.rows.ids)} fit rows). Fitted values are marked in their "
                                          f"source.\n" + text)


def write_fit(platform, res: FitResult, out: Path) -> Path:
    name, text = fit_file(platform, res)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    (out / name).write_text(text)
    return out / name


__all__ = ["fit_platform", "fit_rows", "write_fit", "fit_file", "fitted_yaml", "RowSet", "FitResult", "parameter_flags",
           "SIGMA_BOUNDS"]
