"""`fit-device --platform cpu`: fit this host's op-level cost model (cpu_model.py) on `measure --device cpu` rows and
write DIR/cpu-fit.yaml, a platform file: cpu.yaml with the host profile filled in, the roofline entries replaced by
the fitted rates, and a `host_model` section holding every fitted parameter with its source (which rows) and a
90 % interval (from the Jacobian of the log-residuals at the optimum: a Gauss-Newton approximation, stated so).

Only fit rows of this host's chip are used; rows flagged host_busy are skipped and counted (stated in the file).
"""
from __future__ import annotations

import copy
import math
import time
from pathlib import Path

import numpy as np
import pandas as pd
import yaml

from npumoe_lab.devices import cpu_model
from npumoe_lab.devices.hostprofile import fill_host_params
from npumoe_lab.devices.measurements import load_measurements
from npumoe_lab.devices.platform import PLATFORM_DIR
from npumoe_lab.errors import NpuMoeError

FIT_FILE = "cpu-fit.yaml"


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


def _intervals(ops, y, res) -> dict:
    """90 % intervals of the free log-parameters from J^T J (sigma^2 = residual variance)."""
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
    cov = np.linalg.pinv(J.T @ J) * float(r0 @ r0) / dof
    # an unidentified parameter (rows do not pin it) gets a huge half-width: clipped at a factor e^20 (say "L")
    half = np.minimum(1.645 * np.sqrt(np.clip(np.diag(cov), 0, None)), 20.0)
    return {k: (math.exp(v - h), math.exp(v + h)) for k, v, h in zip(free, x, half)}


def fit_host(df, source: str = "", include_busy: bool = False) -> dict:
    """Fit the host model on the usable fit rows of a measurements DataFrame; returns the fit (cpu_model.fit) plus
    the rows used and the host_busy rows skipped (`include_busy`: used too, and counted as such)."""
    rows = host_rows(df, source)
    usable = rows[rows["role"] == "fit"]
    if usable.empty:
        raise NpuMoeError(f"{source or 'the measurements'}: no host rows with role fit")
    busy, quiet = usable[usable["host_busy"]], usable[~usable["host_busy"]]
    if include_busy:
        quiet = usable
    if quiet.empty:
        raise NpuMoeError(f"{source or 'the measurements'}: all {len(usable)} fit rows are flagged host_busy; "
                          "measure again on a quiet host")
    recs = quiet.to_dict("records")
    ops, y = [host_op(r) for r in recs], quiet["measured_s"].to_numpy(float)
    res = cpu_model.fit(ops, y)
    res["intervals"] = _intervals(ops, y, res)
    res.update(chip=str(quiet["chip"].iloc[0]), rows_used=list(quiet["id"]),
               n_busy_skipped=0 if include_busy else int(len(busy)), n_busy_used=int(len(busy)) if include_busy else 0)
    return res


def write_fit(res: dict, out_dir, measurements: str) -> Path:
    """DIR/cpu-fit.yaml: the cpu platform with fitted values (see module doc); out_dir None: its text."""
    raw = yaml.safe_load((PLATFORM_DIR / "cpu.yaml").read_text())
    params = {r: raw[r] for r in ("npu", "cpu")}
    fill_host_params(params)
    p, iv = res["params"], res["intervals"]
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    src = (f"fitted by fit-device --platform cpu on {len(res['rows_used'])} fit rows of {measurements} "
           f"({res['n_busy_skipped']} host_busy rows skipped, {res['n_busy_used']} used: "
           f"{'a BUSY host, do not trust' if res['n_busy_used'] else 'quiet rows only'}), {stamp}")
    model = {}
    for k in cpu_model.PARAMS:
        fitted = k in res["free"]
        lo, hi = iv.get(k, (None, None))
        model[k] = {"value": float(p[k]), "unit": cpu_model.UNITS.get(k, "s"),
                    "source": src if fitted else "not fitted: no row informs it (start value of cpu_model.START)",
                    "confidence": ("M" if fitted and hi / lo < 2 else "L") if fitted else "L",
                    "note": (f"90 % interval {lo:.3g} .. {hi:.3g} (Gauss-Newton, log scale)" if fitted
                             else "priced at its start value; add rows of this op kind to fit it"),
                    **({"interval90": [float(lo), float(hi)]} if fitted else {})}
    for role, key, name in (("cpu", "throughput_flops", "peak_flops"), ("npu", "throughput_flops", "peak_flops"),
                            ("cpu", "bandwidth_bytes_s", "bandwidth_bytes_s"),
                            ("npu", "bandwidth_bytes_s", "bandwidth_bytes_s"),
                            ("cpu", "op_overhead_s", "call_s_router"), ("npu", "dispatch_s", "call_s_expert_group")):
        e = params[role][key]
        e.pop("from_host_profile", None)
        e.pop("alternatives_from_host_profile", None)
        e.update(value=float(p[name]), source=f"host_model.{name}: {src}", confidence="M",
                 note=f"fitted (host_model.{name}); was: {e['note']}")
    out = copy.deepcopy(raw)
    out.update(name="cpu-fit", chip=res["chip"], npu=params["npu"], cpu=params["cpu"],
               description=f"this host's CPU with its op-level cost model fitted on measurements ({res['chip']})",
               host_model=model,
               host_fit={"measurements": str(measurements), "rows_used": len(res["rows_used"]),
                         "host_busy_skipped": res["n_busy_skipped"], "host_busy_used": res["n_busy_used"],
                         "free_parameters": list(res["free"]),
                         "fit_median_abs_err": res["median_abs_err"], "fit_worst_abs_err": res["worst_abs_err"],
                         "rms_log": res["rms_log"], "created": stamp})
    text = ("# FITTED host model (devices/cpu_fit.py); every number in host_model is fitted on measured rows\n"
            + yaml.safe_dump(out, sort_keys=False))
    if out_dir is None:            # the CLI writes it (atomically, after printing the table)
        return text
    path = Path(out_dir) / FIT_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(text)
    tmp.replace(path)              # atomic: a reader never sees half a fit
    return path


def load_host_model(path) -> dict:
    """{param: value} of a cpu-fit.yaml; one clear error when the file is missing or does not parse."""
    p = Path(path)
    if not p.is_file():
        raise NpuMoeError(f"platform file {p} does not exist; write it with `npumoe-lab fit-device --platform cpu`")
    try:
        raw = yaml.safe_load(p.read_text())
    except yaml.YAMLError as exc:
        raise NpuMoeError(f"platform file {p} does not parse ({str(exc).splitlines()[0]})") from None
    model = raw.get("host_model") if isinstance(raw, dict) else None
    if not isinstance(model, dict) or any(k not in model or not isinstance(model[k], dict) for k in cpu_model.PARAMS):
        raise NpuMoeError(f"platform file {p} has no complete host_model section (the fitted CPU model); "
                          "write it with `npumoe-lab fit-device --platform cpu`")
    vals = {k: model[k]["value"] for k in cpu_model.PARAMS}
    bad = [k for k, v in vals.items() if isinstance(v, bool) or not isinstance(v, (int, float)) or not v > 0]
    if bad:
        raise NpuMoeError(f"platform file {p}: host_model {', '.join(bad)} must be positive numbers")
    return vals




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
    params = load_host_model(platform_path)
    rows = host_rows(load_measurements(measurements), str(measurements))
    pred = cpu_model.price_many(params, [host_op(r) for r in rows.to_dict("records")])
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


__all__ = ["host_op", "host_rows", "fit_host", "write_fit", "load_host_model", "is_host_fit",
           "validate_host_rows", "FIT_FILE"]
