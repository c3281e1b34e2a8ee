"""DIR/sweep.json, merged under a lock: several sweeps (or several runs of one) into the same --out each add their
spec and cells instead of the last writer replacing the others'. Also the guard that takes a pool's workers (and
their kernels) down with a killed parent."""
from __future__ import annotations

import fcntl
import json
import os
import threading
import time
from pathlib import Path

from npumoe_lab.utils import sha256_json
from npumoe_lab.results.atomic import write_json


def merge_sweep_json(out: Path, spec_entry: dict, cells: dict) -> dict:
    """Add this sweep's spec and cells to out/sweep.json (read-modify-write under flock); returns the record.
    Top-level name/notebook/parameters/grid are the latest writer's; `sweeps` lists every spec, `cells` all."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    with open(out / ".sweep.json.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            old = json.loads((out / "sweep.json").read_text())
        except (OSError, ValueError):
            old = {}
        sweeps = {sha256_json(s): s for s in old.get("sweeps", [])}
        sweeps.setdefault(sha256_json(spec_entry), spec_entry)
        record = {**spec_entry, "sweeps": list(sweeps.values()), "cells": {**old.get("cells", {}), **cells}}
        write_json(out / "sweep.json", record)
        return record


def die_with_parent(parent_pid: int, poll_s: float = 0.5) -> None:
    """Pool-worker initializer: when the sweep process that started this worker goes away (killed, even with
    SIGKILL), stop this worker's own children (the papermill kernel) and exit, instead of running on forever."""
    def watch():
        while os.getppid() == parent_pid:
            time.sleep(poll_s)
        try:
            import psutil
            kids = psutil.Process().children(recursive=True)
            for k in kids:
                k.terminate()
            psutil.wait_procs(kids, timeout=3)
            for k in kids:
                if k.is_running():
                    k.kill()
        finally:
            os._exit(1)
    threading.Thread(target=watch, name="die-with-parent", daemon=True).start()
