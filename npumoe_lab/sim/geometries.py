"""Geometry-only models: an HF `config.json` (bundled for the paper's three models, or any local one of a supported
family) turned into an HF config object on which `geometry.ModelGeometry` builds layer specs and op costs. No weights
are allocated: paper-scale models are simulated from their shapes and routing statistics alone.

`load_geometry(..., hf_config=False)` (what `simulate` asks for) reads a bundled geometry's facts as plain
attributes, without importing transformers (4 s of a CLI run's imports): the bundled files state every field the
geometry reads, and tests/sim/test_simulate.py holds the plain geometry equal to transformers' for each of them. A
config.json of the user's always goes through transformers (its defaults fill what the file leaves out)."""
from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

from npumoe_lab.errors import NpuMoeError
from npumoe_lab.execution.geometry import ModelGeometry
from npumoe_lab.utils import REPO_ROOT

GEOMETRY_DIR = REPO_ROOT / "data" / "geometries"


def list_geometries() -> list[str]:
    return sorted(p.stem for p in GEOMETRY_DIR.glob("*.json"))


def load_geometry(name_or_path, hf_config: bool = True) -> tuple[str, object, ModelGeometry]:
    """(name, HF config, ModelGeometry) of a bundled geometry name, a config.json, or a checkpoint directory.
    `hf_config=False`: a bundled geometry's config is its facts as attributes (no transformers; module docstring)."""
    p = Path(str(name_or_path))
    if p.is_dir():
        p = p / "config.json"
    if not p.is_file():
        bundled = GEOMETRY_DIR / f"{name_or_path}.json"
        if not bundled.is_file():
            raise NpuMoeError(f"unknown geometry {str(name_or_path)!r}: give one of {', '.join(list_geometries())}, "
                              "a config.json or a checkpoint directory holding one")
        p = bundled
    try:
        facts = json.loads(p.read_text())
    except json.JSONDecodeError as exc:
        raise NpuMoeError(f"{p} is not valid JSON ({exc}); pass a model's config.json") from None
    model_type = facts.get("model_type")
    if not model_type:
        raise NpuMoeError(f"{p} has no model_type; pass an HF config.json of a supported MoE family")
    facts = {k: v for k, v in facts.items() if not k.startswith("_") and k != "model_type"}
    bundled = p.parent.resolve() == GEOMETRY_DIR.resolve()
    if bundled and not hf_config:
        config = SimpleNamespace(model_type=model_type, **facts)
    else:
        from transformers import AutoConfig     # heavy (and torch): only for an HF config or a user's config.json
        try:
            config = AutoConfig.for_model(model_type, **facts)
        except ValueError as exc:
            raise NpuMoeError(f"{p}: model_type {model_type!r} is not known to transformers ({exc})") from None
    name = p.stem if bundled else (p.parent.name if p.name == "config.json" else p.stem)
    return name, config, ModelGeometry.from_config(config)
