"""Small shared helpers: progress bars, hashing, provenance of results."""
from __future__ import annotations

import contextlib
import functools
import gc
import hashlib
import json
import os
import platform
import socket
import subprocess
from pathlib import Path

from tqdm.auto import tqdm

from npumoe_lab.errors import NpuMoeError

REPO_ROOT = Path(__file__).resolve().parent.parent
DATA_DIR = REPO_ROOT / "data"


OFF_VALUES = ("off", "0", "no", "false")


def switched_on(env: str) -> bool:
    """False where the environment variable `env` says off (NPUMOE_RELAXED_GC, the draw and plan caches)."""
    return os.environ.get(env, "on").strip().lower() not in OFF_VALUES


# Reference cycles are collected when allocations outrun frees by threshold0 container objects (CPython's default
# is 700). A simulation allocates hundreds of thousands of short-lived containers (pickled plans, row dicts), and
# each collection that reaches the oldest generation scans every object the process holds (~300k once torch and
# pandas are imported): ~30 % of a warm sweep cell's CPU in one process; the 10k sweep command took 1.30x the CPU
# cold, 1.16x warm, at CPython's thresholds (docs/PERFORMANCE.md, measured side by side). Cycles are still
# collected at the relaxed thresholds, so memory stays bounded; only their frequency drops.
RELAXED_GC_THRESHOLDS = (50_000, 20, 100)


@contextlib.contextmanager
def relaxed_gc(thresholds: tuple[int, int, int] = RELAXED_GC_THRESHOLDS):
    """Raise the cyclic garbage collector's thresholds for the duration (never lowering one a caller set higher),
    then restore them exactly, also after an exception. Results do not depend on it; usable as a decorator.
    NPUMOE_RELAXED_GC=off leaves the thresholds alone (to measure what the relaxation saves, side by side)."""
    before = gc.get_threshold()
    if switched_on("NPUMOE_RELAXED_GC"):
        gc.set_threshold(*(max(a, b) for a, b in zip(before, thresholds)))
    try:
        yield
    finally:
        gc.set_threshold(*before)


def progress(iterable=None, **kwargs):
    """tqdm progress bar; silenced with NPUMOE_NO_PROGRESS=1 (tests, CI logs)."""
    kwargs.setdefault("disable", progress_off())
    kwargs.setdefault("dynamic_ncols", True)
    return tqdm(iterable, **kwargs)


def progress_off() -> bool:
    """NPUMOE_NO_PROGRESS=1 (tests, CI logs) or a sweep cell (NPUMOE_IN_SWEEP=1, set by the sweep for its kernels,
    whose output lands in the executed notebooks where a bar is only noise)."""
    return os.environ.get("NPUMOE_NO_PROGRESS") == "1" or os.environ.get("NPUMOE_IN_SWEEP") == "1"


@contextlib.contextmanager
def hf_progress():
    """transformers' own bars (weight loading) follow progress_off(); the previous setting is restored."""
    from transformers.utils import logging as hf_logging
    was = hf_logging.is_progress_bar_enabled()
    if progress_off():
        hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if was:
            hf_logging.enable_progress_bar()


def kernel_env() -> None:
    """Child kernels (papermill, sweeps) import this checkout's npumoe_lab whatever their working directory."""
    paths = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    if str(REPO_ROOT) not in paths:
        os.environ["PYTHONPATH"] = os.pathsep.join([str(REPO_ROOT), *paths])


@contextlib.contextmanager
def env_set(**values):
    """Environment variables set for the duration of the block (child processes started in it inherit them)."""
    saved = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def with_torch_threads(fn):
    """Adds a `threads=None` keyword: torch's intra-op threads for the call (restored after). Measured CPU times
    depend on it, so callers set it deliberately instead of inheriting whatever the process had."""
    @functools.wraps(fn)
    def wrapper(*args, threads=None, **kwargs):
        if threads is None:
            return fn(*args, **kwargs)
        import torch
        if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
            raise NpuMoeError(f"threads must be a positive integer (torch intra-op threads); got {threads!r}")
        prev = torch.get_num_threads()
        torch.set_num_threads(threads)
        try:
            return fn(*args, **kwargs)
        finally:
            torch.set_num_threads(prev)
    return wrapper


def canonical_json(obj) -> str:
    """A JSON-serialisable object's canonical text (sorted keys, no whitespace): what sha256_json hashes."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), default=str)


def sha256_json(obj) -> str:
    """Hash of a JSON-serialisable object in canonical form (sorted keys, no whitespace)."""
    return hashlib.sha256(canonical_json(obj).encode()).hexdigest()


@functools.lru_cache(maxsize=1)
def git_commit() -> str:
    try:
        out = subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], cwd=REPO_ROOT,
                             capture_output=True, text=True, timeout=5)
        commit = out.stdout.strip() or "unknown"
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=REPO_ROOT,
                               capture_output=True, text=True, timeout=5).stdout.strip()
        return commit + ("-dirty" if dirty else "")
    except Exception:  # not a git checkout (e.g. an installed wheel)
        return "unknown"


@functools.lru_cache(maxsize=1)
def library_versions() -> dict:
    from importlib.metadata import PackageNotFoundError, version
    out = {"python": platform.python_version()}
    for pkg in ("torch", "transformers", "numpy", "coremltools", "onnxruntime"):
        try:
            out[pkg] = version(pkg)
        except PackageNotFoundError:
            out[pkg] = None
    return out


def host_description() -> str:
    """e.g. 'linux-x86_64 2 cpu (hostname)'."""
    return f"{platform.system().lower()}-{platform.machine()} {os.cpu_count()}cpu ({socket.gethostname()})"


def provenance() -> dict:
    return {"git_commit": git_commit(), "versions": json.dumps(library_versions(), sort_keys=True),
            "host": host_description()}


def cache_dir() -> Path:
    """The workbench's cache (calibration profiles, host profiles, graphs): $NPUMOE_CACHE_DIR, else the older name
    $NPUMOE_CACHE, else this checkout's own .cache/npumoe-lab (git-ignored: a fresh clone starts cold, not with
    another checkout's calibrations), else (an installed package, no checkout) ~/.cache/npumoe-lab."""
    given = os.environ.get("NPUMOE_CACHE_DIR") or os.environ.get("NPUMOE_CACHE")
    if given:
        return Path(given)
    if (REPO_ROOT / ".git").exists():
        return REPO_ROOT / ".cache" / "npumoe-lab"
    return Path.home() / ".cache" / "npumoe-lab"
