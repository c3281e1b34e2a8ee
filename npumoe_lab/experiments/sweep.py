"""Notebook sweeps: run one papermill execution per grid cell, resumably, on a local pool or a Dask cluster.

Output layout (DIR = --out):
  DIR/sweep.json                       every run's spec and cells, merged under a lock (sweep_record.py)
  DIR/_sweep/<stem>-<hash>.ipynb        the notebook as run (jupytext .py converted, kernelspec set)
  DIR/cells/<key>/executed.ipynb       papermill's output notebook (keeps the traceback of a failure)
  DIR/cells/<key>/rows-*.parquet       the rows the notebook wrote with write_rows(rows, out_dir)
  DIR/cells/<key>/DONE.json            success marker, written atomically LAST; its presence skips the cell
  DIR/cells/<key>/FAILED.json          the error of the last attempt
  DIR/cells/<key>/_attempts/NNN/       earlier unfinished/failed attempts, moved aside (kept, not loaded)
A cell folder is locked (flock) while it runs, so a re-run never races an orphaned worker of a killed run.
"""
from __future__ import annotations

import fcntl
import itertools
import os
import re
import socket
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

from npumoe_lab.errors import NpuMoeError
from npumoe_lab.utils import env_set, kernel_env, progress, sha256_json
from npumoe_lab.results.atomic import atomic_open, write_json
from npumoe_lab.experiments.sweep_record import die_with_parent, merge_sweep_json
from npumoe_lab.experiments.sweep_spec import cell_key, load_spec, read_notebook

EXECUTORS = ("local", "dask")
# fresh kernels (papermill's own, one per cell) log nothing but errors: ipykernel's "running over TCP without
# encryption" warning is about a loopback socket the sweep itself opened (warm kernels use IPC sockets and never
# give it: warm_kernel.ipc_transport; tests/experiments/test_quiet_kernels.py checks both)
KERNEL_ARGS = ["--IPKernelApp.log_level=ERROR"]
DONE, FAILED = "DONE.json", "FAILED.json"


@dataclass
class CellOutcome:
    key: str
    params: dict
    dir: Path
    status: str                 # done | skipped | failed
    duration_s: float | None = None
    error: str | None = None


@dataclass
class SweepReport:
    name: str
    out_dir: Path
    done: list = field(default_factory=list)
    skipped: list = field(default_factory=list)
    failed: list = field(default_factory=list)
    remeasured: int = 0          # done cells run again by fresh=True (they count in `done`)

    @property
    def ok(self) -> bool:
        return not self.failed

    def summary(self) -> str:
        n = len(self.done) + len(self.skipped) + len(self.failed)
        again = f" ({self.remeasured} re-measured: --fresh)" if self.remeasured else ""
        lines = [f"sweep {self.name!r}: {n} cells: {len(self.done)} done{again}, {len(self.skipped)} skipped "
                 f"(already done), {len(self.failed)} failed; results in {self.out_dir}"]
        if self.failed:
            lines.append("failed cells (each executed.ipynb keeps the error; re-run the same command to retry):")
            lines += [f"  {c.key} {c.params}: {c.error}  ->  {c.dir / 'executed.ipynb'}" for c in self.failed]
        return "\n".join(lines)


def run_sweep(yaml_path, out_dir, workers: int = 1, executor: str = "local", scheduler: str | None = None,
              warm: bool = True, fresh: bool = False, overrides: dict | None = None):
    """Run every cell of the sweep that has no DONE.json; return a SweepReport (failed cells do not raise).
    `warm`: local workers run their cells in one kernel each (warm_kernel.py) instead of a fresh one per cell.
    `fresh`: also re-run the done cells that time a measured platform (their old attempt is moved to _attempts/),
    so no measured row is reused; modeled-only cells are deterministic and kept. Without it, done cells holding
    host_busy rows are reused and one stderr line says so. `overrides` {name: value}: set in every cell over the
    YAML's entry (sweep_spec.load_spec; part of each cell's key)."""
    if executor not in EXECUTORS:
        raise NpuMoeError(f"unknown executor {executor!r}; use one of {', '.join(EXECUTORS)}")
    if not isinstance(workers, int) or workers < 1:
        raise NpuMoeError(f"workers must be an integer >= 1, got {workers!r}")
    if scheduler and executor != "dask":
        raise NpuMoeError("--scheduler needs --executor dask")
    spec = load_spec(yaml_path, overrides)  # validates everything before anything runs
    out = Path(out_dir).resolve()
    notebook = _snapshot_notebook(spec, out / "_sweep") if spec.kind == "notebook" else None
    cells = [(cell_key(p), p) for p in spec.cells()]
    merge_sweep_json(out, {"name": spec.name, "sources": [str(s) for s in spec.sources], "kind": spec.kind,
                           "notebook": str(spec.notebook), "parameters": spec.parameters, "grid": spec.grid},
                     {k: p for k, p in cells})
    report = SweepReport(spec.name, out)
    tasks = []
    remeasure = _measured_keys(spec, cells) if fresh else set()
    for key, params in cells:
        cell_dir = out / "cells" / key
        if (cell_dir / DONE).exists() and key not in remeasure:
            report.skipped.append(CellOutcome(key, params, cell_dir, "skipped"))
        else:
            tasks.append({"key": key, "params": params, "cell_dir": str(cell_dir), "notebook": str(notebook),
                          "kind": spec.kind, "cwd": str(spec.notebook.parent if notebook else out),
                          "warm": warm and executor == "local" and spec.kind == "notebook",
                          "fresh": key in remeasure})
    report.remeasured = sum(1 for t_ in tasks if t_["fresh"] and (Path(t_["cell_dir"]) / DONE).exists())
    busy = [c for c in report.skipped if _has_busy_rows(c.dir)]
    if busy:
        _say(f"[sweep] {len(busy)} of the {len(report.skipped)} cells already done hold measured rows flagged "
             f"host_busy (taken on a busy host); they are reused as they are: add --fresh to re-measure them")
    if executor == "dask":
        from npumoe_lab.experiments.dask_executor import dask_map as run_all  # lazy: dask is an optional, heavy dependency
    else:
        run_all = local_map
    pooled, serial = _split_measured(spec, tasks, workers)
    bar = progress(total=len(cells), initial=len(report.skipped), desc=f"sweep {spec.name}", unit="cell")
    with bar:
        for task, result in itertools.chain(run_all(run_cell, pooled, workers, scheduler) if pooled else (),
                                            local_map(run_cell, serial, 1)):
            outcome = _outcome(task, result)
            getattr(report, outcome.status).append(outcome)  # done | skipped | failed
            bar.update(1)
            bar.set_postfix(failed=len(report.failed))
    in_process = workers == 1 or len(pooled) <= 1 or serial
    if any(t["warm"] for t in tasks) and in_process:   # this process's warm kernel: done with this sweep
        from npumoe_lab.experiments.warm_kernel import shutdown  # lazy: registers a papermill engine
        shutdown()
    return report


def _measured_keys(spec, cells: list) -> set:
    """Keys of the cells that time a measured platform (sweep_measured.py): what --fresh re-runs."""
    if spec.kind != "notebook":
        return set()
    from npumoe_lab.experiments.sweep_measured import measured_platforms, notebook_defaults  # lazy: reads the notebook
    defaults = notebook_defaults(spec.notebook)
    return {key for key, params in cells if measured_platforms(params, defaults)}


def _has_busy_rows(cell_dir: Path) -> bool:
    """Does a done cell hold a row flagged host_busy? (unreadable rows count as not busy: load_results reports them)"""
    import pyarrow.parquet as pq
    for path in cell_dir.glob("*.parquet"):
        try:
            table = pq.read_table(path, columns=["host_busy"]) if "host_busy" in pq.read_schema(path).names else None
        except (OSError, ValueError):
            continue
        if table is not None and any(bool(v) for v in table.column("host_busy").to_pylist() if v is not None):
            return True
    return False


def _split_measured(spec, tasks: list, workers: int) -> tuple[list, list]:
    """(cells for the pool, cells run one at a time here): with several workers, the cells that time a measured
    platform run alone, after the others (sweep_measured.py says why); one line on stderr says so up front."""
    if workers == 1 or spec.kind != "notebook" or not tasks:
        return tasks, []
    from npumoe_lab.experiments.sweep_measured import measured_platforms, notebook_defaults  # lazy: reads the notebook
    defaults = notebook_defaults(spec.notebook)
    serial = [t for t in tasks if measured_platforms(t["params"], defaults)]
    if serial:
        names = sorted({p for t in serial for p in measured_platforms(t["params"], defaults)})
        _say(f"[sweep] {len(serial)} of {len(tasks)} cells time the measured platform {', '.join(names)} on this "
             f"host: they run one at a time after the others ({workers} workers timing the host at once are each "
             "other's load, and their rows would all be host_busy)")
    return [t for t in tasks if t not in serial], serial


def run_cell(task: dict) -> dict:
    """Execute one cell (its notebook, or its simulate() call; runs in a worker process). Never raises for a
    cell's own error."""
    cell_dir = Path(task["cell_dir"])
    cell_dir.mkdir(parents=True, exist_ok=True)
    kernel_env()
    with _cell_lock(cell_dir):
        if (cell_dir / DONE).exists() and not task.get("fresh"):  # finished by another run meanwhile
            return {"status": "skipped"}
        _archive_attempt(cell_dir)
        started = time.time()
        _say(f"[sweep] cell {task['key']} started: {cell_label(task['params'])}")
        info = {"cell": task["key"], "params": task["params"], "notebook": task["notebook"],
                "host": socket.gethostname(), "started": _iso(started)}
        try:
            if task.get("kind") == "simulate":   # no notebook: the cell is one simulate() call writing its rows
                from npumoe_lab.sim.run import simulate  # lazy: torch and the engine only for `kind: simulate` sweeps
                with env_set(NPUMOE_IN_SWEEP="1"):   # the sweep's bar counts cells: no bar inside a cell
                    simulate(**task["params"], out=cell_dir)
            else:
                _run_notebook(task, cell_dir)
        except Exception as exc:  # noqa: BLE001 - a failed cell must not stop the sweep
            error, trace = _describe(exc)
            record_failure(cell_dir, {**info, "error": error, "traceback": trace,
                                      "duration_s": time.time() - started, "finished": _iso(time.time())})
            return {"status": "failed", "error": error, "duration_s": time.time() - started}
        duration = time.time() - started
        rows = sorted(p.name for p in cell_dir.glob("*.parquet") if not p.name.startswith("."))
        write_json(cell_dir / DONE, {**info, "duration_s": duration, "finished": _iso(time.time()),
                                     "row_files": rows})
        _say(f"[sweep] cell {task['key']} done in {duration:.0f} s: {cell_label(task['params'])}")
        return {"status": "done", "duration_s": duration}


def record_failure(cell_dir: Path, payload: dict) -> bool:
    """Write FAILED.json, best-effort: a cell without DONE.json is retried and never loaded anyway, so a full disk
    or a vanished folder must not crash the whole sweep (one line on stderr says what could not be written)."""
    try:
        write_json(Path(cell_dir) / FAILED, payload)
        return True
    except OSError as exc:
        _say(f"[sweep] cell {payload.get('cell')}: could not write {FAILED} ({exc.strerror or exc}); the cell "
             "counts as failed and re-runs next time")
        return False


def _run_notebook(task: dict, cell_dir: Path) -> None:
    import papermill as pm  # lazy: papermill and its kernels only for notebook sweeps

    # the kernel inherits NPUMOE_IN_SWEEP (a warm one when it starts): no progress bars in executed notebooks
    with env_set(NPUMOE_IN_SWEEP="1"):
        engine = {}
        if task.get("warm"):   # this worker's kernel: imports and loaded models carry over between cells
            from npumoe_lab.experiments.warm_kernel import ENGINE, warm_manager  # lazy: registers a papermill engine
            engine = dict(engine_name=ENGINE, km=warm_manager("python3", task["cwd"]))
        pm.execute_notebook(task["notebook"], str(cell_dir / "executed.ipynb"), kernel_name="python3",
                            parameters={**task["params"], "out_dir": str(cell_dir)}, cwd=task["cwd"],
                            progress_bar=False, extra_arguments=KERNEL_ARGS, **engine)


LABEL_FIRST = ("variants", "variant", "platforms", "platform", "workload", "prompt_len", "chunk")


def prewarm(yaml_path, out_dir, code: str, fresh: bool = False):
    """Start the warm kernel this process's next `run_sweep(yaml_path, out_dir, workers=1, fresh=fresh)` will use,
    and run `code` in it (e.g. the cells' imports and model load) while the caller goes on; returns a thread to join
    before the sweep (the first cell's namespace reset waits for `code` anyway). None when no cell is left to run or
    the sweep's cells are not notebooks."""
    spec = load_spec(yaml_path)
    cells = Path(out_dir).resolve() / "cells"
    again = _measured_keys(spec, [(cell_key(p), p) for p in spec.cells()]) if fresh else set()
    if spec.kind != "notebook" or all((cells / cell_key(p) / DONE).exists() and cell_key(p) not in again
                                      for p in spec.cells()):
        return None
    from npumoe_lab.experiments.warm_kernel import prewarm as start  # lazy: registers a papermill engine
    kernel_env()
    with env_set(NPUMOE_IN_SWEEP="1"):
        return start("python3", str(spec.notebook.parent), code)


def cell_label(params: dict) -> str:
    """What a cell runs, variant/platform/prompt first (the progress line a user waits on for minutes)."""
    keys = [k for k in LABEL_FIRST if k in params] + sorted(k for k in params if k not in LABEL_FIRST)
    return ", ".join(f"{k}={params[k]}" for k in keys if k not in ("model", "seed", "out_dir"))


def _say(line: str) -> None:
    from tqdm.auto import tqdm
    tqdm.write(line, file=sys.stderr)   # above a live bar (in-process cells), plain line in a pool worker


def local_map(fn, tasks, workers, scheduler=None):
    """Yield (task, result or exception) as cells finish: in this process for 1 worker, else a process pool."""
    if workers == 1 or len(tasks) <= 1:
        for task in tasks:
            try:
                yield task, fn(task)
            except Exception as exc:  # noqa: BLE001
                yield task, exc
        return
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor, as_completed

    # spawn: forking a parent that holds threads (tqdm, zmq) is unsafe
    with ProcessPoolExecutor(min(workers, len(tasks)), mp_context=multiprocessing.get_context("spawn"),
                             initializer=die_with_parent, initargs=(os.getpid(),)) as pool:
        futures = {pool.submit(fn, t): t for t in tasks}
        for fut in as_completed(futures):
            try:
                yield futures[fut], fut.result()
            except Exception as exc:  # noqa: BLE001 - e.g. a worker process killed
                yield futures[fut], exc


def _outcome(task: dict, result) -> CellOutcome:
    cell_dir = Path(task["cell_dir"])
    if isinstance(result, BaseException):  # the worker itself died: record it like a notebook failure
        error, trace = _describe(result)
        record_failure(cell_dir, {"cell": task["key"], "params": task["params"], "error": error,
                                  "traceback": trace, "finished": _iso(time.time())})
        result = {"status": "failed", "error": error}
    return CellOutcome(task["key"], task["params"], cell_dir, result["status"], result.get("duration_s"),
                       result.get("error"))


def _snapshot_notebook(spec, folder: Path) -> Path:
    import nbformat

    nb = read_notebook(spec.notebook)
    text = nbformat.writes(nb)
    path = folder / f"{spec.notebook.stem}-{sha256_json(text)[:12]}.ipynb"
    if not path.exists():
        with atomic_open(path, "w") as fh:
            fh.write(text)
    return path


@contextmanager
def _cell_lock(cell_dir: Path):
    with open(cell_dir / ".lock", "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)  # waits while another live process runs this cell
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _archive_attempt(cell_dir: Path) -> None:
    """Move a previous attempt's files (rows, notebook, FAILED.json) to _attempts/NNN so rows never double."""
    leftovers = [p for p in cell_dir.iterdir() if p.name not in (".lock", "_attempts")]
    if not leftovers:
        return
    attempts = cell_dir / "_attempts"
    dest = attempts / f"{len(list(attempts.glob('*'))) + 1:03d}" if attempts.exists() else attempts / "001"
    dest.mkdir(parents=True)
    # DONE.json first: a cell interrupted mid-move is then retried, never loaded as done without its rows
    for p in sorted(leftovers, key=lambda p: p.name != DONE):
        os.replace(p, dest / p.name)


def _describe(exc: BaseException) -> tuple[str, str]:
    ename, evalue = getattr(exc, "ename", None), getattr(exc, "evalue", None)
    error = f"{ename}: {evalue}" if ename else f"{type(exc).__name__}: {exc}"
    trace = "\n".join(getattr(exc, "traceback", None) or [str(exc)])
    return error, re.sub(r"\x1b\[[0-9;]*m", "", trace)


def _iso(t: float) -> str:
    return datetime.fromtimestamp(t, timezone.utc).isoformat()
