"""Sweep cells reuse their process: one warm Jupyter kernel per local sweep worker runs every cell's notebook.

A fresh kernel per cell paid interpreter start-up, the torch/transformers/npumoe_lab imports and the model load
every time (~5 s of a ~20 s demo cell). Here papermill still executes each cell's notebook and writes
its `executed.ipynb` (the record of the cell), but into a kernel that stays up between cells: its imported modules
and its model cache (model_cache.py, reached through `notebook_helpers.load`) survive, while the notebook's own
namespace is cleared (IPython's reset, as `%reset -f`) before each cell, so a cell sees only what its notebook
defines. A kernel that died (or was killed with its cell) is replaced by a fresh one at the next cell.

Per-cell cost: `%reset -f` runs two full garbage collections (~0.5 s with torch and a model loaded) and waiting
for a client's readiness flushes IOPub for 0.2 s; the reset here (`kernel_reset`, run through the shell channel's
reply) skips both and takes ~0.01 s. Cycles left by a cell are collected by Python's own collector.
"""
from __future__ import annotations

import atexit
import shutil
import threading
from pathlib import Path

from papermill.clientwrap import PapermillNotebookClient
from papermill.engines import NBClientEngine, papermill_engines
from papermill.log import logger
from papermill.utils import merge_kwargs, remove_args

ENGINE = "npumoe-warm"
RESET = "__import__('npumoe_lab.experiments.kernel_reset', fromlist=['reset']).reset(get_ipython())"
_KERNELS: dict = {}       # (kernel name, cwd) -> AsyncKernelManager with a running kernel


def _run_sync(fn):
    from jupyter_core.utils import run_sync
    return run_sync(fn)


def ipc_transport() -> dict:
    """Kernel sockets as local IPC files in a private temp folder instead of TCP on localhost: nothing listens on
    a port of a shared machine, and ipykernel has no reason to print its "running over TCP without encryption"
    warning (once per kernel, into every sweep's and the demo's output)."""
    import tempfile
    return {"transport": "ipc", "ip": str(Path(tempfile.mkdtemp(prefix="npumoe-kernel-")) / "kernel")}


def warm_manager(kernel_name: str, cwd: str):
    """A running kernel for (kernel_name, cwd), started on first use, its user namespace cleared."""
    from jupyter_client.manager import AsyncKernelManager
    key = (kernel_name, str(cwd))
    km = _KERNELS.get(key)
    if km is not None and not _run_sync(km.is_alive)():
        shutdown(key)
        km = None
    if km is None:
        km = AsyncKernelManager(kernel_name=kernel_name, **ipc_transport())
        _run_sync(km.start_kernel)(cwd=str(cwd), extra_arguments=["--HistoryManager.hist_file=:memory:"])
        _KERNELS[key] = km
    else:
        _run_sync(_reset)(km)
    return km


def prewarm(kernel_name: str, cwd: str, code: str) -> threading.Thread:
    """Start the warm kernel of (kernel_name, cwd) now and run `code` in it from a background thread, so that its
    start-up (imports, a model load) overlaps the caller's own work. The first cell's namespace reset queues
    behind `code` in the kernel. Returns the thread (join it before relying on the kernel being idle)."""
    km = warm_manager(kernel_name, cwd)
    thread = threading.Thread(target=lambda: _run_sync(_execute)(km, code), name="npumoe-prewarm", daemon=True)
    thread.start()
    return thread


async def _execute(km, code: str, timeout: float = 300) -> None:
    """Run `code` in the kernel and wait for its reply on the shell channel (a request queues until the kernel
    reads it, so no readiness handshake; IOPub is not read: the code's output goes nowhere)."""
    kc = km.client()
    kc.start_channels()
    try:
        msg_id = kc.execute(code, silent=True, store_history=False)
        while True:
            reply = await kc.get_shell_msg(timeout=timeout)
            if reply["parent_header"].get("msg_id") == msg_id:
                break
        if reply["content"].get("status") != "ok":
            logger.warning("warm kernel: %s failed: %s", code.splitlines()[0][:80], reply["content"].get("evalue"))
    finally:
        kc.stop_channels()


async def _reset(km, timeout: float = 60) -> None:
    await _execute(km, RESET, timeout)


def shutdown(key=None) -> None:
    """Stop the warm kernel of `key` (all of them by default)."""
    for k in list(_KERNELS) if key is None else [key]:
        km = _KERNELS.pop(k, None)
        if km is not None:
            try:
                _run_sync(km.shutdown_kernel)(now=True)
            except Exception:  # noqa: BLE001 - already gone
                pass
            if km.transport == "ipc":                    # its private socket folder (ipc_transport)
                shutil.rmtree(Path(km.ip).parent, ignore_errors=True)


atexit.register(shutdown)


class WarmEngine(NBClientEngine):
    """papermill's nbclient engine on a kernel it does not own (`km=`): the kernel outlives the notebook, and the
    client's channels are closed after each one (nbclient leaves them open when it does not own the kernel)."""

    @classmethod
    def execute_managed_notebook(cls, nb_man, kernel_name, log_output=False, stdout_file=None, stderr_file=None,
                                 start_timeout=60, execution_timeout=None, **kwargs):
        kwargs = remove_args(["input_path", "timeout", "startup_timeout"], **kwargs)
        final = merge_kwargs(kwargs, timeout=execution_timeout, startup_timeout=start_timeout,
                             kernel_name=kernel_name, log=logger, log_output=log_output,
                             stdout_file=stdout_file, stderr_file=stderr_file)
        client = PapermillNotebookClient(nb_man, **final)
        try:
            return client.execute()
        finally:
            if client.kc is not None:
                client.kc.stop_channels()


papermill_engines.register(ENGINE, WarmEngine)

__all__ = ["warm_manager", "prewarm", "shutdown", "WarmEngine", "ENGINE"]
