"""Run sweep cells on Dask distributed: a LocalCluster (processes, one thread each) or a running scheduler.

With --scheduler the workers must import `npumoe_lab` (same checkout/venv) and see the --out folder (shared
filesystem): each cell writes its notebook, rows and DONE.json there itself.
"""
from __future__ import annotations

import uuid

from npumoe_lab.errors import NpuMoeError


def dask_map(fn, tasks, workers: int, scheduler: str | None = None):
    """Yield (task, result or exception) as cells finish, like `sweep.local_map`."""
    if not tasks:
        return
    try:
        from distributed import Client, LocalCluster, as_completed
    except ImportError:
        raise NpuMoeError("--executor dask needs dask[distributed]; install the extra: "
                          "pip install -e '.[dask]'") from None
    cluster = None
    if scheduler:
        try:
            client = Client(scheduler, timeout="15s")
        except OSError as exc:
            raise NpuMoeError(f"cannot reach the Dask scheduler at {scheduler} ({exc}); start one "
                              "(`dask scheduler` + `dask worker ADDRESS`) or drop --scheduler") from None
    else:
        # processes: a notebook kernel per cell must not share a GIL; one thread each = one cell per worker
        cluster = LocalCluster(n_workers=workers, threads_per_worker=1, processes=True, dashboard_address=None)
        client = Client(cluster)
    try:
        # a fresh key per submission: a retried cell is a new run, never a cached result
        futures = {client.submit(fn, t, key=f"sweep-cell-{t['key']}-{uuid.uuid4().hex[:8]}"): t for t in tasks}
        for fut in as_completed(futures):
            try:
                yield futures[fut], fut.result()
            except Exception as exc:  # noqa: BLE001 - e.g. KilledWorker: recorded as a failed cell
                yield futures[fut], exc
    finally:
        client.close()
        if cluster is not None:
            cluster.close()
