"""Sweep definitions: a YAML file (with lm-eval style `include:`) -> a validated `SweepSpec` -> grid cells.

```yaml
include: base.yaml                  # optional (a path or a list), relative to this file; this file overrides
name: baselines-tiny                # optional; defaults to the file's stem
notebook: notebooks/05_baselines.py # .ipynb or jupytext .py; relative to this file or the repository root
parameters: {model: tiny, repeats: 3}          # fixed values for every cell
grid: {variant: [reference, npumoe], prompt_len: [256, 512]}   # cartesian product
```
Merging: `parameters` and `grid` merge name by name; a name set by the including file replaces the included
file's entry, also when it moves from `grid` to `parameters` (or back). `notebook` and `name` are replaced.
"""
from __future__ import annotations

import ast
import inspect
import itertools
import re
from dataclasses import dataclass
from pathlib import Path

import yaml

from npumoe_lab.errors import NpuMoeError
from npumoe_lab.planning.knobs import PlanKnobs
from npumoe_lab.utils import REPO_ROOT, sha256_json

KEYS = ("name", "include", "kind", "notebook", "parameters", "grid")
KINDS = ("notebook", "simulate")     # simulate: each cell is npumoe_lab.simulate(**params), no notebook or kernel
RESERVED = ("out_dir",)  # set per cell by the runner
KERNELSPEC = {"name": "python3", "display_name": "Python 3", "language": "python"}


@dataclass(frozen=True)
class SweepSpec:
    name: str
    notebook: Path              # the source notebook (.ipynb or jupytext .py)
    parameters: dict            # fixed values
    grid: dict                  # name -> list of values
    sources: tuple              # YAML files merged, the including file last
    notebook_params: tuple      # names defined in the notebook's `parameters` cell (simulate: its arguments)
    kind: str = "notebook"

    def cells(self) -> list[dict]:
        """One parameter dict per grid point (grid keys vary in YAML order, the last fastest)."""
        keys = list(self.grid)
        return [{**self.parameters, **dict(zip(keys, combo))}
                for combo in itertools.product(*(self.grid[k] for k in keys))]


def cell_key(params: dict) -> str:
    """Stable id of a cell: hash of its parameters (out_dir excluded); names its folder and resume marker."""
    return sha256_json({k: v for k, v in params.items() if k not in RESERVED})[:12]


def load_spec(yaml_path, overrides: dict | None = None) -> SweepSpec:
    """Read, merge and validate a sweep YAML; every problem is reported before anything runs. `overrides`
    {name: value} (the command line's, e.g. operating_point): set for every cell, replacing the YAML's entry."""
    path = Path(yaml_path).resolve()
    raw = _load(path, ())
    if overrides:
        _overlay(raw, {"parameters": dict(overrides), "grid": {}, "sources": []})
    if raw["kind"] not in KINDS:
        raise NpuMoeError(f"sweep {path}: kind {raw['kind']!r} is not one of {', '.join(KINDS)}")
    if raw["kind"] == "simulate":
        return _simulate_spec(path, raw)
    if raw["notebook"] is None:
        raise NpuMoeError(f"sweep {path} names no notebook; add `notebook: notebooks/<name>.ipynb`")
    notebook, where = raw["notebook"]
    found = next((p for p in notebook if p.is_file()), None)
    if found is None:
        raise NpuMoeError(f"notebook {notebook[0].name!r} named in {where} not found (looked at "
                          f"{', '.join(map(str, notebook))}); fix the path: it is relative to the YAML file or "
                          "the repository root")
    names = notebook_parameters(read_notebook(found), found)
    for reserved in RESERVED:
        if reserved not in names:
            raise NpuMoeError(f"notebook {found} has no `{reserved}` parameter; add `{reserved} = None` to its "
                              "parameters cell and write result rows there with write_rows(rows, out_dir)")
        if reserved in raw["parameters"] or reserved in raw["grid"]:
            raise NpuMoeError(f"sweep {path} sets `{reserved}`; remove it: the runner gives each cell its own folder")
    _check_names(raw, names, path, f"parameters of notebook {found.name} (its parameters cell defines: "
                 f"{', '.join(names)}); fix the name or add it to that cell")
    _check_grid(raw, path)
    _check_values(raw, path)
    return SweepSpec(name=str(raw["name"] or path.stem), notebook=found, parameters=raw["parameters"],
                     grid=raw["grid"], sources=tuple(raw["sources"]), notebook_params=tuple(names))


def _simulate_spec(path: Path, raw: dict) -> SweepSpec:
    """A sweep of simulate() calls: cell parameters are simulate's arguments (geometry, routing, platforms, ...)."""
    from npumoe_lab.sim.run import simulate   # lazy: the simulation layer only for `kind: simulate` sweeps
    names = [n for n in inspect.signature(simulate).parameters if n not in ("out", "timeline", "plan_knobs")]
    names += list(PlanKnobs.names())
    _check_names(raw, names, path, f"arguments of npumoe_lab.simulate ({', '.join(names)})")
    _check_grid(raw, path)
    _check_values(raw, path)
    return SweepSpec(name=str(raw["name"] or path.stem), notebook=None, parameters=raw["parameters"],
                     grid=raw["grid"], sources=tuple(raw["sources"]), notebook_params=tuple(names), kind="simulate")


def _check_names(raw: dict, names, path: Path, what: str) -> None:
    for section in ("parameters", "grid"):
        unknown = [k for k in raw[section] if k not in names]
        if unknown:
            raise NpuMoeError(f"{section} name(s) {', '.join(map(repr, unknown))} in sweep {path} are not {what}")


def _check_grid(raw: dict, path: Path) -> None:
    for key, values in raw["grid"].items():
        if not isinstance(values, list):
            raise NpuMoeError(f"grid.{key} in sweep {path} must be a list of values, got {values!r}; put a single "
                              "value under `parameters:`")
        if not values:
            raise NpuMoeError(f"grid.{key} in sweep {path} is an empty list, so the sweep has no cells; give it "
                              "at least one value or remove it")
        if len({sha256_json(v) for v in values}) != len(values):
            raise NpuMoeError(f"grid.{key} in sweep {path} lists a value twice ({values}); list each value once")
    if not raw["grid"]:
        raise NpuMoeError(f"sweep {path} has an empty grid (no cells to run); add `grid:` with at least one "
                          "list, e.g. `grid: {repeat: [0]}`")


def _check_values(raw: dict, path: Path) -> None:
    """The values with one meaning everywhere (decode settings, operating point), checked before any cell runs:
    the simulate / run checks' own one-line errors, naming the sweep entry."""
    from npumoe_lab.execution.decode_policy import check_decode   # lazy: only names a sweep sets are checked
    from npumoe_lab.sim.operating_point import check_operating_point   # lazy too: numpy and the planner
    checks = {"decode_tokens": lambda v: check_decode(v, "pipeline"), "decode_policy": lambda v: check_decode(0, v),
              "operating_point": check_operating_point}
    for section in ("parameters", "grid"):
        for name, check in checks.items():
            if name not in raw[section]:
                continue
            for value in raw[section][name] if section == "grid" else [raw[section][name]]:
                try:
                    check(value)
                except NpuMoeError as exc:
                    raise NpuMoeError(f"{section}.{name} in sweep {path}: {exc}") from None


def read_notebook(path: Path):
    """nbformat notebook from a .ipynb or a jupytext .py, with a kernelspec (papermill needs its language)."""
    import jupytext
    import nbformat

    path = Path(path)
    if path.suffix == ".ipynb":
        nb = nbformat.read(path, as_version=4)
    elif path.suffix == ".py":
        nb = jupytext.read(path)
    else:
        raise NpuMoeError(f"notebook {path} must be a .ipynb or a jupytext .py (percent format) file")
    nb.metadata.setdefault("kernelspec", dict(KERNELSPEC))
    nb.metadata.setdefault("language_info", {"name": "python"})
    return nb


def notebook_parameters(nb, path) -> list[str]:
    """Names assigned in the cell tagged `parameters`, in order."""
    cells = [c for c in nb.cells if "parameters" in c.get("metadata", {}).get("tags", [])]
    if not cells:
        raise NpuMoeError(f"notebook {path} has no cell tagged `parameters`; tag the cell holding the defaults "
                          "(jupytext: `# %% tags=[\"parameters\"]`)")
    source = "\n".join(c.source for c in cells)
    try:
        targets = []
        for node in ast.parse(source).body:
            if isinstance(node, ast.Assign):
                targets += node.targets
            elif isinstance(node, ast.AnnAssign):
                targets.append(node.target)
        names = [n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)]
    except SyntaxError:  # e.g. IPython magics in the cell: fall back to plain `name = ...` lines
        names = re.findall(r"^([A-Za-z_]\w*)\s*(?::[^=\n]*)?=(?!=)", source, flags=re.M)
    return list(dict.fromkeys(names))


class DuplicateKey(yaml.YAMLError):
    def __init__(self, what: str, line: int):
        super().__init__(what)
        self.what, self.line = what, line


class UniqueKeyLoader(yaml.SafeLoader):
    """safe_load that refuses a key given twice in one mapping (a parameter, a grid entry, `grid:` itself)."""

    def construct_mapping(self, node, deep=False):
        seen = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True)
            if key in seen:
                raise DuplicateKey(f"key {key!r}", key_node.start_mark.line + 1)
            seen.add(key)
        return super().construct_mapping(node, deep)


def _load(path: Path, stack: tuple) -> dict:
    if path in stack:
        raise NpuMoeError(f"include cycle: {' -> '.join(map(str, (*stack, path)))}; remove one include")
    if not path.is_file():
        where = f" (included from {stack[-1]})" if stack else ""
        raise NpuMoeError(f"sweep file {path}{where} not found; check the path")
    try:
        doc = yaml.load(path.read_text(), Loader=UniqueKeyLoader) or {}
    except DuplicateKey as exc:
        raise NpuMoeError(f"sweep file {path} line {exc.line}: {exc.what} is given twice; keep one (YAML would "
                          "silently keep the last)") from None
    except yaml.YAMLError as exc:
        raise NpuMoeError(f"sweep file {path} is not valid YAML ({exc})") from None
    if not isinstance(doc, dict):
        raise NpuMoeError(f"sweep file {path} must be a mapping with keys {', '.join(KEYS)}")
    unknown = [k for k in doc if k not in KEYS]
    if unknown:
        raise NpuMoeError(f"unknown key(s) {', '.join(map(repr, unknown))} in sweep file {path}; allowed: "
                          f"{', '.join(KEYS)}")
    for section in ("parameters", "grid"):
        if not isinstance(doc.get(section) or {}, dict):
            raise NpuMoeError(f"`{section}:` in sweep file {path} must be a mapping of name -> value")
    params, grid = dict(doc.get("parameters") or {}), dict(doc.get("grid") or {})
    both = sorted(set(params) & set(grid))
    if both:
        raise NpuMoeError(f"{', '.join(both)} set in both parameters and grid of {path}; keep one")

    merged = {"name": None, "kind": "notebook", "notebook": None, "parameters": {}, "grid": {}, "sources": []}
    includes = doc.get("include") or []
    for inc in [includes] if isinstance(includes, str) else includes:
        _overlay(merged, _load((path.parent / str(inc)).resolve(), (*stack, path)))
    notebook = None
    if doc.get("notebook"):
        rel = Path(str(doc["notebook"]))
        notebook = ((path.parent / rel).resolve(), (REPO_ROOT / rel).resolve()), path
    _overlay(merged, {"name": doc.get("name"), "kind": doc.get("kind"), "notebook": notebook, "parameters": params,
                      "grid": grid, "sources": []})
    merged["sources"] = merged["sources"] + [path]
    return merged


def _overlay(merged: dict, layer: dict) -> None:
    """Apply `layer` over `merged` in place: a name set by the layer replaces it in either section."""
    for name, value in layer["parameters"].items():
        merged["grid"].pop(name, None)
        merged["parameters"][name] = value
    for name, value in layer["grid"].items():
        merged["parameters"].pop(name, None)
        merged["grid"][name] = value
    for key in ("name", "kind", "notebook"):
        if layer.get(key):
            merged[key] = layer[key]
    merged["sources"] += layer["sources"]
