"""Registry of workloads. `get_workload(name)`, `list_workloads()`; the contract is in `base.py`."""
from __future__ import annotations

from npumoe_lab.errors import NpuMoeError
from npumoe_lab.workloads.base import Sample, Workload
from npumoe_lab.workloads.fewshot import FewShotCls
from npumoe_lab.workloads.hf_tasks import BoolQ, HellaSwag
from npumoe_lab.workloads.lm_heldout import LmHeldout
from npumoe_lab.workloads.lm_next import LmNextToken
from npumoe_lab.workloads.ruler import MultiKey, VariableTracking

_FACTORIES = {
    "ruler-multikey": MultiKey,
    "ruler-vt": VariableTracking,
    "fewshot-cls": FewShotCls,
    "lm-heldout": LmHeldout,
    "lm-next": LmNextToken,
}


def _hf(name):
    def make(**kw):
        return {"boolq": BoolQ, "hellaswag": HellaSwag}[name](**kw)
    return make


_FACTORIES["boolq"] = _hf("boolq")
_FACTORIES["hellaswag"] = _hf("hellaswag")


def list_workloads() -> list[str]:
    return list(_FACTORIES)


def get_workload(name: str, **options) -> Workload:
    if name not in _FACTORIES:
        raise NpuMoeError(f"unknown workload {name!r}; valid workloads: {', '.join(_FACTORIES)}")
    accepted = workload_options(name)
    unknown = sorted(set(options) - set(accepted))
    if unknown:
        raise NpuMoeError(f"workload {name!r} has no option {', '.join(map(repr, unknown))}; its options: "
                          f"{', '.join(accepted) or 'none'}")
    return _FACTORIES[name](**options)


def workload_options(name: str) -> dict:
    """A workload's difficulty options and their defaults (its constructor's keyword arguments)."""
    import inspect
    if name not in _FACTORIES:
        raise NpuMoeError(f"unknown workload {name!r}; valid workloads: {', '.join(_FACTORIES)}")
    cls = {"boolq": BoolQ, "hellaswag": HellaSwag}.get(name, _FACTORIES[name])
    params = list(inspect.signature(cls.__init__).parameters.values())[1:]
    return {p.name: p.default for p in params if p.kind is p.POSITIONAL_OR_KEYWORD}


__all__ = ["Sample", "Workload", "get_workload", "list_workloads", "workload_options", "NpuMoeError"]
