"""Content-addressed artifact cache: a built graph is stored under the hash of everything that determines it
(weights, shapes, options, tool versions), so rebuilding an unchanged plan only hashes weights and copies files."""
from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from pathlib import Path

import numpy as np
import torch

from npumoe_lab.utils import REPO_ROOT, library_versions, sha256_json

BUILDER_VERSION = 1  # bump when a builder's output changes for the same inputs


def default_root() -> Path:
    return Path(os.environ.get("NPUMOE_GRAPH_CACHE", REPO_ROOT / ".graph-cache"))


def weights_digest(*arrays) -> str:
    """sha256 over dtype, shape and bytes of each array (None allowed: absent bias)."""
    h = hashlib.sha256()
    for a in arrays:
        if a is None:
            h.update(b"none")
            continue
        a = a.detach().cpu().contiguous().numpy() if torch.is_tensor(a) else np.ascontiguousarray(a)
        h.update(f"{a.dtype.str}{a.shape}".encode())
        h.update(a.tobytes())
    return h.hexdigest()


def artifact_key(kind: str, weights: str, shapes, options: dict) -> str:
    versions = {k: v for k, v in library_versions().items() if k in ("torch", "coremltools", "onnxruntime", "python")}
    try:
        from importlib.metadata import version
        versions["onnx"] = version("onnx")
    except Exception:  # onnx absent: only matters for onnx artifacts, which then cannot be built anyway
        versions["onnx"] = None
    return sha256_json({"kind": kind, "weights": weights, "shapes": shapes, "options": options,
                        "versions": versions, "builder": BUILDER_VERSION})[:32]


class GraphCache:
    """`get_or_build(key, build, suffix)`: `build(tmp_path)` writes the artifact at tmp_path (a file or directory
    named `artifact<suffix>`); it is moved into the cache atomically, so an interrupted build never leaves a half
    artifact behind. The stored name depends on the key only: equal content is one artifact, whatever it is called."""

    def __init__(self, root=None):
        self.root = Path(root) if root is not None else default_root()

    def path(self, key: str, suffix: str = "") -> Path:
        return self.root / key / f"artifact{suffix}"

    def get(self, key: str, suffix: str = "") -> Path | None:
        p = self.path(key, suffix)
        return p if p.exists() else None

    def get_or_build(self, key: str, build, suffix: str = "") -> tuple[Path, bool]:
        """Returns (artifact path, cache_hit)."""
        hit = self.get(key, suffix)
        if hit is not None:
            return hit, True
        self.root.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{key}-", dir=self.root))
        try:
            build(tmp / f"artifact{suffix}")
            try:
                os.rename(tmp, self.root / key)  # atomic publish of the whole key directory
            except OSError:  # a concurrent build of the same key won: use it
                shutil.rmtree(tmp, ignore_errors=True)
            return self.path(key, suffix), False
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise


def copy_artifact(src: Path, dst: Path) -> None:
    """Copy a cached artifact out (hard links where the filesystem allows: rebuilds stay cheap)."""
    if dst.exists():
        shutil.rmtree(dst) if dst.is_dir() else dst.unlink()
    dst.parent.mkdir(parents=True, exist_ok=True)

    def link_or_copy(a, b):
        try:
            os.link(a, b)
        except OSError:
            shutil.copy2(a, b)
    if src.is_dir():
        shutil.copytree(src, dst, copy_function=link_or_copy)
    else:
        link_or_copy(src, dst)
