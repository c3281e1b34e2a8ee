"""Helpers the notebooks call, so that each notebook stays a few thin cells: load a model with its tokenizer,
routing tables, dropless parity, result rows from `prefill` calls, one-knob sweeps, calibration per workload, skew
and hot-set tables, and writing rows when a notebook has an `out_dir`."""
from __future__ import annotations

from pathlib import Path

import pandas as pd

from npumoe_lab.errors import NpuMoeError
from npumoe_lab.utils import host_description
from npumoe_lab.experiments.model_cache import cached_load


def model_label(model) -> str:
    """The name result rows carry for a model argument ("tiny" or a checkpoint path -> its folder name)."""
    return "tiny" if str(model) == "tiny" else Path(str(model)).name


def load(model="tiny", dtype=None):
    """(model, tokenizer) with a tokenizer: every notebook needs text in, so a checkpoint without one is an error.
    Loaded once per process and dtype (model_cache.py: a warm sweep kernel reuses it across cells); dtype None =
    fp32, "auto" = this CPU's fast dtype (cpu_features.py)."""
    m, tok = cached_load(model, "fp32" if dtype is None else dtype)
    if tok is None:
        raise NpuMoeError(f"model {model!r} has no tokenizer files; the notebooks need a checkpoint with a "
                          "tokenizer (the bundled 'tiny' model has one)")
    return m, tok


def routing_counts(records) -> pd.DataFrame:
    """Assignments per expert (columns) per MoE layer (rows) from `capture_routing` records (real tokens only)."""
    import torch
    out = {}
    for r in records:
        idx = r.topk_idx[r.token_mask] if getattr(r, "token_mask", None) is not None else r.topk_idx
        out[f"layer {r.layer}"] = torch.bincount(idx.flatten(), minlength=r.router_logits.shape[1]).numpy()
    return pd.DataFrame(out).rename_axis("expert").T


def dropless_parity(model, input_ids) -> dict:
    """Logits of HF's own experts vs the workbench's dropless path on the same ids: max |diff| and top-1 agreement.
    Leaves the model detached (HF's experts)."""
    import torch

    # lazy: every notebook kernel imports these helpers; each loads only what it uses
    from npumoe_lab.execution.experts import attach, detach
    ids = torch.as_tensor(input_ids).reshape(1, -1)
    detach(model)
    with torch.no_grad():
        ref = model(input_ids=ids).logits.float()
        attach(model)
        try:
            ours = model(input_ids=ids).logits.float()
        finally:
            detach(model)
    return {"max_abs_diff": float((ref - ours).abs().max()),
            "top1_agree": float((ref.argmax(-1) == ours.argmax(-1)).float().mean()),
            "allclose": bool(torch.allclose(ref, ours, rtol=1e-4, atol=1e-4))}


def prefill_rows(results: dict, model: str, workload: str, variant: str, prompt_len: int, chunk: int,
                 plan=None) -> pd.DataFrame:
    """Result rows (the store's schema) from `{platform name: PrefillResult}` of `npumoe_lab.prefill` calls."""
    # lazy: every notebook kernel imports these helpers; each loads only what it uses
    from npumoe_lab.devices import get_platform
    rows = []
    for plat_name, res in results.items():
        plat = get_platform(plat_name)
        s = dict(res.summary)
        stats = getattr(res, "stats", None) or []
        routed = sum(st.routed for _, _, st in stats)
        slots = sum(st.slots for _, _, st in stats)
        rows.append({"model": model, "workload": workload, "variant": variant, "platform": plat_name,
                     "prompt_len": prompt_len, "chunk": chunk, "repeat": 0, **s,
                     "drop_rate": sum(st.dropped for _, _, st in stats) / routed if routed else 0.0,
                     "pad_rate": sum(st.padded for _, _, st in stats) / slots if slots else 0.0,
                     "platform_profile": plat.name, "platform_hash": plat.hash, "platform_kind": plat.kind,
                     "plan_hash": getattr(plan, "hash", None), "host": host_description()})
    return pd.DataFrame(rows)


def run_knob_sweep(model, knob: str, values, *, model_name: str | None = None, **run_kwargs) -> pd.DataFrame:
    """`run_experiment` once per value of one plan knob (tiers, group_size, hot_threshold, percentile, ...);
    rows are concatenated and carry the knob's value in a column of the knob's name (`n_tiers` for tiers).
    `model`: a name/path or a loaded (model, tokenizer) tuple (loaded once and reused)."""
    # lazy: every notebook kernel imports these helpers; each loads only what it uses
    from npumoe_lab.experiments.runner import PLAN_KNOBS, run_experiment
    from npumoe_lab.results.store import knob_columns
    if knob not in PLAN_KNOBS:
        raise NpuMoeError(f"{knob!r} is not a plan knob; sweep one of {', '.join(PLAN_KNOBS)}")
    values = list(values)
    if not values:
        raise NpuMoeError(f"no values given for {knob}; pass a non-empty list")
    if not isinstance(model, tuple):
        model_name = model_name or model_label(model)
        model = load(model)
    frames = []
    for v in values:
        df = run_experiment(model=model, model_name=model_name, **{knob: v}, **run_kwargs)
        frames.append(df.drop(columns=[knob], errors="ignore").assign(**knob_columns({knob: v})))
    return pd.concat(frames, ignore_index=True)


# the run parameters every knob notebook declares in its `parameters` cell (papermill's one name per value)
RUN_PARAMETERS = ("workload", "variants", "platforms", "prompt_len", "chunk", "n_samples", "repeats",
                  "calib_workload", "calib_tokens", "seed")


def knob_sweep(params: dict, knob: str, values) -> pd.DataFrame:
    """`run_knob_sweep` with the notebook's own parameters (`params`: its globals(): `model` and RUN_PARAMETERS),
    so no notebook restates the run's arguments."""
    missing = [n for n in ("model", *RUN_PARAMETERS) if n not in params]
    if missing:
        raise NpuMoeError(f"the notebook's parameters cell lacks {missing}; declare them (see 03_grouping)")
    return run_knob_sweep(load(params["model"]), knob, values, model_name=model_label(params["model"]),
                          **{n: params[n] for n in RUN_PARAMETERS})


def calibrate_workloads(model, tokenizer, workloads, chunk: int, tokens: int, seed: int = 0) -> dict:
    """{workload or domain name: CalibrationProfile} for each calibration text source."""
    # lazy: every notebook kernel imports these helpers; each loads only what it uses
    from npumoe_lab.execution.calibrate import calibrate
    return {w: calibrate(model, tokenizer, workload=w, chunk=chunk, tokens=tokens, seed=seed) for w in workloads}


def skew_table(profiles: dict) -> pd.DataFrame:
    """Per (calibration source, layer): Gini, top-1 share, experts covering 50% and 80% of the assignments."""
    frames = [p.summary().assign(calibration=name) for name, p in profiles.items()]
    df = pd.concat(frames, ignore_index=True)
    return df[["calibration", "layer", "n_experts", "routed", "gini", "top1_share", "experts_50", "experts_80"]]


def hot_set_stability(profiles: dict, k: int) -> pd.DataFrame:
    """Jaccard similarity of the top-k hottest experts, every pair of calibration sources x layer (long form)."""
    names = list(profiles)
    if len(names) < 2:
        raise NpuMoeError("hot-set stability compares calibration sources: pass at least two profiles")
    rows = []
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            for layer, j in profiles[a].hot_set_jaccard(profiles[b], k).items():
                rows.append({"a": a, "b": b, "layer": int(layer), f"jaccard_top{k}": float(j)})
    return pd.DataFrame(rows)


def maybe_write(rows, out_dir, name: str | None = None):
    """Write result rows with `write_rows` when the notebook's `out_dir` parameter is set; returns the path or None."""
    if out_dir is None:
        return None
    # lazy: every notebook kernel imports these helpers; each loads only what it uses
    from npumoe_lab.results.store import write_rows
    return write_rows(rows, out_dir, name=name)
