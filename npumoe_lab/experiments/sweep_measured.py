"""Which sweep cells time a measured platform (this host's `cpu`): those must not run beside each other. Two
workers timing the host at once are each other's load: every measured row of a `--workers 2` sweep came out
host_busy, TTFT up to 56 s against 0.09-0.15 s quiet. run_sweep runs them one at a time, after the
modeled cells have had the pool, and says so before it starts."""
from __future__ import annotations

import ast
from pathlib import Path

import yaml

from npumoe_lab.devices.platform import PLATFORM_DIR
from npumoe_lab.experiments.sweep_spec import read_notebook

PLATFORM_KEYS = ("platforms", "platform")


def notebook_defaults(notebook: Path) -> dict:
    """The literal values of the notebook's `parameters` cell (names assigned a non-literal are left out)."""
    nb = read_notebook(notebook)
    out = {}
    for cell in nb.cells:
        if "parameters" not in cell.get("metadata", {}).get("tags", []):
            continue
        try:
            body = ast.parse(cell.source).body
        except SyntaxError:
            continue
        for node in body:
            if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
                try:
                    out[node.targets[0].id] = ast.literal_eval(node.value)
                except ValueError:
                    pass
    return out


def platform_kind(name: str) -> str | None:
    """`measured` / `modeled` from the platform's YAML (its name, `name[overrides]`, or a YAML path); None when it
    cannot be told (the run itself will report a bad name)."""
    name = str(name).strip().split("[", 1)[0]
    path = Path(name) if name.endswith((".yaml", ".yml")) else PLATFORM_DIR / f"{name}.yaml"
    try:
        return (yaml.safe_load(path.read_text()) or {}).get("kind")
    except (OSError, yaml.YAMLError, AttributeError):
        return None


def measured_platforms(params: dict, defaults: dict) -> list[str]:
    """The measured platforms a cell with these parameters times."""
    value = next((src[k] for src in (params, defaults) for k in PLATFORM_KEYS if src.get(k) is not None), None)
    if value is None:
        return []
    names = value.split(",") if isinstance(value, str) else list(value)
    return [n.strip() for n in names if platform_kind(n) == "measured"]
