"""Never lose work in sweeps: sweep.json merged under a lock by concurrent writers; a SIGKILLed multi-worker sweep
takes its pool workers and their kernels with it."""
from __future__ import annotations

import json
import multiprocessing
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil

from npumoe_lab.experiments.sweep_record import merge_sweep_json

FIX = Path(__file__).resolve().parents[1] / "fixtures"


def _writer(out, name, start):
    start.wait()
    for i in range(20):   # many interleaved read-modify-writes: a lost update would drop cells
        merge_sweep_json(Path(out), {"name": name, "grid": {"x": [i]}}, {f"{name}-{i}": {"x": i}})


def test_concurrent_sweeps_into_one_out_keep_every_cell(tmp_path):
    ctx = multiprocessing.get_context("spawn")
    start = ctx.Event()
    procs = [ctx.Process(target=_writer, args=(str(tmp_path), f"s{k}", start)) for k in range(3)]
    for p in procs:
        p.start()
    start.set()
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    record = json.loads((tmp_path / "sweep.json").read_text())
    assert set(record["cells"]) == {f"s{k}-{i}" for k in range(3) for i in range(20)}
    assert len(record["sweeps"]) == 60 and record["name"] in {"s0", "s1", "s2"}


def test_killed_multi_worker_sweep_takes_its_workers_with_it(tmp_path):
    (tmp_path / "slow.yaml").write_text(f"name: slow\nnotebook: {FIX / 'sweep_nb.py'}\n"
                                        "parameters: {sleep_s: 60.0}\ngrid: {x: [1, 2]}\n")
    out = tmp_path / "out"
    proc = subprocess.Popen([sys.executable, "-m", "npumoe_lab", "sweep", str(tmp_path / "slow.yaml"), "--out",
                             str(out), "--workers", "2"], env={**os.environ, "NPUMOE_NO_PROGRESS": "1"},
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    parent = psutil.Process(proc.pid)
    deadline = time.time() + 90
    family = []
    while time.time() < deadline:            # both cells running: 2 pool workers + their 2 kernels (+ helpers)
        assert proc.poll() is None
        family = parent.children(recursive=True)
        kernels = [p for p in family if "ipykernel" in " ".join(p.cmdline())]
        if len(kernels) == 2 and len(list(out.glob("cells/*/executed.ipynb"))) == 2:
            break
        time.sleep(0.2)
    assert len(family) >= 4, family
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    gone, alive = psutil.wait_procs(family, timeout=15)
    for p in alive:
        p.kill()
    assert not alive, [p.cmdline() for p in alive]
