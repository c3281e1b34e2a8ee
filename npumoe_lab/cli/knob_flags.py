"""The plan-knob flags (`--group-size` ...) of `plan`, `run` and `simulate`, generated from `PlanKnobs`' fields (their
help, choices and defaults), so a knob added to the dataclass is a flag everywhere at once."""
from __future__ import annotations

import argparse
from dataclasses import MISSING, fields

from npumoe_lab.planning.knobs import PlanKnobs

ALIASES = {"npu_memory_budget_bytes": ("--npu-memory-budget",)}     # earlier spellings that scripts use


def _flags(name: str) -> tuple[str, ...]:
    return ("--" + name.replace("_", "-"), *ALIASES.get(name, ()))


def _parse_multipliers(text: str) -> tuple:
    try:
        return tuple(float(x) for x in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a comma list of numbers (e.g. 4,2,1)") from None


def _parse_program_budget(text: str):
    if text.strip().lower() == "off":
        return "off"
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text!r}: give a whole number of resident programs >= 0, or 'off' "
                                         "(the unbounded plan)")
    return value


def add_knob_arguments(parser: argparse.ArgumentParser, with_defaults: bool = True, only=None) -> None:
    """One flag per knob (`--group-size` ...). with_defaults=False: unset flags stay None (the command's own plan or
    the variant decides); `only`: a subset of knob names."""
    for f in fields(PlanKnobs):
        if only is not None and f.name not in only:
            continue
        meta, default = f.metadata, (f.default if with_defaults else None)
        help_ = meta["help"] + (f" (default {f.default})" if f.default not in (None, False, MISSING) else "")
        if f.type in ("bool", bool):
            parser.add_argument(*_flags(f.name), dest=f.name, action="store_true", default=default or None,
                                help=meta["help"])
        elif f.name == "npu_program_budget":
            parser.add_argument(*_flags(f.name), dest=f.name, type=_parse_program_budget, default=default,
                                help=help_)
        elif f.name == "multipliers":
            parser.add_argument(*_flags(f.name), dest=f.name, type=_parse_multipliers, default=default, help=help_)
        else:
            kind = {"int": int, "float": float, "str": str}.get(str(f.type).split(" ")[0], float)
            parser.add_argument(*_flags(f.name), dest=f.name, type=kind, choices=meta["choices"], default=default,
                                help=help_)


def knobs_from_args(args: argparse.Namespace) -> dict:
    """The knob flags the user gave (None = not given)."""
    return {n: getattr(args, n) for n in PlanKnobs.names() if getattr(args, n, None) is not None}
