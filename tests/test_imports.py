"""Package structure: the parts of npumoe_lab form layers (LAYERS, lowest first) and every import, at module level or
lazy inside a function, goes from a part to a part strictly below it, so there is no cycle between parts; no
package-internal import hides inside a function unless a comment says why (a heavy optional dependency, a command's
lazy load; one comment may head a block of such imports); the top level holds only the public API, errors and utils.

The reference is the source itself, read with `ast`: every `import`/`from ... import` of an npumoe_lab module, at
module level (the dependency graph) or inside a function (must carry a `#` comment on its line or the line above)."""
import ast
from pathlib import Path

import networkx as nx
import pytest

ROOT = Path(__file__).resolve().parent.parent / "npumoe_lab"


def _module(path: Path) -> str:
    parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _target(mod: str, node: ast.ImportFrom, is_pkg: bool) -> str:
    if node.level == 0:
        return node.module or ""
    base = mod.split(".") if is_pkg else mod.split(".")[:-1]
    base = base[:len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def _imports():
    """(module, target, line number, at module level, commented) for every internal import."""
    out = []
    for path in sorted(ROOT.rglob("*.py")):
        mod, src = _module(path), path.read_text().splitlines()
        tree = ast.parse("\n".join(src))
        in_function = {id(n) for f in ast.walk(tree) if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))
                       for n in ast.walk(f)}
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                targets = [_target(mod, node, path.name == "__init__.py")]
                if targets[0] == "npumoe_lab":          # `from .. import attach`: names of the package's API
                    targets = [f"npumoe_lab.{a.name}" for a in node.names]
            elif isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            else:
                continue
            line = node.lineno
            above = line - 2                  # the comment may head a contiguous block of imports
            while above >= 0 and src[above].strip().startswith(("from ", "import ")):
                above -= 1
            commented = "#" in src[line - 1] or (above >= 0 and src[above].strip().startswith("#"))
            for t in targets:
                if t.startswith("npumoe_lab"):
                    out.append((mod, t, line, id(node) not in in_function, commented))
    return out


def part(module: str) -> str:
    """The node of the dependency graph: a subpackage (npumoe_lab.devices) or a top-level module."""
    parts = module.split(".")
    return ".".join(parts[:2]) if len(parts) > 1 else module


# lowest first; a part may import only parts listed before it (docs/DESIGN.md draws the same order)
LAYERS = ["errors", "utils", "models", "devices", "results", "routing_data", "workloads", "train", "core", "planning", "graphs",
          "backends", "execution", "sim", "viz", "experiments", "studies", "cli", "api", "__main__"]
TOP_LEVEL = {"__init__", "__main__", "api", "errors", "utils"}


def _edges():
    """(part, imported part, where) for every import between different parts, lazy imports included."""
    for mod, target, line, top_level, _ in _imports():
        a, b = part(mod), part(target)
        if a != b and b != "npumoe_lab":
            yield a, b, f"{mod}:{line}" + ("" if top_level else " (inside a function)")


def test_no_import_cycle_between_parts():
    g = nx.DiGraph()
    for a, b, _ in _edges():
        g.add_edge(a, b)
    cycles = list(nx.simple_cycles(g))
    assert not cycles, "import cycles between parts of npumoe_lab:\n" + "\n".join(" -> ".join(c) for c in cycles)


def test_every_part_has_a_layer_and_imports_only_below_it():
    rank = {f"npumoe_lab.{name}": i for i, name in enumerate(LAYERS)}
    parts = {part(_module(p)) for p in ROOT.rglob("*.py")} - {"npumoe_lab"}
    assert not parts - set(rank), f"parts without a layer (add them to LAYERS): {sorted(parts - set(rank))}"
    upward = [f"{where}: {a} imports {b}" for a, b, where in _edges() if rank[b] >= rank[a]]
    assert not upward, "imports from a lower layer to a higher one:\n" + "\n".join(upward)


def test_top_level_is_the_public_api_errors_and_utils():
    top = {p.stem for p in ROOT.glob("*.py")}
    assert top <= TOP_LEVEL, f"modules at the top level of npumoe_lab that belong in a package: {sorted(top - TOP_LEVEL)}"


def test_internal_imports_inside_functions_say_why():
    hidden = [f"{m}:{line} imports {t}" for m, t, line, top, commented in _imports() if not top and not commented]
    assert not hidden, ("package-internal imports inside functions without a comment saying why (move them to the "
                        "top of the file, or say why they must stay lazy):\n" + "\n".join(hidden))


@pytest.mark.parametrize("case,expected", [("a.b", "a.b"), ("npumoe_lab.devices.cost", "npumoe_lab.devices"),
                                           ("npumoe_lab.utils", "npumoe_lab.utils")])
def test_part_names(case, expected):
    assert part(case) == expected
