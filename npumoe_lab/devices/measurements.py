"""Measured device facts as data: the schema of data/measurements/*.yaml and its validating loader.

One YAML file per source or chip family: `{description, defaults: {...}, rows: [...]}`; `defaults` are merged into
every row (a row's own keys win). The schema (field meanings, units, the fit/validate rule) is docs/MEASUREMENTS.md.
`load_measurements(path_or_dir)` returns a DataFrame, one validated row per measurement; any bad row raises one
NpuMoeError naming the file, the row id and what is wrong.

Rule: only micro-benchmarks (MICRO_KINDS) may have role `fit`; whole-model measurements (WHOLE_KINDS) are
validation only, and so is every paper number.
"""
from __future__ import annotations

import math
import re
from pathlib import Path

import pandas as pd
import yaml

from npumoe_lab.errors import NpuMoeError
from npumoe_lab.devices.graph_cost import WEIGHT_FORMATS

MICRO_KINDS = ("gemm", "conv_chain", "gemv_stream", "call_floor", "power", "attention", "router", "gather_scatter",
               "mem_stream")
WHOLE_KINDS = ("model_forward", "moe_layer", "model_power")     # model_power: watts during a whole forward
POWER_KINDS = ("power", "model_power")
KINDS = MICRO_KINDS + WHOLE_KINDS
DEVICES = ("npu", "cpu")
PATHS = ("coreml", "direct", "onnxruntime", "torch", "accelerate")
ROLES = ("fit", "validate")
CONFIDENCE = ("H", "M", "L")
CHIPS = ("m1", "m1-pro", "m1-max", "m1-ultra", "m2", "m2-pro", "m2-max", "m2-ultra", "m3", "m3-pro", "m3-max",
         "m3-ultra", "m4", "m4-pro", "m4-max", "m5", "m5-pro", "m5-max", "a16", "a17-pro")
HOST_CHIP = re.compile(r"^host-[a-z0-9][a-z0-9_.-]*$")      # this machine: host-<host profile key>
REQUIRED = ("id", "chip", "device", "path", "kind", "work", "measured_s", "source", "confidence", "role")
# host rows (`npumoe-lab measure`, experiments/measure.py) also say how busy the host was and how spread the repeats
HOST_FIELDS = ("host_busy", "host_busy_reason", "host_other_cores", "host_probe_s", "host_anchor_s", "iqr_s",
               "repeats", "prefill_reps_s", "host_anchor_reps_s")
OPTIONAL = ("power_w", "energy_j", "note", "covers") + HOST_FIELDS
# op-level host rows add the engine op they time: work.op (ops.OP_KINDS) and work.cost (its recorded OpCost)
OP_WORK = ("op", "cost")
GEMM_WORK = ("gemms", "act_gemms", "weight_format", "calls", "activation_elems", "stream_bytes", "rows") + OP_WORK
FORWARD_WORK = ("geometry", "rows", "context", "calls", "layers", "weight_format", "lm_head", "gemms", "streams",
                "weight_passes") + OP_WORK
COLUMNS = ("id", "file", "chip", "device", "path", "kind", "role", "confidence", "measured_s", "power_w", "energy_j",
           "work", "source_ref", "source_read", "covers", "note", "host_busy", "host_probe_s", "host_anchor_s", "prefill_reps_s",
           "host_anchor_reps_s")


# libyaml's C loader where PyYAML has it (the same documents, ~10x faster on measure's 10k-row files), else Python's
_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def known_chip(chip) -> bool:
    return isinstance(chip, str) and (chip in CHIPS or bool(HOST_CHIP.match(chip)))


def _positive(v) -> bool:
    return not isinstance(v, bool) and isinstance(v, (int, float)) and math.isfinite(v) and v > 0


def _whole(v, minimum=1) -> bool:
    return not isinstance(v, bool) and isinstance(v, int) and v >= minimum


def _check_gemm_list(name, value, where):
    if not isinstance(value, list) or not all(isinstance(g, list) and len(g) == 4 and all(_whole(x) for x in g)
                                              for g in value):
        raise NpuMoeError(f"{where}: work.{name} must be a list of [M, N, K, count] whole numbers >= 1, "
                          f"got {value!r}")


def _check_op_work(work, where) -> None:
    """work.op + work.cost of an op-level host row: the engine op kind and the OpCost it recorded."""
    cost = work.get("cost")
    ok = isinstance(work.get("op"), str) and isinstance(cost, dict) and \
        all(isinstance(cost.get(k), (int, float)) and not isinstance(cost.get(k), bool) and cost[k] >= 0
            for k in ("flops", "bytes")) and _whole(cost.get("calls")) and \
        (cost.get("gemm") is None or (isinstance(cost["gemm"], list) and len(cost["gemm"]) == 3
                                      and all(_whole(x) for x in cost["gemm"]))) and \
        isinstance(cost.get("shape", []), list) and all(_whole(x, 0) for x in cost.get("shape", []))
    if not ok:
        raise NpuMoeError(f"{where}: an op-level row needs work.op (an engine op kind) and work.cost {{flops, bytes, "
                          f"calls, gemm: [M, N, K] or null, shape: [...]}}, got op={work.get('op')!r} cost={cost!r}")


def _check_work(work, kind, where) -> None:
    if not isinstance(work, dict):
        raise NpuMoeError(f"{where}: work must be a mapping (gemms + weight_format + calls, or geometry + rows + "
                          f"context + calls + weight_format), got {work!r}")
    if "op" in work or "cost" in work:
        _check_op_work(work, where)
    fmt = work.get("weight_format")
    if fmt not in WEIGHT_FORMATS:
        raise NpuMoeError(f"{where}: work.weight_format {fmt!r} is unknown; use one of {', '.join(WEIGHT_FORMATS)}")
    if not _whole(work.get("calls", 1)):
        raise NpuMoeError(f"{where}: work.calls must be a whole number >= 1, got {work.get('calls')!r}")
    if "geometry" in work:
        extra = set(work) - set(FORWARD_WORK)
        if extra:
            raise NpuMoeError(f"{where}: work has unknown keys {sorted(extra)} for a forward; allowed: "
                              f"{', '.join(FORWARD_WORK)}")
        if not (isinstance(work["geometry"], (dict, str)) and work["geometry"]):
            raise NpuMoeError(f"{where}: work.geometry must be an HF-style config mapping or a bundled geometry name")
        if not _whole(work.get("rows")):
            raise NpuMoeError(f"{where}: work.rows (tokens per call) must be a whole number >= 1")
        if not _whole(work.get("context", 0), 0):
            raise NpuMoeError(f"{where}: work.context (past tokens in the KV cache) must be a whole number >= 0")
        if "layers" in work and not _whole(work["layers"]):
            raise NpuMoeError(f"{where}: work.layers must be a whole number >= 1")
        for key in ("streams", "weight_passes"):
            if key in work and not _whole(work[key]):
                raise NpuMoeError(f"{where}: work.{key} must be a whole number >= 1, got {work[key]!r}")
        if work.get("rows", 0) % work.get("streams", 1):
            raise NpuMoeError(f"{where}: work.rows ({work['rows']}) must be a multiple of work.streams "
                              f"({work['streams']}): each stream gets rows / streams tokens")
        return
    if kind in WHOLE_KINDS:
        raise NpuMoeError(f"{where}: a {kind} row describes a whole forward: give work.geometry, rows, context")
    extra = set(work) - set(GEMM_WORK)
    if extra:
        raise NpuMoeError(f"{where}: work has unknown keys {sorted(extra)}; allowed: {', '.join(GEMM_WORK)} "
                          f"(or {', '.join(FORWARD_WORK)} for a forward)")
    if "stream_bytes" in work:
        if not _positive(work["stream_bytes"]) or set(work) - {"stream_bytes", "weight_format", "calls"}:
            raise NpuMoeError(f"{where}: a memory-stream work is stream_bytes (a positive byte count moved per call) "
                              "with weight_format and calls only")
        return
    if "gemms" not in work and "act_gemms" not in work:
        raise NpuMoeError(f"{where}: work needs gemms: [[M, N, K, count], ...] (or act_gemms, or stream_bytes) "
                          "or a geometry")
    for name in ("gemms", "act_gemms"):
        if name in work:
            _check_gemm_list(name, work[name], where)
    if "activation_elems" in work and not _positive(work["activation_elems"]):
        raise NpuMoeError(f"{where}: work.activation_elems must be a positive number")


def check_row(row: dict, where: str) -> dict:
    """One measurement row, validated; returns it flattened for the DataFrame."""
    missing = [f for f in REQUIRED if f not in row]
    if missing:
        raise NpuMoeError(f"{where}: missing field(s) {', '.join(missing)}; every row needs "
                          f"{', '.join(REQUIRED)} (docs/MEASUREMENTS.md)")
    unknown = set(row) - set(REQUIRED) - set(OPTIONAL)
    if unknown:
        raise NpuMoeError(f"{where}: unknown field(s) {', '.join(sorted(unknown))}; allowed: "
                          f"{', '.join(REQUIRED + OPTIONAL)}")
    checks = (("chip", known_chip(row["chip"]), f"one of {', '.join(CHIPS)} or host-<key>"),
              ("device", row["device"] in DEVICES, f"one of {', '.join(DEVICES)}"),
              ("path", row["path"] in PATHS, f"one of {', '.join(PATHS)}"),
              ("kind", row["kind"] in KINDS, f"one of {', '.join(KINDS)}"),
              ("role", row["role"] in ROLES, f"one of {', '.join(ROLES)}"),
              ("confidence", row["confidence"] in CONFIDENCE, f"one of {', '.join(CONFIDENCE)}"))
    for field, ok, what in checks:
        if not ok:
            raise NpuMoeError(f"{where}: unknown {field} {row[field]!r}; use {what}")
    if row["role"] == "fit" and row["kind"] in WHOLE_KINDS:
        raise NpuMoeError(f"{where}: a {row['kind']} row is a whole-model measurement and may only be role "
                          "validate (fit only on micro-benchmarks)")
    ms, pw = row["measured_s"], row.get("power_w")
    if ms is not None and not _positive(ms):
        raise NpuMoeError(f"{where}: measured_s must be a positive number of seconds (or null for a power row)")
    if pw is not None and not _positive(pw):
        raise NpuMoeError(f"{where}: power_w must be a positive number of watts")
    if ms is None and (row["kind"] not in POWER_KINDS or pw is None):
        raise NpuMoeError(f"{where}: measured_s is null; only a power row (kind power or model_power, with "
                          "power_w) may omit it")
    if row["kind"] in POWER_KINDS and pw is None:
        raise NpuMoeError(f"{where}: a power row needs power_w")
    if row.get("energy_j") is not None and not _positive(row["energy_j"]):
        raise NpuMoeError(f"{where}: energy_j must be a positive number of joules")
    src = row["source"]
    if not (isinstance(src, dict) and set(src) == {"ref", "read"} and all(isinstance(src[k], str) and src[k].strip()
                                                                           for k in src)):
        raise NpuMoeError(f"{where}: source must be {{ref: repository/path or URL, read: what was read there}}")
    _check_work(row["work"], row["kind"], where)
    probe, anchor = row.get("host_probe_s"), row.get("host_anchor_s")
    for name, v in (("host_probe_s", probe), ("host_anchor_s", anchor)):
        if v is not None and not (_positive(v) or (isinstance(v, float) and math.isnan(v))):
            raise NpuMoeError(f"{where}: {name} must be the host speed {'probe' if name == 'host_probe_s' else 'anchor'}"
                              "'s seconds (a positive number)")
    reps = {k: row.get(k) for k in ("prefill_reps_s", "host_anchor_reps_s")}
    for k, v in reps.items():
        if v is not None and not (isinstance(v, list) and v and all(_positive(x) for x in v)):
            raise NpuMoeError(f"{where}: {k} must be a list of positive seconds (one per repeat)")
    if (reps["prefill_reps_s"] is None) != (reps["host_anchor_reps_s"] is None) or \
            (reps["prefill_reps_s"] and len(reps["prefill_reps_s"]) != len(reps["host_anchor_reps_s"])):
        raise NpuMoeError(f"{where}: prefill_reps_s and host_anchor_reps_s come together, one value per repeat each")
    return {"id": row["id"], "chip": row["chip"], "device": row["device"], "path": row["path"], "kind": row["kind"],
            "role": row["role"], "confidence": row["confidence"], "measured_s": float(ms) if ms is not None else None,
            "power_w": None if pw is None else float(pw),
            "energy_j": None if row.get("energy_j") is None else float(row["energy_j"]), "work": row["work"],
            "source_ref": src["ref"], "source_read": src["read"], "covers": row.get("covers", ""),
            "note": row.get("note", ""), "host_busy": bool(row.get("host_busy", False)),
            "host_probe_s": None if probe is None else float(probe),
            "host_anchor_s": None if anchor is None else float(anchor),
            **{k: None if v is None else [float(x) for x in v] for k, v in reps.items()}}


def _files(path_or_dir) -> list[Path]:
    p = Path(path_or_dir)
    if p.is_dir():
        files = sorted([*p.glob("*.yaml"), *p.glob("*.yml")])
        if not files:
            raise NpuMoeError(f"{p}: no measurement files (*.yaml) in this folder")
        return files
    if p.is_file():
        return [p]
    raise NpuMoeError(f"measurements {str(p)!r} do not exist; pass a measurement YAML or a folder of them")


def _read_file(path: Path) -> list[dict]:
    try:
        doc = yaml.load(path.read_text(), Loader=_LOADER)
    except yaml.YAMLError as exc:
        raise NpuMoeError(f"{path}: not valid YAML ({str(exc).splitlines()[0]})") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("rows"), list) or not doc["rows"]:
        raise NpuMoeError(f"{path}: a measurement file is a mapping with a non-empty rows: list "
                          "(and optional description, defaults)")
    defaults = doc.get("defaults") or {}
    if not isinstance(defaults, dict):
        raise NpuMoeError(f"{path}: defaults must be a mapping of row fields")
    out = []
    for i, row in enumerate(doc["rows"]):
        if not isinstance(row, dict):
            raise NpuMoeError(f"{path}: row {i} is not a mapping of fields")
        merged = {**defaults, **row}
        rid = merged.get("id")
        if not isinstance(rid, str) or not rid:
            raise NpuMoeError(f"{path}: row {i} has no id (a unique non-empty string)")
        out.append({**check_row(merged, f"{path} row {rid!r}"), "file": str(path)})
    return out


def load_measurements(path_or_dir) -> pd.DataFrame:
    """All rows of a measurement file or folder, validated, ids unique across files (columns: COLUMNS)."""
    rows, seen = [], {}
    for f in _files(path_or_dir):
        for r in _read_file(f):
            if r["id"] in seen:
                raise NpuMoeError(f"{f} row {r['id']!r}: id already used in {seen[r['id']]}; ids must be unique")
            seen[r["id"]] = f
            rows.append(r)
    return pd.DataFrame(rows, columns=list(COLUMNS))
