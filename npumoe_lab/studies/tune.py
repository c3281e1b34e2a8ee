"""`npumoe-lab tune`: the plan that meets a drop-rate or a TTFT budget, searched over the plan knobs.

1. Candidates: the default knobs plus a seeded random sample of the search space (tiers, percentile, group size,
   residency rule, hot threshold; `space` overrides any axis with the values to try, validated by PlanKnobs).
2. Score (simulation, no numerics): each candidate's plan replays the same routing through the engine
   (`sim.replay`): modeled TTFT and energy on the platform, drop rate of the replayed routing ("replayed"). With a
   model, the routing is recorded once from dropless prefills of calibration-workload text (real routing is bursty
   per chunk: routing sampled token by token from the popularity underestimates drops ~100x on the bundled
   model); with a geometry, it is sampled from `routing`.
3. Confirm (real numerics, a model only): the best `confirm` candidates within the budget, and the default plan,
   prefill held-out text (lm-heldout windows): measured drop rate, modeled TTFT of the real run.
4. Choose: budget_drop -> the lowest confirmed TTFT with measured drop <= budget; budget_ttft_ms -> the lowest
   measured drop with confirmed TTFT <= budget. Writes plan.json, candidates.csv, front.csv (the Pareto front of
   TTFT x drop x energy, every knob of each point), front.png and tune.json.
"""
from __future__ import annotations

import json
import math
import time
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from npumoe_lab.studies.adaptive import recorded_chunks
from npumoe_lab.execution.calibrate import CalibrationProfile, calibration_documents
from npumoe_lab.execution.engine import PlanExecutor
from npumoe_lab.errors import NpuMoeError
from npumoe_lab.execution.calibrate import calibration_profile
from npumoe_lab.execution.experts import attach, detach
from npumoe_lab.execution.geometry import ModelGeometry
from npumoe_lab.planning.knobs import PlanKnobs
from npumoe_lab.models import describe, load_model
from npumoe_lab.planning.plan import build_plan
from npumoe_lab.viz.plot_helpers import figure
from npumoe_lab.execution.routing import RoutingRecorder
from npumoe_lab.execution.runtime import PrefillConfig, check_chunk, chunked_prefill, run_prefill
from npumoe_lab.sim.geometries import load_geometry
from npumoe_lab.sim.replay import replay_prefill
from npumoe_lab.sim.routing import parse_routing
from npumoe_lab.workloads.texts import DOMAINS
from npumoe_lab.workloads.lm_heldout import heldout_windows

SPACE = {"tiers": [1, 2, 3, 4], "percentile": [80, 90, 95, 99, 100], "group_size": [2, 4, 8, 16],
         "residency": ["cost", "threshold", "all"], "hot_threshold": [None, 0.5, 1.0, 2.0]}
# hot_threshold values are multiples of one balanced expert's load per chunk (chunk * top_k / n_experts) and apply
# to residency "threshold" only (None: build_plan's default, one balanced load)
KNOB_COLUMNS = tuple(SPACE)


def _check_budgets(budget_drop, budget_ttft_ms):
    if (budget_drop is None) == (budget_ttft_ms is None):
        raise NpuMoeError("give exactly one budget: budget_drop (a drop-rate share, e.g. 0.05) or budget_ttft_ms")
    for name, v in (("budget_drop", budget_drop), ("budget_ttft_ms", budget_ttft_ms)):
        if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v)
                              or v <= 0):
            raise NpuMoeError(f"{name}={v!r} must be a number > 0")
    if budget_drop is not None and budget_drop >= 1:
        raise NpuMoeError(f"budget_drop={budget_drop} is a share of the routed assignments: use a value in (0, 1)")


def _space(space) -> dict:
    space = dict(SPACE, **(space or {}))
    PlanKnobs.check_names(space, "tune knob")
    for name, values in space.items():
        if not isinstance(values, (list, tuple)) or not values:
            raise NpuMoeError(f"tune knob {name}: give a non-empty list of values to try, got {values!r}")
    return space


def candidates(space: dict, n: int, seed: int) -> list[dict]:
    """The default knobs first, then up to n distinct random points of the space (hot_threshold only with the
    threshold rule). Each point is checked by PlanKnobs (a bad value is an error naming the knob)."""
    rng = np.random.default_rng(seed)
    out, seen = [{}], {()}
    for _ in range(20 * n):
        if len(out) > n:
            break
        point = {k: v[rng.integers(len(v))] for k, v in space.items()}
        if point.get("residency") != "threshold":
            point.pop("hot_threshold", None)
        point = {k: (v.item() if hasattr(v, "item") else v) for k, v in point.items() if v is not None}
        key = tuple(sorted(point.items()))
        if key not in seen:
            seen.add(key)
            out.append(point)
    for p in out:
        PlanKnobs(**{k: v for k, v in p.items() if k != "hot_threshold"})
    return out


def _knobs(point: dict, specs, chunk: int) -> dict:
    """Build-plan knobs of a point: the hot threshold in tokens per chunk."""
    k = dict(point)
    if k.get("hot_threshold") is not None:
        k["hot_threshold"] = k["hot_threshold"] * chunk * specs[0].top_k / specs[0].n_experts
    return k


def pareto(df: pd.DataFrame, cols=("ttft_ms", "drop_rate", "energy_mj")) -> pd.Series:
    """True for the rows no other row beats in every column (all minimised) and strictly in one."""
    x = df[list(cols)].to_numpy(float)
    keep = [not np.any(np.all(x <= r, axis=1) & np.any(x < r, axis=1)) for r in x]
    return pd.Series(keep, index=df.index)


def _score(plans, geometry, config, routings, prompt_len) -> pd.DataFrame:
    """Replay every prompt's routing through each plan; means over the prompts."""
    rows = []
    for i, plan in enumerate(plans):
        ex = PlanExecutor(plan, [], npu_dtype=config.npu_dtype)
        runs = [replay_prefill(geometry, ex, config, r, prompt_len)[0].summary for r in routings]
        rows.append({"candidate": i, **{col: float(np.mean([scale * s[key] for s in runs])) for col, key, scale in
                                        (("ttft_ms", "ttft_s", 1e3), ("energy_mj", "energy_j", 1e3),
                                         ("drop_rate", "drop_rate", 1), ("pad_rate", "pad_rate", 1))}})
    return pd.DataFrame(rows)


def _recorded(model, tok, workload: str, chunk: int, prompt_len: int, n: int, seed: int) -> list[list[dict]]:
    """Routing of `n` dropless prefills of calibration text, [prompt][chunk] {layer: (index, weights, norms)}."""
    docs = [d for d in calibration_documents(tok, workload, chunk, prompt_len, n * prompt_len, seed)
            if len(d) == prompt_len][:n]
    if not docs:
        raise NpuMoeError(f"calibration workload {workload!r} has no document of {prompt_len} tokens")
    detach(model)
    out = []
    for ids in docs:
        with RoutingRecorder(model) as rec:
            chunked_prefill(model, torch.tensor([ids]), chunk, keep_logits=False)
        out.append(recorded_chunks(rec.records))
    return out


def _confirm(model, plan, prompts, config) -> dict:
    """Real numerics on held-out prompts: measured drop rate, modeled TTFT (mean over prompts)."""
    attach(model, plan, npu_dtype=config.npu_dtype)
    try:
        runs = [run_prefill(model, ids, config).summary for ids in prompts]
    finally:
        detach(model)
    return {"drop_rate_measured": float(np.mean([r["drop_rate"] for r in runs])),
            "ttft_ms_confirmed": 1e3 * float(np.mean([r["ttft_s"] for r in runs]))}


def tune(model="tiny", geometry=None, budget_drop=None, budget_ttft_ms=None, platform="m2-max", out=None,
         chunk=128, prompt_len=512, calib_workload="mixed", calib_tokens=4096, profile=None, routing=None,
         space=None, n_candidates=40, confirm=2, n_heldout=4, n_record=2, seed=0) -> dict:
    """Search the plan knobs for the budget (module docstring). `model`: a name or (model, tokenizer); with
    `geometry` (a name or config path) no weights are loaded and nothing is confirmed. `profile`: a
    CalibrationProfile or its directory (else calibrated, cached). Returns the report written to `out/tune.json`
    plus `plan` (the chosen Plan), `front` and `candidates` (DataFrames)."""
    t0 = time.perf_counter()
    _check_budgets(budget_drop, budget_ttft_ms)
    space = _space(space)
    for name, v in (("n_candidates", n_candidates), ("confirm", confirm), ("n_heldout", n_heldout),
                    ("n_record", n_record)):
        if isinstance(v, bool) or not isinstance(v, int) or v < (0 if name == "confirm" else 1):
            raise NpuMoeError(f"{name}={v!r} must be an integer >= {0 if name == 'confirm' else 1}")
    check_chunk(chunk)
    if prompt_len % chunk:
        raise NpuMoeError(f"prompt_len={prompt_len} must be a multiple of chunk={chunk}")
    if isinstance(profile, (str, Path)):
        profile = CalibrationProfile.load(profile)
    config = PrefillConfig(platform, chunk)
    if config.measured:
        raise NpuMoeError(f"platform {platform!r} is measured; the tuner scores plans on a modeled platform")
    mdl = tok = None
    if geometry is not None:
        name, _, geo = load_geometry(geometry)
        specs = list(geo.moe)
        source = parse_routing(routing or "tiny", specs, seed)
        profile = profile or source.calibration_profile(specs, chunk, seed)
        target, label = name, source.label
        routings = [source.chunks(specs, prompt_len, chunk, seed)]
    else:
        mdl, tok = model if isinstance(model, tuple) else load_model(model)
        specs, geo, target = describe(mdl), ModelGeometry.from_config(mdl.config), str(model if isinstance(model, str)
                                                                                       else "model")
        profile = profile or calibration_profile(mdl, tok, calib_workload, chunk, calib_tokens, seed)
        routings = _recorded(mdl, tok, calib_workload, chunk, prompt_len, n_record, seed)
        label = f"recorded: {len(routings)} dropless prefills of {calib_workload} calibration text"
    points = candidates(space, n_candidates, seed)
    plans, seen = [], set()
    for p in points:
        plan = build_plan(profile, mdl if mdl is not None else specs, config.platform, _knobs(p, specs, chunk))
        shape = json.dumps(plan.layers, sort_keys=True)    # the hash covers the knobs too: compare what runs
        if shape not in seen:                # knobs that build the same plan are scored (and shown) once
            seen.add(shape)
            plans.append(plan)
        else:
            plans.append(None)
    points = [p for p, plan in zip(points, plans) if plan is not None]
    plans = [plan for plan in plans if plan is not None]
    scored = _score(plans, geo, config, routings, prompt_len)
    for k in KNOB_COLUMNS:
        scored[k] = [p.get(k) for p in points]
    scored["knobs"] = [json.dumps(p, sort_keys=True) for p in points]
    scored["front"] = pareto(scored)
    key, budget = ("drop_rate", budget_drop) if budget_drop is not None else ("ttft_ms", budget_ttft_ms)
    rank = "ttft_ms" if budget_drop is not None else "drop_rate"
    ok = scored[scored[key] <= budget].sort_values([rank, "ttft_ms"])
    order = list(ok["candidate"]) or list(scored.sort_values(key)["candidate"])
    scored["drop_rate_measured"] = np.nan
    scored["ttft_ms_confirmed"] = np.nan
    if mdl is not None and confirm:
        drop_col, ttft_col = "drop_rate_measured", "ttft_ms_confirmed"
        prompts = [w for d in DOMAINS for w in heldout_windows(tok, d, prompt_len, 1)][:n_heldout]
        passed = 0
        # candidate 0 (the default knobs: the hand-set plan) always, then the ranked candidates until `confirm`
        # of them meet the budget on real numerics (at most 3 x confirm tried)
        for c in [0] + [c for c in order if c != 0][:3 * confirm]:
            for col, v in _confirm(mdl, plans[c], prompts, config).items():
                scored.loc[scored["candidate"] == c, col] = v
            r = scored[scored["candidate"] == c].iloc[0]
            passed += c != 0 and (r[drop_col] <= budget if budget_drop is not None else r[ttft_col] <= budget)
            if passed >= confirm:
                break
    else:
        drop_col, ttft_col = "drop_rate", "ttft_ms"      # a geometry: the replay's numbers are all there is
    pool = scored[scored[drop_col].notna()] if drop_col == "drop_rate_measured" else \
        scored[scored["candidate"].isin(order)]
    meets = pool[pool[drop_col] <= budget] if budget_drop is not None else pool[pool[ttft_col] <= budget]
    pick = meets.sort_values([ttft_col, drop_col] if budget_drop is not None else [drop_col, ttft_col]).head(1) \
        if len(meets) else pool.sort_values(drop_col if budget_drop is not None else ttft_col).head(1)
    best = int(pick["candidate"].iloc[0])
    default = scored[scored["candidate"] == 0].iloc[0]
    chosen = scored[scored["candidate"] == best].iloc[0]
    report = {"target": target, "platform": platform, "chunk": chunk, "prompt_len": prompt_len,
              "budget": {"drop_rate": budget_drop, "ttft_ms": budget_ttft_ms}, "met": bool(len(meets)),
              "chosen_knobs": points[best], "chosen": _row(chosen, drop_col, ttft_col),
              "default": _row(default, drop_col, ttft_col), "n_candidates": len(points),
              "front_size": int(scored["front"].sum()), "routing": label,
              "confirmed_on": "lm-heldout windows (real numerics)" if drop_col == "drop_rate_measured" else "none",
              "elapsed_s_measured": time.perf_counter() - t0, "plan": plans[best],
              "front": scored[scored["front"]].sort_values("ttft_ms"), "candidates": scored}
    if out is not None:
        _write(Path(out), report, scored)
    return report


def _row(r, drop_col, ttft_col) -> dict:
    return {"ttft_ms_modeled": float(r[ttft_col]), "drop_rate": float(r[drop_col]),
            "drop_source": "measured" if drop_col == "drop_rate_measured" else "replayed",
            "energy_mj_modeled": float(r["energy_mj"]), "ttft_ms_replay_modeled": float(r["ttft_ms"]),
            "drop_rate_replayed": float(r["drop_rate"])}


def _write(out: Path, report: dict, scored: pd.DataFrame) -> None:
    out.mkdir(parents=True, exist_ok=True)
    report["plan"].save(out / "plan.json")
    scored.to_csv(out / "candidates.csv", index=False)
    front = scored[scored["front"]].sort_values("ttft_ms")
    front.to_csv(out / "front.csv", index=False)
    fig, axes = figure(1, 1, 5.0, 3.6)
    ax = axes[0, 0]
    ax.scatter(scored["ttft_ms"], 100 * scored["drop_rate"], s=10, c="0.75", label="candidates")
    sc = ax.scatter(front["ttft_ms"], 100 * front["drop_rate"], s=28, c=front["energy_mj"], cmap="viridis",
                    label="Pareto front")
    fig.colorbar(sc, ax=ax, label="energy (mJ, modeled)")
    c = report["chosen"]
    ax.scatter([c["ttft_ms_replay_modeled"]], [100 * c["drop_rate_replayed"]], marker="*", s=120, c="red",
               label="chosen")
    ax.set_xlabel(f"TTFT (ms, modeled on {report['platform']})")
    ax.set_ylabel("dropped assignments (%, replayed routing)")
    ax.set_title(f"tune {report['target']}: TTFT x drop x energy (modeled)", fontsize=8)
    ax.legend(fontsize=6)
    fig.savefig(out / "front.png", dpi=130)
    (out / "tune.json").write_text(json.dumps({k: v for k, v in report.items()
                                               if k not in ("plan", "front", "candidates")}, indent=2,
                                              default=str))


def _parse_space(items) -> dict:
    space = {}
    for item in items or []:
        name, sep, values = item.partition("=")
        if not sep or not values:
            raise NpuMoeError(f"--space {item!r}: use NAME=V1,V2 (e.g. tiers=2,3)")
        space[name.replace("-", "_")] = [_value(v) for v in values.split(",")]
    return space


def _value(text: str):
    if text == "none":
        return None
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def _cli(args) -> int:
    report = tune(model=args.model, geometry=args.geometry, budget_drop=args.budget_drop,
                  budget_ttft_ms=args.budget_ttft_ms, platform=args.platform, out=args.out, chunk=args.chunk,
                  prompt_len=args.prompt_len, calib_workload=args.calib_workload, calib_tokens=args.calib_tokens,
                  routing=args.routing, profile=args.profile, space=_parse_space(args.space),
                  n_candidates=args.candidates, confirm=args.confirm, seed=args.seed)
    c, d = report["chosen"], report["default"]
    print(f"tune {report['target']} on {report['platform']}: {report['n_candidates']} candidates, "
          f"{report['front_size']} on the Pareto front, {report['elapsed_s_measured']:.1f} s (measured)")
    print(f"chosen knobs {report['chosen_knobs'] or '(defaults)'}: TTFT {c['ttft_ms_modeled']:.3f} ms (modeled), "
          f"drop {c['drop_rate']:.2%} ({c['drop_source']}), energy {c['energy_mj_modeled']:.3f} mJ (modeled)"
          + ("" if report["met"] else "  -- BUDGET NOT MET by any confirmed candidate"))
    print(f"default knobs: TTFT {d['ttft_ms_modeled']:.3f} ms (modeled), drop {d['drop_rate']:.2%} "
          f"({d['drop_source']})")
    if args.out:
        print(f"wrote {Path(args.out) / 'plan.json'}, candidates.csv, front.csv, front.png, tune.json")
    return 0


def register_cli(sub) -> None:
    p = sub.add_parser("tune", help="search plan knobs for a drop-rate or TTFT budget (Pareto front)")
    who = p.add_mutually_exclusive_group()
    who.add_argument("--model", default="tiny", help="model name or path (default tiny)")
    who.add_argument("--geometry", help="a geometry name or config.json: simulation only, nothing confirmed")
    b = p.add_mutually_exclusive_group(required=True)
    b.add_argument("--budget-drop", type=float, help="largest drop rate (share of routed assignments, e.g. 0.05)")
    b.add_argument("--budget-ttft-ms", type=float, help="largest modeled TTFT in ms")
    p.add_argument("--platform", default="m2-max")
    p.add_argument("--out", help="directory for plan.json, front.csv/png, candidates.csv, tune.json")
    p.add_argument("--chunk", type=int, default=128)
    p.add_argument("--prompt-len", type=int, default=512)
    p.add_argument("--calib-workload", default="mixed")
    p.add_argument("--calib-tokens", type=int, default=4096)
    p.add_argument("--profile", help="a calibration profile directory of this model (default: calibrate, cached)")
    p.add_argument("--routing", help="routing source with --geometry (default tiny; see `npumoe-lab simulate`)")
    p.add_argument("--space", action="append", metavar="KNOB=V1,V2", help="values to try for a knob (repeatable)")
    p.add_argument("--candidates", type=int, default=40, help="random candidates besides the defaults")
    p.add_argument("--confirm", type=int, default=2, help="top candidates confirmed with real numerics")
    p.add_argument("--seed", type=int, default=0)
    p.set_defaults(func=_cli)


__all__ = ["tune", "candidates", "pareto", "SPACE"]
