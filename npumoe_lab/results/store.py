"""Results store: tidy result rows (and timelines) as parquet files, written atomically, one file per writer.

Layout contract (DESIGN.md "Result rows"): any folder tree; `write_rows` drops `rows-<hash>.parquet` files into it,
`load_results` concatenates every row file below a folder. Files are tagged in their parquet metadata
(`npumoe_lab.kind` = rows | timeline) so timelines and calibration profiles can live in the same tree. Hidden
(".x") and underscore ("_x") folders are skipped: the sweep runner archives superseded attempts in `_attempts/`.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import sys
from datetime import datetime, timezone
from pathlib import Path

import pandas as pd

from npumoe_lab.errors import NpuMoeError
from npumoe_lab.utils import provenance
from npumoe_lab.results.atomic import atomic_open, is_temp

KEY_COLUMNS = ("model", "workload", "variant", "platform", "prompt_len", "chunk", "repeat")
TIME_COLUMNS = ("ttft_s", "energy_j", "energy_per_token_mj", "cpu_busy_s", "cpu_cycles")
TIMING_SOURCES = ("measured", "modeled", "mixed")
PROVENANCE_COLUMNS = ("platform_profile", "platform_hash", "model_fingerprint", "plan_hash", "git_commit",
                      "versions", "host", "created")
# Stable dtypes whatever the writer produced (a column that is all-None in one file stays comparable).
STR_COLUMNS = ("model", "workload", "variant", "platform", "score_name", "timing_source", "workload_kind",
               "energy_source", "cycles_source", "cycles_definition", "run_id", *PROVENANCE_COLUMNS[:-1])
INT_COLUMNS = ("prompt_len", "chunk", "repeat", "group_size", "n_tiers", "cpu_threads", "schema_version")
FLOAT_COLUMNS = (*TIME_COLUMNS, "cpu_core_s", "n_npu_calls", "drop_rate", "pad_rate", "score", "nll", "top1_agree", "kl",
                 "accuracy_delta", "accuracy_ci_low", "accuracy_ci_high", "hot_threshold")
KIND_KEY = b"npumoe_lab.kind"
KNOB_COLUMNS = {"tiers": "n_tiers"}     # plan knobs stored under another column name (the figures' fixed names)


def knob_columns(knobs: dict) -> dict:
    """The result-row columns of swept plan knobs: each under its own name, `tiers` as the `n_tiers` column."""
    return {KNOB_COLUMNS.get(k, k): v for k, v in knobs.items()}



def write_rows(rows, out_dir, name: str | None = None) -> Path:
    """Write result rows (list of dicts or a DataFrame) to `out_dir/<name>.parquet` atomically; return the path.

    Without `name` the file is `rows-<content hash>.parquet`, so concurrent writers never collide and writing
    the same rows twice is idempotent. Missing provenance (git_commit, versions, host, created) is filled in.
    """
    df = _frame(rows, "result rows")
    missing = [c for c in KEY_COLUMNS if c not in df.columns]
    if missing:
        raise NpuMoeError(f"result rows lack key column(s) {', '.join(missing)}; every row needs "
                          f"{', '.join(KEY_COLUMNS)} (use None where one does not apply)")
    _check_timing_source(df)
    prov = {**provenance(), "created": datetime.now(timezone.utc).isoformat()}
    for col, value in prov.items():
        if col not in df.columns:
            df[col] = value
        else:
            missing = df[col].isna()
            if missing.any():        # a column already filled (a simulation's rows) is left as it is
                df[col] = df[col].where(~missing, value)
    df = normalize(df)
    return _write(df, out_dir, name, "rows")


def load_results(results_dir, include_failed: bool = False) -> pd.DataFrame:
    """All result rows below `results_dir` (recursive) as one DataFrame with stable dtypes. The rows of a sweep
    cell that did not finish (no DONE.json: failed, or still running) are left out unless `include_failed`: a
    failed cell's partial rows would otherwise be drawn as data (one line on stderr says how many were skipped)."""
    files, skipped = _files(results_dir, "rows", include_failed, with_skipped=True)
    if skipped:
        print(f"load_results: left out the rows of {len(skipped)} unfinished or failed sweep cell(s) under "
              f"{results_dir} (e.g. {skipped[0]}); load_results(..., include_failed=True) reads them",
              file=sys.stderr)
    if not files:
        raise NpuMoeError(f"no result rows (*.parquet written by write_rows) under {results_dir}; run "
                          f"`npumoe-lab run`/`npumoe-lab sweep --out {results_dir}` first, or pass the folder "
                          "that holds them")
    return normalize(pd.concat([_read(f) for f in files], ignore_index=True))


def write_timeline(events, out_dir, name: str | None = None) -> Path:
    """Write timeline events (Event dataclasses, dicts or a DataFrame) atomically as `timeline-<hash>.parquet`."""
    if not isinstance(events, pd.DataFrame):
        events = [dataclasses.asdict(e) if dataclasses.is_dataclass(e) else dict(e) for e in events]
    return _write(normalize(_frame(events, "timeline events")), out_dir, name, "timeline")


def load_timelines(results_dir) -> pd.DataFrame:
    files = _files(results_dir, "timeline")
    if not files:
        raise NpuMoeError(f"no timeline files under {results_dir}; write them with write_timeline(events, out_dir)")
    return normalize(pd.concat([_read(f) for f in files], ignore_index=True))


_STR_DTYPE = pd.Series([], dtype=object).astype("str").dtype     # what astype("str") gives: such a column is kept


def normalize(df: pd.DataFrame) -> pd.DataFrame:
    """Fixed dtypes for the known columns, JSON strings for dict/list cells, keys first and provenance last.
    A column already of its fixed dtype is kept as it is (a sweep writes a row file per cell: converting every
    column again was a third of the write)."""
    cols = {}
    for col in df.columns:
        s = df[col]
        if s.dtype == object:
            s = s.map(lambda v: json.dumps(v, sort_keys=True, default=str) if isinstance(v, (dict, list, tuple)) else v)
        if col in STR_COLUMNS or col.startswith("timing_source_"):
            if s.dtype != _STR_DTYPE:
                s = s.astype("str")
        elif col in INT_COLUMNS or col in FLOAT_COLUMNS:
            dtype = "Int64" if col in INT_COLUMNS else "float64"
            if s.dtype != dtype:
                try:
                    s = pd.to_numeric(s).astype(dtype)
                except (TypeError, ValueError) as exc:
                    raise NpuMoeError(f"column {col!r} must hold numbers ({dtype}); got values like "
                                      f"{s.dropna().head(3).tolist()} ({exc})") from None
        elif col == "created":
            try:
                s = pd.to_datetime(s, utc=True, format="ISO8601").astype("datetime64[us, UTC]")
            except (TypeError, ValueError) as exc:
                raise NpuMoeError(f"column 'created' must hold ISO-8601 timestamps ({exc})") from None
        cols[col] = s
    first = [c for c in (*KEY_COLUMNS, *FLOAT_COLUMNS) if c in cols]
    last = [c for c in PROVENANCE_COLUMNS if c in cols]
    middle = [c for c in cols if c not in first and c not in last]
    return pd.DataFrame({c: cols[c] for c in first + middle + last}, index=df.index, copy=True)


def _check_timing_source(df: pd.DataFrame) -> None:
    # DESIGN principle: a time or energy number is never stored without saying measured or modeled.
    timed, has_time = [], None
    for c in TIME_COLUMNS:          # column by column: a sub-frame of the timed columns cost more than the check
        given = df[c].notna().to_numpy() if c in df.columns else None
        if given is not None and given.any():
            timed.append(c)
            has_time = given if has_time is None else has_time | given
    if not timed:
        return
    src = df["timing_source"] if "timing_source" in df.columns else pd.Series([None] * len(df), index=df.index)
    bad = src[has_time & ~src.isin(TIMING_SOURCES).to_numpy()]
    if len(bad):
        raise NpuMoeError(f"rows with {', '.join(timed)} need timing_source in {TIMING_SOURCES}; got "
                          f"{sorted(set(map(str, bad)))}: say whether each number is measured or modeled")


def _frame(rows, what: str) -> pd.DataFrame:
    if isinstance(rows, pd.DataFrame):
        df = rows.reset_index(drop=True)
    elif isinstance(rows, dict):
        raise NpuMoeError(f"{what} must be a list of dicts or a DataFrame, got one dict; wrap it: [row]")
    else:
        try:
            df = pd.DataFrame(list(rows))
        except (TypeError, ValueError) as exc:
            raise NpuMoeError(f"{what} must be a list of dicts or a DataFrame ({exc})") from None
    if df.empty:
        raise NpuMoeError(f"no {what} to write: pass at least one row")
    return df


def _write(df: pd.DataFrame, out_dir, name: str | None, kind: str) -> Path:
    import pyarrow as pa
    import pyarrow.parquet as pq

    if out_dir is None:
        raise NpuMoeError(f"out_dir is None: pass the folder the {kind} files go to (a notebook run "
                          "interactively can skip writing when its `out_dir` parameter is None)")
    if name is not None and ("/" in name or name.startswith((".", "_"))):
        raise NpuMoeError(f"file name {name!r} must be a plain name not starting with '.' or '_' "
                          "(those are skipped by the loaders)")
    table = pa.Table.from_pandas(df, preserve_index=False)
    table = table.replace_schema_metadata({**(table.schema.metadata or {}), KIND_KEY: kind.encode()})
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink)
    data = sink.getvalue()
    if name is None:     # the file's own bytes name it: the same rows (and library versions) write the same file
        name = f"{kind}-{hashlib.sha256(data).hexdigest()[:16]}"
    path = Path(out_dir) / (name if name.endswith(".parquet") else f"{name}.parquet")
    with atomic_open(path, "wb") as fh:
        fh.write(memoryview(data))
    return path


def unfinished_cell(folder: Path) -> bool:
    """A sweep cell folder (DIR/cells/<key>/ beside DIR/sweep.json) without its DONE.json success marker."""
    folder = Path(folder)
    return (folder.parent.name == "cells" and (folder.parent.parent / "sweep.json").is_file()
            and not (folder / "DONE.json").is_file())


def _files(results_dir, kind: str, include_failed: bool = True, with_skipped: bool = False):
    import pyarrow.parquet as pq

    root = Path(results_dir)
    if not root.is_dir():
        raise NpuMoeError(f"results folder {root} does not exist; pass the --out folder of a run or sweep")
    found, skipped = [], []
    for folder, dirs, names in os.walk(root):
        dirs[:] = sorted(d for d in dirs if not d.startswith((".", "_")))  # archived attempts, caches
        if not include_failed and unfinished_cell(Path(folder)):
            if any(n.endswith(".parquet") for n in names):
                skipped.append(Path(folder))
            continue
        for n in sorted(names):
            path = Path(folder) / n
            if not n.endswith(".parquet") or is_temp(path):
                continue
            try:
                schema = pq.read_schema(path)
            except Exception as exc:  # noqa: BLE001 - any reader failure means the same to the user
                raise NpuMoeError(f"cannot read {path} ({exc}); it is not a complete parquet file: move it "
                                  "out of the results folder") from None
            tag = (schema.metadata or {}).get(KIND_KEY)
            untagged_rows = tag is None and kind == "rows" and set(KEY_COLUMNS) <= set(schema.names)
            if (tag or b"").decode() == kind or untagged_rows:
                found.append(path)
    return (found, skipped) if with_skipped else found


def _read(path: Path) -> pd.DataFrame:
    try:
        return pd.read_parquet(path)
    except Exception as exc:  # noqa: BLE001
        raise NpuMoeError(f"cannot read {path} ({exc}); move the broken file out of the results folder") from None
