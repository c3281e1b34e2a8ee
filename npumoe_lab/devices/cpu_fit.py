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
import yaml

from npumoe_lab.devices import cpu_model
from npumoe_lab.devices.hostprofile import fill_host_params
from npumoe_lab.devices.platform import PLATFORM_DIR
from npumoe_lab.errors import NpuMoeError

FIT_FILE = "cpu-fit.yaml"
ROW_FIELDS = ("id", "chip", "device", "path", "kind", "work", "measured_s", "source", "confidence", "role")
KINDS = ("gemm", "conv_chain", "gemv_stream", "call_floor", "power", "model_forward", "moe_layer", "attention",
         "router", "gather_scatter")


def check_row(row, where: str) -> None:
    """One clear error naming the row when a measurement row lacks a field or has an unknown kind."""
    if not isinstance(row, dict):
        raise NpuMoeError(f"{where}: a measurement row must be a mapping, got {type(row).__name__}")
    rid = row.get("id", "?")
    missing = [f for f in ROW_FIELDS if f not in row]
    if missing:
        raise NpuMoeError(f"{where}: row {rid!r} lacks {', '.join(missing)} (docs/MEASUREMENTS.md lists the fields)")
    if row["kind"] not in KINDS:
        raise NpuMoeError(f"{where}: row {rid!r} has unknown kind {row['kind']!r}; use one of {', '.join(KINDS)}")
    if row["role"] not in ("fit", "validate"):
        raise NpuMoeError(f"{where}: row {rid!r} role {row['role']!r} must be fit or validate")
    t = row["measured_s"]
    if isinstance(t, bool) or not isinstance(t, (int, float)) or not t > 0 or not math.isfinite(t):
        raise NpuMoeError(f"{where}: row {rid!r} measured_s {t!r} must be a positive number of seconds")


def read_rows(path) -> list[dict]:
    """Rows of one measurements YAML file (a list of rows), each checked."""
    p = Path(path)
    if p.is_dir():
        p = p / "measurements.yaml"
    if not p.is_file():
        raise NpuMoeError(f"measurements file {p} does not exist; run `npumoe-lab measure --device cpu --out DIR`")
    try:
        rows = yaml.safe_load(p.read_text())
    except yaml.YAMLError as exc:
        raise NpuMoeError(f"{p} is not valid YAML ({str(exc).splitlines()[0]})") from None
    if not isinstance(rows, list) or not rows:
        raise NpuMoeError(f"{p}: expected a non-empty YAML list of measurement rows")
    for i, r in enumerate(rows):
        check_row(r, f"{p} row {i}")
    return rows


def host_op(row) -> dict:
    """The op record of an op-level host row (work.op + work.cost, as `measure` writes them)."""
    work = row["work"]
    cost = work.get("cost") if isinstance(work, dict) else None
    if not isinstance(cost, dict) or "op" not in work:
        raise NpuMoeError(f"row {row['id']!r} has no work.op / work.cost: the CPU model prices op-level rows of "
                          "`npumoe-lab measure --device cpu`")
    return cpu_model.op_record(work["op"], cost["flops"], cost["bytes"], cost["calls"], cost.get("gemm"),
                               cost.get("shape") or ())


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
    half = 1.645 * np.sqrt(np.clip(np.diag(cov), 0, None))
    return {k: (math.exp(v - h), math.exp(v + h)) for k, v, h in zip(free, x, half)}


def fit_host(rows, source: str = "") -> dict:
    """Fit the host model on the usable fit rows; returns the fit (cpu_model.fit) plus rows used / skipped."""
    usable = [r for r in rows if r["role"] == "fit"]
    if not usable:
        raise NpuMoeError(f"{source or 'the measurements'}: no rows with role fit")
    chips = sorted({r["chip"] for r in usable})
    if len(chips) != 1 or not chips[0].startswith("host-"):
        raise NpuMoeError(f"{source or 'the measurements'}: fit-device --platform cpu fits ONE host's rows (chip "
                          f"host-<key>); got chips {chips}")
    busy = [r for r in usable if r.get("host_busy")]
    quiet = [r for r in usable if not r.get("host_busy")]
    if not quiet:
        raise NpuMoeError(f"{source or 'the measurements'}: all {len(usable)} fit rows are flagged host_busy; "
                          "measure again on a quiet host")
    ops, y = [host_op(r) for r in quiet], np.array([r["measured_s"] for r in quiet], float)
    res = cpu_model.fit(ops, y)
    res["intervals"] = _intervals(ops, y, res)
    res.update(chip=chips[0], rows_used=[r["id"] for r in quiet], n_busy_skipped=len(busy))
    return res


def write_fit(res: dict, out_dir, measurements: str) -> Path:
    """DIR/cpu-fit.yaml: the cpu platform with fitted values (see module doc)."""
    raw = yaml.safe_load((PLATFORM_DIR / "cpu.yaml").read_text())
    params = {r: raw[r] for r in ("npu", "cpu")}
    fill_host_params(params)
    p, iv = res["params"], res["intervals"]
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    src = (f"fitted by fit-device --platform cpu on {len(res['rows_used'])} fit rows of {measurements} "
           f"({res['n_busy_skipped']} host_busy rows skipped), {stamp}")
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
                         "host_busy_skipped": res["n_busy_skipped"], "free_parameters": list(res["free"]),
                         "fit_median_abs_err": res["median_abs_err"], "fit_worst_abs_err": res["worst_abs_err"],
                         "rms_log": res["rms_log"], "created": stamp})
    path = Path(out_dir) / FIT_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text("# FITTED host model (devices/cpu_fit.py); every number in host_model is fitted on measured rows\n"
                   + yaml.safe_dump(out, sort_keys=False))
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


__all__ = ["read_rows", "check_row", "host_op", "fit_host", "write_fit", "load_host_model", "FIT_FILE"]
