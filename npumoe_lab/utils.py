"""Small shared helpers: progress bars, hashing, provenance of results."""
from __future__ import annotations

import functools
import hashlib
import json
import os
import platform
import socket
import subprocess
from pathlib import Path

from tqdm.auto import tqdm

from .errors import NpuMoeError

REPO_ROOT = Path(__file__).resolve().parent.parent
DATA_DIR = REPO_ROOT / "data"


def progress(iterable=None, **kwargs):
    """tqdm progress bar; silenced with NPUMOE_NO_PROGRESS=1 (tests, CI logs)."""
    kwargs.setdefault("disable", os.environ.get("NPUMOE_NO_PROGRESS") == "1")
    kwargs.setdefault("dynamic_ncols", True)
    return tqdm(iterable, **kwargs)


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


def sha256_json(obj) -> str:
    """Hash of a JSON-serialisable object in canonical form (sorted keys, no whitespace)."""
    blob = json.dumps(obj, sort_keys=True, separators=(",", ":"), default=str).encode()
    return hashlib.sha256(blob).hexdigest()


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
