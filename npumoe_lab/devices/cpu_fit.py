"""`fit-device --platform cpu`: fit this host's op-level cost model (cpu_model.py) on `measure --device cpu` rows and
write DIR/cpu-fit.yaml, a platform file: cpu.yaml with the host profile filled in, the roofline entries replaced by
the fitted rates, and a `host_model` section holding every fitted parameter with its source (which rows) and a
90 % interval (from the Jacobian of the log-residuals at the optimum: a Gauss-Newton approximation, stated so).

Only fit rows of this host's chip are used; rows flagged host_busy are skipped and counted (stated in the file).
"""
from __future__ import annotations

import copy
import math
import re
import time
from pathlib import Path

import numpy as np
import pandas as pd
import yaml

from npumoe_lab.devices import cpu_model
from npumoe_lab.devices.hostprofile import fill_host_params, host_chip, register_host_fit
from npumoe_lab.devices.measurements import load_measurements
from npumoe_lab.devices.platform import PLATFORM_DIR
from npumoe_lab.errors import NpuMoeError

FIT_FILE = "cpu-fit.yaml"
# the correction for the fit anchors' reading noise is capped at 2x (chosen before any draw read it): below this
# reliability the readings say too little about the host's speed for a larger correction to be trusted
MIN_RELIABILITY = 0.5


def host_op(row) -> dict:
    """The op record of an op-level host row (work.op + work.cost, as `measure` writes them)."""
    work = row["work"]
    cost = work.get("cost") if isinstance(work, dict) else None
    if not isinstance(cost, dict) or "op" not in work:
        raise NpuMoeError(f"row {row['id']!r} has no work.op / work.cost: the host model prices op-level rows of "
                          "`npumoe-lab measure --device cpu`")
    return cpu_model.op_record(work["op"], cost["flops"], cost["bytes"], cost["calls"], cost.get("gemm"),
                               cost.get("shape") or (), context=cost.get("context"))


def host_rows(df, source: str = ""):
    """The op-level rows of ONE host (chip host-<key>) in a measurements DataFrame (load_measurements)."""
    host = df[df["chip"].str.startswith("host-")]
    chips = sorted(host["chip"].unique())
    if len(chips) != 1:
        raise NpuMoeError(f"{source or 'the measurements'}: the cpu platform fits ONE host's rows (chip "
                          f"host-<key>, written by `npumoe-lab measure --device cpu`); found chips {chips or 'none'}")
    return host


# A free parameter whose term is below this share of EVERY fit row's price has a zero Jacobian column: the rows bound
# it from above only (the least squares drive it toward 0, where the residuals no longer depend on it), so J^T J
# says nothing of it. pinv would give it zero variance (an interval of zero width, read as "pinned exactly"); it
# gets the unidentified parameters' clipped interval instead, and a flag.
NEGLIGIBLE_SHARE = 1e-6
CLIP_LOG = 20.0             # an unidentified parameter's 90 % interval: its point x e^+-20


def _covariance(ops, y, res) -> tuple:
    """(covariance, negligible): the covariance of the free log-parameters from J^T J (sigma^2 = residual
    variance), the Laplace (Gauss-Newton) approximation of the fit's posterior, stated so (the Apple fits sample
    theirs with emcee); and the parameters whose Jacobian column is negligible on every row (NEGLIGIBLE_SHARE),
    which are left out of J^T J and get the clipped variance, uncorrelated."""
    ops = cpu_model.features(ops)          # once, not per Jacobian column
    p, free = res["params"], res["free"]
    x = np.array([math.log(p[k]) for k in free])
    base = dict(p)

    def resid(xx):
        q = {**base, **{k: math.exp(v) for k, v in zip(free, xx)}}
        return np.log(cpu_model.price_many(q, ops)) - np.log(y)
    r0, J = resid(x), np.zeros((len(y), len(free)))
    for j in range(len(free)):
        d = np.zeros_like(x)
        d[j] = 1e-4
        J[:, j] = (resid(x + d) - r0) / 1e-4
    dof = max(len(y) - len(free), 1)
    live = np.max(np.abs(J), axis=0, initial=0.0) >= NEGLIGIBLE_SHARE
    cov = np.zeros((len(free), len(free)))
    cov[np.ix_(live, live)] = np.linalg.pinv(J[:, live].T @ J[:, live]) * float(r0 @ r0) / dof
    cov[~live, ~live] = (CLIP_LOG / 1.645) ** 2
    return cov, [k for k, ok in zip(free, live) if not ok]


def _intervals(res, cov) -> dict:
    """90 % intervals of the free parameters; an unidentified one (rows do not pin it) is clipped at e^+-20."""
    half = np.minimum(1.645 * np.sqrt(np.clip(np.diag(cov), 0, None)), CLIP_LOG)
    return {k: (res["params"][k] * math.exp(-h), res["params"][k] * math.exp(h)) for k, h in zip(res["free"], half)}


def parameter_flags(res) -> dict:
    """{param: flag} of the fitted parameters a reader must not take at face value: driven toward zero (in
    res["negligible"]: its term is negligible on every row, the rows bound it from above only), or not identified
    (its 90 % interval clipped). The host fit's counterpart of fit_flags.parameter_flags, which needs priors."""
    out = {}
    for k in res["free"]:
        lo, hi = res["intervals"][k]
        if k in res.get("negligible", ()):
            out[k] = (f"driven toward zero: its term is below {NEGLIGIBLE_SHARE:g} of every fit row's price, so the "
                      "rows bound it from above only (the op kind's cost is in its other terms)")
        elif math.log(hi / lo) >= 2 * CLIP_LOG * (1 - 1e-9):
            out[k] = "not identified by the rows (its 90 % interval is clipped at x e^+-20)"
    return out


def prefill_group(row) -> str | None:
    """The prefill a `measure` row's op came from (read from its id: <prefill>-k<chunk>-l<layer>-<op>), None for
    a group row."""
    m = re.match(r"^(.*-p\d+)-k\d+-l", str(row["id"]))
    return m.group(1) if m else None


def _chunk_of(group: str) -> str:
    m = re.search(r"^(.*?)-.*-c(\d+)-p\d+$", group)
    return f"{m.group(1)}-c{m.group(2)}" if m else group


def cross_validated_sigma(ops, y, groups, res) -> dict:
    """The host model's predictive noise on whole prefills, cross-validated on fit rows only: fold = every prefill
    of one geometry at one chunk size (all modes); the model is refitted without the fold (warm start at the full
    fit) and predicts each held-out prefill as the sum of its ops' prices vs the sum of their measured medians.
    sigma_log = RMS of log(predicted / measured) over the held-out prefills (bias included)."""
    groups = np.asarray([g or "" for g in groups], dtype=object)
    feats = cpu_model.features(ops)        # once: each fold keeps a boolean mask of its rows
    folds = sorted({_chunk_of(g) for g in groups if g})
    errs = []
    for fold in folds:
        held = np.array([bool(g) and _chunk_of(g) == fold for g in groups])
        try:
            r = cpu_model.fit(feats[~held], y[~held], start=res["params"], max_nfev=300)
        except NpuMoeError:
            continue                                    # too few rows left: this fold says nothing
        pred = cpu_model.price_many(r["params"], feats[held])
        for g in sorted(set(groups[held])):
            sel = groups[held] == g
            errs.append(float(np.log(pred[sel].sum() / y[held][sel].sum())))
    sigma = float(np.sqrt(np.mean(np.square(errs)))) if errs else float("nan")
    return {"sigma_log": sigma, "n_prefills": len(errs), "folds": folds,
            "median_abs_err": float(np.median(np.abs(np.expm1(errs)))) if errs else float("nan")}


def _tiny_repeats(rows, key: str):
    """(prefill totals or None, anchor readings) per repeat of each tiny-geometry prefill's first row in `rows` that
    carries `key` (prefill_reps_s: totals and readings of equal length; host_anchor_reps_s: readings), >= 3 repeats."""
    if key not in rows:
        return
    for r in rows.itertuples():
        t, a = getattr(r, "prefill_reps_s", None), r.host_anchor_reps_s
        geom = r.work.get("geometry") if isinstance(r.work, dict) else None
        if geom != "tiny" or not isinstance(a, list) or len(a) < 3:
            continue
        if key == "prefill_reps_s" and (not isinstance(t, list) or len(t) != len(a)):
            continue
        yield (t if key == "prefill_reps_s" else None), np.asarray(a, float)


def _within_slope(rows) -> tuple:
    """The slope of log(prefill total) on log(anchor read just before it), both centred within each tiny prefill,
    pooled over prefills (first rows carry prefill_reps_s / host_anchor_reps_s); (beta, se, n_prefills)."""
    xs, ys = [], []
    for t, a in _tiny_repeats(rows, "prefill_reps_s"):
        lt, la = np.log(t), np.log(a)
        xs.append(la - la.mean())
        ys.append(lt - lt.mean())
    return _slope(xs, ys, len(xs))


def anchor_reliability(rows) -> float:
    """The share of the spread of a tiny prefill's anchor reading (the log of the median of its repeats' readings)
    ACROSS prefills that is the host's speed rather than reading noise: 1 - (noise variance of one reading, from the
    readings' spread within each prefill) / (repeats x the variance across prefills). A slope read against noisy
    anchors is attenuated by this factor; a run's anchor (the median of many readings) much less. Kept in the fit
    file with beta / it (`anchor_beta_corrected`), not used to price (pricing_slope says why). NaN without 3 such
    prefills."""
    within, levels, reps = [], [], []
    for _, a in _tiny_repeats(rows, "host_anchor_reps_s"):
        if not np.all(a > 0):
            continue
        la = np.log(a)
        within.append(la - la.mean())
        levels.append(float(np.log(np.median(a))))
        reps.append(len(a))
    if len(levels) < 3:
        return float("nan")
    x = np.concatenate(within)
    noise = float(x @ x) / max(len(x) - len(within), 1)
    across = float(np.var(levels, ddof=1))
    return float(np.clip(1.0 - noise / np.mean(reps) / across, 0.0, 1.0)) if across > 0 else float("nan")


def _slope(xs, ys, groups) -> tuple:
    if not xs:
        return float("nan"), float("nan"), 0
    x, y = np.concatenate(xs), np.concatenate(ys)
    sxx = float(x @ x)
    if sxx <= 0:
        return float("nan"), float("nan"), groups
    beta = float(x @ y) / sxx
    dof = max(len(x) - len(xs) - 1, 1)            # one mean per group, one slope
    return beta, float(np.sqrt(float(np.sum((y - beta * x) ** 2)) / dof / sxx)), groups


def anchor_tracking(rows, prices=None, anchor_s=None) -> dict:
    """How far a prefill of the anchor's geometry (tiny) follows the speed anchor, as validate-device --runs uses it:
    ACROSS the fit's prefills (minutes apart, as a run is from the fit), the slope `beta` of log(measured total /
    the fit's price) on log(the prefill's anchor reading / the fit's anchor `anchor_s`), with an intercept (the
    fit's own bias). `prices`: the fit's price of each row of `rows` (fit rows, one dtype). A price is then scaled by
    (run's anchor / fit's) ** beta.

    Why across, not within: the first form (2026-12-06 morning) regressed each prefill's repeats on the anchor read
    just before them. Seconds apart, the host's speed barely moves and the anchor's reading noise dominates, so that
    slope is attenuated towards 0 (0.05 +- 0.19 and 0.33 +- 0.13 on acceptance draw 21's fit rows) while the runs,
    minutes from the fit, needed ~0.6 (draw 21's worst run: 1.54x slower than the price at an anchor 2.15x slower).
    On those fit rows (quiet ones) the across-prefill slope reads 0.75 +- 0.08 (bf16), 0.50 +- 0.12 (fp32). A change
    made after reading draw 21's held-out errors (said in docs/CPU_LOOP.md; the next acceptance is a fresh seed). The
    within slope is kept for the record (`beta_within`). Without prices or anchors: the within slope (the first
    form). NaN without such rows."""
    bw, bw_se, nw = _within_slope(rows)
    out = {"beta_within": bw, "beta_within_se": bw_se, "n_prefills_within": nw, "method": "within"}
    if prices is None or not anchor_s or "host_anchor_s" not in rows or "measured_s" not in rows:
        return {"beta": bw, "beta_se": bw_se, "n_prefills": nw, **out}
    geom = rows["work"].map(lambda w: w.get("geometry") if isinstance(w, dict) else None)
    d = pd.DataFrame({"g": [prefill_group(r) for r in rows[["id"]].to_dict("records")],
                      "y": pd.to_numeric(rows["measured_s"], errors="coerce").to_numpy(float),
                      "p": np.asarray(prices, float),
                      "a": pd.to_numeric(rows["host_anchor_s"], errors="coerce").to_numpy(float)})
    d = d[(geom == "tiny").to_numpy() & d["g"].notna().to_numpy() & np.isfinite(d["a"]).to_numpy()
          & (d["a"] > 0).to_numpy() & (d["p"] > 0).to_numpy() & (d["y"] > 0).to_numpy()]
    agg = d.groupby("g").agg(y=("y", "sum"), p=("p", "sum"), a=("a", "median"))
    if len(agg) < 3:
        return {"beta": bw, "beta_se": bw_se, "n_prefills": nw, **out}
    x, y = np.log(agg["a"].to_numpy() / anchor_s), np.log(agg["y"].to_numpy() / agg["p"].to_numpy())
    beta, se, n = _slope([x - x.mean()], [y - y.mean()], len(agg))
    rel = anchor_reliability(rows)
    corrected = beta / max(rel, MIN_RELIABILITY) if np.isfinite(rel) else float("nan")
    return {"beta": beta, "beta_se": se, "n_prefills": n, **out, "method": "across prefills", "reliability": rel,
            "beta_corrected": corrected}


def pricing_slope(unc: dict | None) -> float:
    """The slope validate-device --runs scales a fit's price by: the across-prefill slope as read (`anchor_beta`),
    else 1 (fits before the slope); never below 0. Dividing it by the fit anchors' reliability
    (`anchor_beta_corrected`) was tried on the development draw of 2026-12-07 and not taken: a steady fit window
    reads a low reliability (0.39), the capped correction doubled the slope (0.93 -> 1.86), and the tiny fp32 runs
    were modeled 18-68 % too slow (docs/CPU_LOOP.md). It stays in the fit file for the record."""
    b = (unc or {}).get("anchor_beta")
    return max(float(b), 0.0) if isinstance(b, (int, float)) and np.isfinite(b) else 1.0


def fit_host(df, source: str = "", include_busy: bool = False, dtype: str | None = None, cv: bool = True) -> dict:
    """Fit the host model on the usable fit rows of ONE dtype (work.weight_format; None: the only one) of a
    measurements DataFrame; returns the fit (cpu_model.fit) plus the rows used, the host_busy rows skipped
    (`include_busy`: used too, and counted as such), the posterior covariance and the cross-validated sigma."""
    rows = host_rows(df, source)
    usable = rows[rows["role"] == "fit"]
    if usable.empty:
        raise NpuMoeError(f"{source or 'the measurements'}: no host rows with role fit")
    fmt = usable["work"].map(row_dtype)
    if dtype is None:
        if fmt.nunique() > 1:
            raise NpuMoeError(f"{source}: rows of dtypes {sorted(fmt.unique())}; fit one at a time (fit_hosts)")
        dtype = str(fmt.iloc[0])
    usable = usable[fmt == dtype]
    if usable.empty:
        raise NpuMoeError(f"{source or 'the measurements'}: no {dtype} fit rows; measure with --dtype {dtype}")
    busy, quiet = usable[usable["host_busy"]], usable[~usable["host_busy"]]
    if include_busy:
        quiet = usable
    if quiet.empty:
        raise NpuMoeError(f"{source or 'the measurements'}: all {len(usable)} {dtype} fit rows are flagged "
                          "host_busy; measure again on a quiet host")
    recs = quiet.to_dict("records")
    ops, y = cpu_model.features([host_op(r) for r in recs]), quiet["measured_s"].to_numpy(float)
    res = cpu_model.fit(ops, y)
    cov, res["negligible"] = _covariance(ops, y, res)
    res["intervals"] = _intervals(res, cov)
    res["flags"] = parameter_flags(res)
    res["cov_log"] = cov
    res["cv"] = cross_validated_sigma(ops, y, [prefill_group(r) for r in recs], res) if cv else \
        {"sigma_log": float("nan"), "n_prefills": 0, "folds": [], "median_abs_err": float("nan")}
    probes = pd.to_numeric(quiet["host_probe_s"], errors="coerce").dropna() if "host_probe_s" in quiet else []
    res["probe_s"] = float(np.median(probes)) if len(probes) else None      # the host's speed (hostspeed.py)
    anchors = pd.to_numeric(quiet["host_anchor_s"], errors="coerce").dropna() if "host_anchor_s" in quiet else []
    res["anchor_s"] = float(np.median(anchors)) if len(anchors) else None   # the speed anchor the fit prices at
    res["anchor_tracking"] = anchor_tracking(quiet, cpu_model.price_many(res["params"], ops), res["anchor_s"])
    res.update(chip=str(quiet["chip"].iloc[0]), rows_used=list(quiet["id"]), dtype=dtype,
               n_busy_skipped=0 if include_busy else int(len(busy)), n_busy_used=int(len(busy)) if include_busy else 0)
    return res


def row_dtype(work) -> str:
    return str(work.get("weight_format") or "bf16") if isinstance(work, dict) else "bf16"


def fit_hosts(df, source: str = "", include_busy: bool = False, cv: bool = True) -> dict:
    """{dtype: fit_host(...)} for every dtype the host rows were measured in (measure --dtype)."""
    rows = host_rows(df, source)
    dtypes = sorted(rows[rows["role"] == "fit"]["work"].map(row_dtype).unique())
    if not dtypes:
        raise NpuMoeError(f"{source or 'the measurements'}: no host rows with role fit")
    return {d: fit_host(df, source, include_busy, d, cv) for d in dtypes}


def _source(res: dict, measurements: str, stamp: str) -> str:
    return (f"fitted by fit-device --platform cpu on {len(res['rows_used'])} {res['dtype']} fit rows of "
            f"{measurements} ({res['n_busy_skipped']} host_busy rows skipped, {res['n_busy_used']} used: "
            f"{'a BUSY host, do not trust' if res['n_busy_used'] else 'quiet rows only'}), {stamp}")


def _model_section(res: dict, src: str) -> dict:
    p, iv, model = res["params"], res["intervals"], {}
    for k in cpu_model.PARAMS:
        fitted = k in res["free"]
        lo, hi = iv.get(k, (None, None))
        flag = (res.get("flags") or {}).get(k)
        model[k] = {"value": float(p[k]), "unit": cpu_model.UNITS.get(k, "s"),
                    "source": src if fitted else "not fitted: no row informs it (start value of cpu_model.START)",
                    "confidence": ("M" if hi / lo < 2 and not flag else "L") if fitted else "L",
                    "note": (f"90 % interval {lo:.3g} .. {hi:.3g} (Gauss-Newton, log scale)"
                             + (f"; FLAG: {flag}" if flag else "") if fitted
                             else "priced at its start value; add rows of this op kind to fit it"),
                    **({"interval90": [float(lo), float(hi)]} if fitted else {})}
    return model


def _fit_summary(res: dict, measurements: str, stamp: str) -> dict:
    cv = res["cv"]
    return {"measurements": str(measurements), "dtype": res["dtype"], "rows_used": len(res["rows_used"]),
            "host_busy_skipped": res["n_busy_skipped"], "host_busy_used": res["n_busy_used"],
            "free_parameters": list(res["free"]),
            # parameters a reader must not take at face value (parameter_flags): {name: why}
            "parameter_flags": dict(res.get("flags") or {}),
            "fit_median_abs_err": res["median_abs_err"], "fit_worst_abs_err": res["worst_abs_err"],
            "rms_log": res["rms_log"], "torch_threads": res.get("threads"),
            # the allocator policy `measure` ran under (core/host_memory.py); a run under another is not counted
            "host_malloc": res.get("malloc"),
            # median host speed probe over the rows used: shown beside each run's (a reading, not a rule: hostspeed.py)
            "probe_s": res.get("probe_s"),
            # median speed anchor over the rows used: a run's price is scaled by its anchor over this (hostspeed.py)
            "anchor_s": res.get("anchor_s"),
            # how far a tiny-geometry prefill's error follows the anchor across the fit's prefills (anchor_tracking)
            "anchor_beta": (res.get("anchor_tracking") or {}).get("beta"),
            "anchor_beta_se": (res.get("anchor_tracking") or {}).get("beta_se"),
            "anchor_beta_prefills": (res.get("anchor_tracking") or {}).get("n_prefills"),
            "anchor_beta_method": (res.get("anchor_tracking") or {}).get("method"),
            # the first form's slope over each prefill's repeats (attenuated by the anchor's reading noise): a record
            "anchor_beta_within": (res.get("anchor_tracking") or {}).get("beta_within"),
            "anchor_beta_within_se": (res.get("anchor_tracking") or {}).get("beta_within_se"),
            # the anchor readings' reliability across prefills and the slope divided by it: a record, not a price
            "anchor_reliability": (res.get("anchor_tracking") or {}).get("reliability"),
            "anchor_beta_corrected": (res.get("anchor_tracking") or {}).get("beta_corrected"),
            # the predictive uncertainty of a whole prefill (validate-device --runs): posterior x CV noise
            "posterior_cov_log": [[float(v) for v in row] for row in np.asarray(res["cov_log"])],
            "posterior": "Laplace (Gauss-Newton) approximation at the least-squares optimum, log parameters",
            "cv_sigma_log": cv["sigma_log"], "cv_prefills": cv["n_prefills"], "cv_folds": list(cv["folds"]),
            "cv_median_abs_err": cv["median_abs_err"],
            "cv": "refitted without every prefill of one geometry at one chunk size; RMS log error of the "
                  "held-out prefills' summed op prices", "created": stamp}


def write_fit(fits: dict, out_dir, measurements: str, primary: str | None = None) -> Path:
    """DIR/cpu-fit.yaml: the cpu platform with fitted values (see module doc). `fits`: {dtype: fit_host result}
    (or one result); `primary` (default: bf16 if fitted, else the first) fills host_model and the roofline."""
    if "params" in fits:
        fits = {fits["dtype"] if "dtype" in fits else "bf16": fits}
    primary = primary if primary in fits else ("bf16" if "bf16" in fits else sorted(fits)[0])
    res = fits[primary]
    raw = yaml.safe_load((PLATFORM_DIR / "cpu.yaml").read_text())
    params = {r: raw[r] for r in ("npu", "cpu")}
    fill_host_params(params, use_fit=False)
    p = res["params"]
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    src = _source(res, measurements, stamp)
    for role, key, name in ROOFLINE:
        e = params[role][key]
        e.pop("from_host_profile", None)
        e.pop("alternatives_from_host_profile", None)
        e.update(value=float(p[name]), source=f"host_model.{name}: {src}", confidence="M",
                 note=f"fitted (host_model.{name}); was: {e['note']}")
        if key == "throughput_flops" and "fp32" in fits and primary != "fp32":
            e["alternatives"] = {**e.get("alternatives", {}), "fp32": float(fits["fp32"]["params"][name])}
    out = copy.deepcopy(raw)
    out.update(name="cpu-fit", chip=res["chip"], npu=params["npu"], cpu=params["cpu"],
               description=f"this host's CPU with its op-level cost model fitted on measurements ({res['chip']})",
               host_model=_model_section(res, src),
               host_models={d: _model_section(r, _source(r, measurements, stamp)) for d, r in fits.items()},
               host_fit=_fit_summary(res, measurements, stamp),
               host_fits={d: _fit_summary(r, measurements, stamp) for d, r in fits.items()})
    text = ("# FITTED host model (devices/cpu_fit.py); every number in host_model is fitted on measured rows\n"
            + yaml.safe_dump(out, sort_keys=False))
    path = Path(out_dir) / FIT_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    try:
        tmp.write_text(text)
        tmp.replace(path)              # atomic: a reader never sees half a fit
    except OSError as e:               # a full disk: nothing half-written left behind, the file named
        tmp.unlink(missing_ok=True)
        raise NpuMoeError(f"could not write {path}: {e.strerror or e}; the fitted values are printed above; free "
                          "space or give another --out") from None
    return path


# (role, entry of the cpu platform, host-model parameter) the planner's roofline takes from a host fit
ROOFLINE = (("cpu", "throughput_flops", "peak_flops"), ("npu", "throughput_flops", "peak_flops"),
            ("cpu", "bandwidth_bytes_s", "bandwidth_bytes_s"), ("npu", "bandwidth_bytes_s", "bandwidth_bytes_s"),
            ("cpu", "op_overhead_s", "call_s_router"), ("npu", "dispatch_s", "call_s_expert_group"))


def _read_fit(path) -> dict:
    p = Path(path)
    if not p.is_file():
        raise NpuMoeError(f"platform file {p} does not exist; write it with `npumoe-lab fit-device --platform cpu`")
    try:
        raw = yaml.safe_load(p.read_text())
    except yaml.YAMLError as exc:
        raise NpuMoeError(f"platform file {p} does not parse ({str(exc).splitlines()[0]})") from None
    if not isinstance(raw, dict) or not isinstance(raw.get("host_model"), dict):
        raise NpuMoeError(f"platform file {p} has no host_model section (the fitted CPU model); "
                          "write it with `npumoe-lab fit-device --platform cpu`")
    return raw


def fitted_dtypes(path) -> list:
    raw = _read_fit(path)
    return sorted(raw.get("host_models") or {(raw.get("host_fit") or {}).get("dtype", "bf16"): None})


def load_host_model(path, dtype: str | None = None) -> dict:
    """{param: value} of a cpu-fit.yaml (of `dtype`: the fit of that dtype's rows; None: the primary one); one
    clear error when the file is missing, does not parse, or has no fit of that dtype."""
    p, raw = Path(path), _read_fit(path)
    model = raw["host_model"]
    if dtype is not None and dtype != (raw.get("host_fit") or {}).get("dtype", dtype):
        model = (raw.get("host_models") or {}).get(dtype)
        if model is None:
            raise NpuMoeError(f"platform file {p} has no host model fitted on {dtype} rows (it has "
                              f"{', '.join(fitted_dtypes(p))}); run `npumoe-lab measure --device cpu --dtype "
                              f"{dtype}` into the measurements folder and fit-device again")
    if any(k not in model or not isinstance(model[k], dict) for k in cpu_model.PARAMS):
        raise NpuMoeError(f"platform file {p} has no complete host_model section (the fitted CPU model); "
                          "write it with `npumoe-lab fit-device --platform cpu`")
    vals = {k: model[k]["value"] for k in cpu_model.PARAMS}
    bad = [k for k, v in vals.items() if isinstance(v, bool) or not isinstance(v, (int, float)) or not v > 0]
    if bad:
        raise NpuMoeError(f"platform file {p}: host_model {', '.join(bad)} must be positive numbers")
    return vals


def load_host_uncertainty(path, dtype: str | None = None) -> dict | None:
    """{"free": [...], "cov_log": array, "sigma_log": float} of a fit (None: a file from before intervals)."""
    raw = _read_fit(path)
    summ = raw.get("host_fit") or {}
    if dtype is not None and dtype != summ.get("dtype", dtype):
        summ = (raw.get("host_fits") or {}).get(dtype) or {}
    if "posterior_cov_log" not in summ:
        return None
    sigma = summ.get("cv_sigma_log")
    return {"free": list(summ["free_parameters"]), "cov_log": np.asarray(summ["posterior_cov_log"], float),
            "sigma_log": float(sigma) if sigma is not None and np.isfinite(sigma) else 0.0,
            "threads": summ.get("torch_threads"), "malloc": summ.get("host_malloc"), "probe_s": summ.get("probe_s"),
            "anchor_s": summ.get("anchor_s"), "anchor_beta": summ.get("anchor_beta")}


def measured_host(measurements, key: str):
    """One field of the host `measure` ran on (its files' host.<key>: torch_threads, host_malloc); None when not
    recorded or the files differ."""
    p = Path(measurements)
    files = [p] if p.is_file() else sorted([*p.glob("*.yaml"), *p.glob("*.yml")])
    seen = set()
    for f in files:
        host = (yaml.safe_load(f.read_text()) or {}).get("host") or {}
        seen.add(host.get(key))
    return seen.pop() if len(seen) == 1 and None not in seen else None


def _anchor_line(res: dict) -> str:
    tr, a = res.get("anchor_tracking") or {}, res.get("anchor_s")
    if not a or not tr.get("n_prefills"):
        return ""
    how = "across" if tr.get("method") == "across prefills" else "over the repeats of"
    rel, corr = tr.get("reliability"), tr.get("beta_corrected")
    priced = (f" (anchor readings' reliability {rel:.2f}; divided by it, {corr:.2f}: recorded, not used)"
              if rel is not None and corr is not None and np.isfinite(corr) else "")
    return (f"; speed anchor {a * 1e3:.1f} ms (median of the rows), tiny prefills follow it with slope "
            f"{tr['beta']:.2f} +- {tr['beta_se']:.2f} {how} {tr['n_prefills']} prefills{priced}")


def fit_cli(a) -> int:
    """`fit-device --platform cpu --measurements DIR --out DIR` (fit.py hands the measured platform here); the fit
    is also registered for this host (hostprofile.register_host_fit) when the rows are this host's."""
    df = load_measurements(a.measurements)
    fits = fit_hosts(df, str(a.measurements), include_busy=getattr(a, "include_busy", False))
    threads, malloc = (measured_host(a.measurements, k) for k in ("torch_threads", "host_malloc"))
    for res in fits.values():
        res["threads"], res["malloc"] = threads, malloc
    for d, res in fits.items():
        print(f"{d}: fitted {len(res['free'])} parameters of the cpu host model on {len(res['rows_used'])} fit rows "
              f"of {res['chip']} ({res['n_busy_skipped']} host_busy rows skipped, {res['n_busy_used']} used): median "
              f"|error| {res['median_abs_err']:.1%}, worst {res['worst_abs_err']:.1%} (modeled vs measured); "
              f"cross-validated whole-prefill noise sigma_log {res['cv']['sigma_log']:.3f} over "
              f"{res['cv']['n_prefills']} held-out prefills (median |error| {res['cv']['median_abs_err']:.1%})"
              f"{_anchor_line(res)}\n" +
              "\n".join(f"  {k} = {res['params'][k]:.4g}  (90 % {res['intervals'][k][0]:.3g}-"
                        f"{res['intervals'][k][1]:.3g})" + (f"  FLAG: {res['flags'][k]}" if k in res.get("flags", {})
                                                            else "") for k in res["free"]))
    path = write_fit(fits, a.out, str(a.measurements), primary=getattr(a, "primary_dtype", None))
    chip = next(iter(fits.values()))["chip"]
    reg = register_host_fit(path, chip) if chip == host_chip() else None
    print(f"written {path}" + (f"; registered for this host as {reg} (--platform cpu prices plans with it)" if reg
                              else f" (rows of {chip}, not this host {host_chip()}: not registered)"))
    return 0


def is_host_fit(path) -> bool:
    """Whether `path` names a platform YAML with a fitted host model (cpu-fit.yaml)."""
    p = Path(str(path))
    if p.suffix not in (".yaml", ".yml") or not p.is_file():
        return False
    try:
        raw = yaml.safe_load(p.read_text())
    except yaml.YAMLError:
        return False
    return isinstance(raw, dict) and "host_model" in raw


def validate_host_rows(platform_path, measurements, out=None) -> tuple:
    """validate-device of a host fit on measurement rows: validation.csv (role, kind, chip, measured_s,
    predicted_s, ratio) and VALIDATION.md (median and worst |ratio - 1| per role and kind; host_busy rows apart)."""
    rows = host_rows(load_measurements(measurements), str(measurements))
    fmt = rows["work"].map(row_dtype)
    pred = np.zeros(len(rows))
    for d in fmt.unique():
        sel = (fmt == d).to_numpy()
        params = load_host_model(platform_path, d)
        pred[sel] = cpu_model.price_many(params, [host_op(r) for r in rows[sel].to_dict("records")])
    res = rows[["id", "role", "kind", "chip", "measured_s", "host_busy"]].assign(
        op=[w["op"] for w in rows["work"]], predicted_s=pred)
    res["ratio"] = res["predicted_s"] / res["measured_s"]
    lines = [f"# {platform_path} on {measurements}", "", "predicted = MODELED by the fitted host model; measured = "
             "MEASURED on the host. host_busy rows are listed apart and not counted.", "",
             "| role | op | rows | median abs(ratio-1) | worst |", "|---|---|---|---|---|"]
    quiet = res[~res["host_busy"]]
    for (role, op), g in quiet.groupby(["role", "op"]):
        e = (g["ratio"] - 1).abs()
        lines.append(f"| {role} | {op} | {len(g)} | {e.median():.1%} | {e.max():.1%} |")
    e = (quiet["ratio"] - 1).abs()
    lines += ["", f"All counted rows: {len(quiet)}, median {e.median():.1%}, worst {e.max():.1%}; "
              f"host_busy rows excluded: {int(res['host_busy'].sum())}."]
    text = "\n".join(lines) + "\n"
    if out is None:                # the CLI prints the table, then writes
        return res, text
    outp = Path(out)
    outp.mkdir(parents=True, exist_ok=True)
    pd.DataFrame(res).to_csv(outp / "validation.csv", index=False)
    (outp / "VALIDATION.md").write_text(text)
    return res, text


__all__ = ["host_op", "host_rows", "fit_host", "fit_hosts", "write_fit", "load_host_model", "load_host_uncertainty",
           "fitted_dtypes", "cross_validated_sigma", "prefill_group", "fit_cli", "is_host_fit", "ROOFLINE",
           "validate_host_rows", "FIT_FILE", "anchor_tracking"]
