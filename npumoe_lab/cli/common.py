"""Flags several commands share, so each says the same thing everywhere."""
from __future__ import annotations

from npumoe_lab.errors import NpuMoeError

DTYPE_HELP = ("model dtype: auto (default; this CPU's fast dtype: bf16 with avx512_bf16/AMX, else fp32), fp32, bf16. "
              "The same policy in calibrate, plan and run; the model fingerprint does not depend on it")


def add_dtype_argument(p) -> None:
    p.add_argument("--dtype", default="auto", help=DTYPE_HELP)


def add_device_argument(p) -> None:
    p.add_argument("--device", default="cpu", choices=("cpu", "cuda", "mps"),
                   help="where the model's weights and numerics run (default cpu); timing rows stay measured only "
                        "for the host CPU")


# ---- list-valued flags: one spelling everywhere (`--prompt-len 256,512 --chunk 128,256`: one cell per pair) ----

def int_list(value, flag: str, minimum: int = 1) -> list[int]:
    """'256,512' (or an int, or a list) -> [256, 512]; every value >= minimum, else one error naming the flag."""
    items = value if isinstance(value, (list, tuple)) else str(value).split(",")
    out = []
    for item in items:
        try:
            n = int(str(item).strip())
        except ValueError:
            raise NpuMoeError(f"{flag} {value}: {item!r} is not a whole number; give one or a comma list, "
                              f"e.g. {flag} 256,512") from None
        if n < minimum:
            where = f" (in {flag} {value})" if len(items) > 1 else ""
            raise NpuMoeError(f"{flag} {n} must be an integer >= {minimum}{where}")
        out.append(n)
    if not out:
        raise NpuMoeError(f"{flag} is empty; give one value or a comma list")
    return out


def name_list(value, flag: str) -> list[str]:
    """'a,b' -> ['a', 'b'] (blank items dropped); an empty list is one error naming the flag."""
    items = value if isinstance(value, (list, tuple)) else str(value).split(",")
    out = [str(s).strip() for s in items if str(s).strip()]
    if not out:
        raise NpuMoeError(f"{flag} is empty; give one name or a comma list")
    return out


def positive(value, flag: str, minimum: int = 1):
    """One number >= minimum (None passes: a default decided later), else one error naming the flag."""
    if value is not None and value < minimum:
        raise NpuMoeError(f"{flag} {value}: must be >= {minimum}")
    return value


def cells(**lists) -> list[dict]:
    """Every combination of the lists, in flag order: cells(prompt_len=[256, 512], chunk=[128, 256]) -> 4 dicts."""
    import itertools
    keys = list(lists)
    return [dict(zip(keys, combo)) for combo in itertools.product(*(lists[k] for k in keys))]


def list_help(what: str, default) -> str:
    return f"{what}: one value or a comma list, one cell of rows per combination (default {default})"


def terminal_text(text: str, width: int = 118) -> str:
    """A markdown report for the terminal: prose and heading lines wrapped at `width` (tables and code kept)."""
    import textwrap
    out = []
    for line in text.splitlines():
        if len(line) <= width or line.lstrip().startswith(("|", "```")) or line.startswith("    "):
            out.append(line)
            continue
        lead = len(line) - len(line.lstrip())
        bullet = line.lstrip()[:2] if line.lstrip()[:2] in ("- ", "* ") else ""
        out.append(textwrap.fill(line.strip(), width, initial_indent="", subsequent_indent=" " * (lead + len(bullet)))
                   if not lead else textwrap.fill(line.strip(), width, initial_indent=" " * lead,
                                                  subsequent_indent=" " * (lead + len(bullet))))
    return "\n".join(out)


def over_cells(handler, a, lists: dict) -> int:
    """Run a one-cell command `handler(a)` once per combination of its list-valued flags. `lists`: attribute ->
    flag (ints: prompt_len, chunk; names otherwise), every value checked before the first cell runs. With several
    cells each writes under its own --out subfolder (prompt_len-512_chunk-128/...; load_results reads them all)."""
    import copy
    from pathlib import Path
    parsed = {}
    for attr, flag in lists.items():
        value = getattr(a, attr)
        if value is None:                      # a default the command decides
            parsed[attr] = [None]
        elif attr in ("prompt_len", "chunk"):
            parsed[attr] = int_list(value, flag)
        else:
            parsed[attr] = name_list(value, flag)
    grid = cells(**parsed)
    if len(grid) == 1:
        for k, v in grid[0].items():
            setattr(a, k, v)
        return handler(a)
    rc = 0
    for c in grid:
        b = copy.copy(a)
        label = "_".join(f"{k}-{v}" for k, v in c.items() if len(parsed[k]) > 1)
        for k, v in c.items():
            setattr(b, k, v)
        if getattr(a, "out", None):
            b.out = str(Path(a.out) / label)
        print(f"\n== {label.replace('_', ', ').replace('-', ' ', 1)}", flush=True)
        rc = max(rc, int(handler(b) or 0))
    return rc
