"""npumoe-lab: a research workbench for Mixture-of-Experts LLM prefill on static-shape NPUs (after NPUMoE).

Public API (names are fixed: notebooks and users' scripts depend on them):
    load_model(name_or_path, dtype=None) -> (model, tokenizer)      "tiny" = the bundled trained model
    attach(model, plan=None, **options) -> model                     workbench experts path (None = dropless)
    detach(model) -> model                                           back to HF's own experts implementation
    capture_routing(model, input_ids, attention_mask=None)           one RoutingRecord per MoE layer
    describe(model) -> list[MoELayerSpec]
    calibrate(model, tokenizer, workload=..., chunk=..., tokens=...) -> CalibrationProfile
    build_plan(profile, model, tiers=3, group_size=..., ...) -> Plan
    prefill(model, input_ids, chunk, platform=..., attention="npu") -> PrefillResult with a timeline
    run_experiment(...) -> pandas.DataFrame of result rows           (the `npumoe-lab run` command)
    simulate(geometry, routing, platforms, variants, ...) -> rows    paper-scale, no weights (`npumoe-lab simulate`)
    explore(model_or_geometry, profile=None, ...) -> ipywidgets app  the plan explorer (notebook 10_explorer)
"""
from __future__ import annotations

import importlib

__version__ = "0.1.0"

_LAZY = {
    "load_model": "models", "describe": "models", "model_fingerprint": "models",
    "attach": "execution.experts", "detach": "execution.experts",
    "capture_routing": "execution.routing",
    "calibrate": "execution.calibrate", "CalibrationProfile": "planning.profile",
    "build_plan": "planning.plan", "Plan": "planning.plan",
    "chunked_prefill": "execution.runtime",
    "get_platform": "devices", "list_platforms": "devices",
    "get_workload": "workloads", "list_workloads": "workloads",
    "run_experiment": "experiments.runner",
    "simulate": "sim.run", "load_geometry": "sim.geometries",
    "explore": "viz.explorer",
    "load_results": "results.store",
    "NpuMoeError": "errors",
    "VARIANTS": "planning.variants",
}


def __getattr__(name):  # import parts lazily: `import npumoe_lab` stays fast, and a missing part fails late
    if name in _LAZY:
        return getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
    if name == "prefill":
        return importlib.import_module(".api", __name__).prefill
    raise AttributeError(f"module 'npumoe_lab' has no attribute {name!r}")


def __dir__():
    return sorted(list(globals()) + list(_LAZY) + ["prefill"])
