"""Models loaded once per process, per (checkpoint, dtype): what lets a warm sweep worker skip loading per cell.

A cached model is handed out again only while its checkpoint files (name, size, mtime) and its in-memory weights
(each parameter's storage and version counter) are unchanged, and detached from the workbench first, so a cell
sees what a fresh `load_model` would give it. Prepared expert weights (weight_cache.py) live on the model and are
reused with it.
"""
from __future__ import annotations

from npumoe_lab.core.cpu_features import resolve_dtype
from npumoe_lab.execution.experts import detach
from npumoe_lab.models.loading import load_model, resolve_model_dir

_CACHE: dict = {}


def _files_stamp(path) -> tuple:
    return tuple((p.name, p.stat().st_size, p.stat().st_mtime_ns) for p in sorted(path.iterdir()) if p.is_file())


def _weights_stamp(model) -> tuple:
    return tuple((p.data_ptr(), p._version) for p in model.parameters())


def cached_load(name_or_path="tiny", dtype=None):
    """(model, tokenizer) as `load_model(name_or_path, dtype)` gives them (dtype None/"auto": this CPU's fast dtype),
    loaded once per process."""
    path = resolve_model_dir(name_or_path)
    torch_dtype = resolve_dtype(dtype)
    key = (str(path.resolve()), torch_dtype)
    hit = _CACHE.get(key)
    if hit is not None and hit[0] == _files_stamp(path) and hit[1] == _weights_stamp(hit[2][0]):
        detach(hit[2][0])
        return hit[2]
    loaded = load_model(path, dtype=torch_dtype)
    _CACHE[key] = (_files_stamp(path), _weights_stamp(loaded[0]), loaded)
    return loaded


def clear() -> None:
    _CACHE.clear()


__all__ = ["cached_load", "clear"]
