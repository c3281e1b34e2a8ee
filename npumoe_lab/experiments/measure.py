"""`npumoe-lab measure --device cpu|onnxruntime|coreml --out DIR`: a bucket grid of op-level micro-benchmarks on
this machine, written as measurement rows (docs/MEASUREMENTS.md schema, role `fit`) that `fit-device` fits.

Every row is ONE op as the engine runs it (never a whole forward's total, which is what validation compares):
- expert groups: the [G x C, H] static group GEMM chains over capacities, each called exactly as the engine's
  PlanExecutor calls it (`_group_call`: pre-packed oneDNN experts or one bmm per group, every static slot computed;
  through ONNX Runtime or Core ML when the device says so);
- attention at several contexts, the router, dispatch / pack / scatter (gather-scatter), the dynamic (cold) and HF
  experts at their actual loads, and each chunk's rest (embedding, norms, LM head: a call floor), each taken from
  the engine's own clock (execution/clock.py) in short prefills of a ONE-layer model of the Qwen3-30B-A3B geometry
  (its weights never fit a cache) and of the tiny geometry at the bundled model's depth (and two layers, so the
  per-layer and per-chunk floors separate).
Geometries: the bundled tiny model and Qwen3-30B-A3B (random weights). Each timing is the median over `repeats`
interleaved repeats; the host load over the timed calls is recorded (devices/hostload.py) and rows taken on a busy
host are flagged `host_busy` (fit-device and validate-device skip and count them).
"""
from __future__ import annotations

import json
import platform as _platform
import time
from pathlib import Path

import numpy as np
import torch
import yaml

from npumoe_lab.core.cpu_features import dtype_name, resolve_dtype, row_fields
from npumoe_lab.core.host_memory import keep_freed_memory
from npumoe_lab.devices import get_platform
from npumoe_lab.devices.cost import expert_ffn_cost
from npumoe_lab.devices.cpu_model import annotate, from_op
from npumoe_lab.devices.hostload import HostLoad
from npumoe_lab.devices.hostprofile import host_chip as _host_chip
from npumoe_lab.errors import NpuMoeError
from npumoe_lab.execution.experts import attach, detach
from npumoe_lab.execution.ops import Op
from npumoe_lab.execution.runtime import PrefillConfig, run_prefill
from npumoe_lab.experiments.geometry_model import bundled_depth, random_ids, random_model
from npumoe_lab.experiments.speed_anchor import anchor_s
from npumoe_lab.models import describe
from npumoe_lab.models.loading import TINY_MODEL_DIR
from npumoe_lab.planning.layout import ExecutionLayout
from npumoe_lab.results.atomic import atomic_open
from npumoe_lab.utils import host_description, progress

DEVICES = ("cpu", "onnxruntime", "coreml")
PATHS = {"cpu": "torch", "onnxruntime": "onnxruntime", "coreml": "coreml"}
GEOMETRIES = ("tiny", "qwen3-30b-a3b")
# engine op kind -> measurement kind of the schema
SCHEMA_KIND = {"attention": "attention", "router": "router", "dispatch": "gather_scatter", "pack": "gather_scatter",
               "scatter": "gather_scatter", "expert_group": "gemm", "experts_dynamic": "gemm", "experts_hf": "gemm",
               "shared_experts": "gemm", "other": "call_floor"}
MEASUREMENTS_FILE = "measurements.yaml"
MODES = ("hf", "dynamic", "static", "mixed")      # experts paths of the prefill grid (_set_mode)
# the tiny geometry adds one-expert groups (naive-npu's layout): their calls cost more inside a prefill, where the
# expert's weights come from memory, than a micro-benchmark's repeated call of one group
TINY_MODES = MODES + ("naive",)
FLUSH_BYTES = 64 << 20      # > any L3 of the CPUs seen here (32 MB): group rows are timed with cold caches


def grid(geometry: str, quick: bool = False) -> dict:
    """The bucket grid of one geometry: prefills (mode, layers, chunk, prompt) and group layouts (capacity, sizes)."""
    # The full grid spans the CPU loop's declared held-out grid (chunks 32-512, contexts to 2048: cpu_draw.py), so
    # a held-out run is priced inside the fit rows' range, never by extrapolation.
    if geometry == "tiny":
        # At the bundled model's own depth: its fp32 weights (~58 MB) do not fit this class of CPU's L3 (32 MB)
        # while one layer's (~18 MB with the embedding) does, so 1-layer prefills time every expert and attention
        # op with its weights in cache, and a real run streams them from memory each chunk (see cpu_model.py).
        depth = bundled_depth()
        chunks, prompt = ((64, 256) if quick else (64, 128, 256)), (256 if quick else 512)
        caps, sizes = ((1, 16, 64) if quick else (1, 4, 16, 64, 256)), (1, 4, 16)
        prefills = [(m, depth, c, prompt) for m in TINY_MODES for c in chunks] + \
            [("dynamic", 2, c, prompt) for c in chunks]
        if not quick:
            prefills += [(m, depth, c, prompt) for m in TINY_MODES for c in (32, 512)] + \
                [(m, depth, 512, 2048) for m in ("hf", "dynamic", "static")]
    else:
        chunks, prompt = ((256,) if quick else (128, 512)), (512 if quick else 1024)
        caps, sizes = ((8, 64) if quick else (8, 32, 128, 512)), ((1, 8) if quick else (1, 8, 32))
        prefills = [(m, 1, c, prompt) for m in MODES for c in chunks]
        if not quick:
            prefills += [(m, 1, 32, 128) for m in MODES] + [("static", 1, 512, 2048)]
    return {"prefills": prefills, "capacities": caps, "group_sizes": sizes}


def host_chip() -> str:
    """`host-<key>`: this CPU model, core count, torch build and threads (hostprofile.host_chip)."""
    return _host_chip()


def _median_iqr(ts) -> tuple[float, float]:
    q = np.percentile(np.asarray(ts, float), [25, 50, 75])
    return float(q[1]), float(q[2] - q[0])


def _row(rid, op, times, load, device, geometry, dtype_name, extra_work=None, note="", rec=None, extra=None):
    """One schema row from an ops.Op and its repeat timings; `rec`: its op record annotated with the op stream's
    context (cpu_model.annotate: a scatter's static rows and parts, a chunk rest's op count), kept in work.cost."""
    med, iqr = _median_iqr(times)
    host = load.columns(times)
    rec = rec or from_op(op)
    work = {"op": op.kind, "geometry": geometry, "weight_format": dtype_name, "calls": rec["calls"],
            "cost": {"flops": rec["flops"], "bytes": rec["bytes"], "calls": rec["calls"],
                     "gemm": None if rec["gemm"] is None else list(rec["gemm"]), "shape": list(rec["shape"]),
                     **({"context": dict(rec["context"])} if rec.get("context") else {})},
            **(extra_work or {})}
    return {"id": rid, "chip": host_chip(), "device": "npu" if device == "coreml" else "cpu",
            "path": PATHS[device], "kind": SCHEMA_KIND[op.kind], "work": work, "measured_s": med,
            "iqr_s": iqr, "repeats": len(times),
            "source": {"ref": f"npumoe-lab measure --device {device} on this host ({host_description()})",
                       "read": "median wall time over interleaved repeats, timed by the engine's clock"},
            "confidence": "L" if host["host_busy"] else "H", "role": "fit",
            "host_busy": bool(host["host_busy"]), "host_busy_reason": host["host_busy_reason"],
            "host_other_cores": float(host["host_other_cores"]), "host_probe_s": float(host["host_probe_s"]),
            "host_anchor_s": float(host["host_anchor_s"]),
            "note": note, **(extra or {})}


# -- the op grid ------------------------------------------------------------------------------------------------
def _static_layout(specs, chunk: int, resident_share: float = 1.0, load_factor: float = 2.0, size: int = 8):
    """Groups of `size` experts at `load_factor` x the mean load (what a plan of this chunk looks like); the first
    `resident_share` of the experts resident, the rest cold (one per group: the dynamic CPU path)."""
    groups = {}
    for s in specs:
        cap = max(8, int(load_factor * chunk * s.top_k / s.n_experts + 7) // 8 * 8)
        n_res = int(round(resident_share * s.n_experts))
        groups[s.layer] = [(tuple(range(i, min(i + size, n_res))), cap, True) for i in range(0, n_res, size)] + \
                          [((e,), 1, False) for e in range(n_res, s.n_experts)]
    return ExecutionLayout.build(specs, groups)


def _set_mode(model, mode, specs, chunk, npu_backend):
    """hf: HF's eager experts; dynamic: every expert cold (dropless); static: every expert resident; mixed: half
    resident at the mean load with overflow spilled to the CPU, half cold (cold, spill and scatter with parts);
    naive: every expert resident in its own group."""
    detach(model)
    if mode == "hf":
        model.set_experts_implementation("eager")
    elif mode == "dynamic":
        attach(model, ExecutionLayout.dropless(specs), cold="dynamic")
    elif mode == "mixed":
        attach(model, _static_layout(specs, chunk, 0.5, 1.0), npu_backend=npu_backend, spill=True)
    elif mode == "naive":
        attach(model, _static_layout(specs, chunk, size=1), npu_backend=npu_backend)
    else:
        attach(model, _static_layout(specs, chunk), npu_backend=npu_backend)


def prefill_rows(model, geometry, mode, n_layers, chunk, prompt, repeats, device, npu_backend, dtype_name, seed=0):
    """Rows of every op of short prefills of `model` (one row per event, median over repeats)."""
    specs = describe(model)
    _set_mode(model, mode, specs, chunk, npu_backend)
    ids = random_ids(model.config.vocab_size, prompt, seed)
    config = PrefillConfig(get_platform("cpu"), chunk, attention="cpu")
    run_prefill(model, ids[:, :chunk], config, measure_hf_experts=mode == "hf")        # untimed warm-up
    load, runs = HostLoad(), []
    for _ in range(repeats):
        load.probe(anchor_s)                  # the host's speed before each repeat (hostspeed.py), untimed
        with load.measuring():
            res = run_prefill(model, ids, config, measure_hf_experts=mode == "hf")
        runs.append(res.ops)
    if len({len(r) for r in runs}) != 1:
        raise NpuMoeError(f"{geometry} {mode} prefill recorded a different number of ops per repeat; rerun measure")
    rows, recs = [], annotate([from_op(op) for op, _, _ in runs[0]])
    # the prefill's total per repeat beside the anchor timed before it (on its first row): how far a prefill follows
    # the anchor repeat by repeat, kept for the record (cpu_fit.anchor_tracking reads the slope across prefills)
    reps = {"prefill_reps_s": [float(sum(t for _, _, t in r)) for r in runs],
            "host_anchor_reps_s": [float(a) for a in load.anchors]}
    reps = reps if len(reps["host_anchor_reps_s"]) == repeats and all(
        np.isfinite(reps["host_anchor_reps_s"])) else {}
    for i, (op, _, _) in enumerate(runs[0]):
        times = [r[i][2] for r in runs]
        prefill = f"{geometry}-{dtype_name}-L{n_layers}-{mode}-c{chunk}-p{prompt}"
        rid = f"{prefill}-k{op.chunk}-l{op.layer}-{op.name}"
        rows.append(_row(rid, op, times, load, device, geometry, dtype_name,
                         {"rows": chunk, "context": op.chunk * chunk, "layers": n_layers},
                         note=f"one {op.kind} op of a {n_layers}-layer {mode} prefill ({prompt} tokens in chunks "
                              f"of {chunk}), engine clock", rec=recs[i], extra=reps if i == 0 else None))
    return rows


@torch.inference_mode()
def group_rows(model, geometry, capacity, sizes, repeats, device, npu_backend, dtype_name):
    """Rows of static expert groups of `sizes` experts at `capacity`, each called as the engine calls it."""
    spec = describe(model)[0]
    sizes = [g for g in sizes if g <= spec.n_experts]
    groups, e = [], 0
    for g in sizes:
        if e + g > spec.n_experts:
            break
        groups.append((tuple(range(e, e + g)), capacity, True))
        e += g
    n_timed = len(groups)
    groups += [((x,), 1, False) for x in range(e, spec.n_experts)]      # the rest cold: not called here
    specs = describe(model)
    layout = ExecutionLayout.build(specs, {s.layer: groups if s.layer == spec.layer else
                                           [((x,), 1, False) for x in range(s.n_experts)] for s in specs})
    detach(model)
    attach(model, layout, npu_backend=npu_backend)
    ex = model._npumoe.executor
    handle = next(h for h in ex.handles if h.layer == spec.layer)
    lay, _, gweights = ex._compiled(handle)
    H, dtype = spec.hidden, next(model.parameters()).dtype
    g = torch.Generator().manual_seed(capacity)
    packed = torch.randn(lay.total_rows, H, generator=g).to(dtype)
    out = torch.empty_like(packed)
    timed = [(j, gs) for j, gs in enumerate(lay.groups) if gs.resident][:n_timed]
    calls = [ex._group_call(handle, j, gs, gweights[j], packed, out, None) for j, gs in timed]
    for fn, args in calls:       # warm-up (first calls pay kernel selection, allocation)
        fn(*args)
    load, times = HostLoad(), [[] for _ in calls]
    flush = torch.empty(FLUSH_BYTES // 4)
    for r in range(repeats):
        load.probe(anchor_s)
        order = list(range(len(calls)))
        order = order[r % len(order):] + order[:r % len(order)]     # interleaved: noise hits every size alike
        for j in order:
            fn, args = calls[j]
            flush.fill_(r + j)         # untimed: evict the group's weights, as a prefill's other layers do
            with load.measuring():
                t0 = time.perf_counter()
                fn(*args)
                times[j].append(time.perf_counter() - t0)
    rows = []
    for j, (_, gs) in enumerate(timed):
        G, C, I = len(gs.experts), gs.capacity, spec.intermediate
        cost = expert_ffn_cost(G, C, H, I, dtype_bytes=2, weight_bytes=2)
        op = Op(f"group{gs.id}", "expert_group", "npu", spec.layer, 0, cost, (G, C, H, I))
        rows.append(_row(f"{geometry}-{dtype_name}-group-G{G}-C{C}", op, times[j], load, device, geometry, dtype_name,
                         {"gemms": [[C, 2 * I, H, G], [C, H, I, G]], "rows": C},
                         note=f"one static group of {G} experts at capacity {C} (every slot computed), called as "
                              "PlanExecutor._group_call runs it"))
    detach(model)
    return rows


def check_args(device: str, geometries, repeats) -> None:
    """The flags, checked before any model is built."""
    if device not in DEVICES:
        raise NpuMoeError(f"unknown --device {device!r}; use one of {', '.join(DEVICES)}")
    if isinstance(repeats, bool) or not isinstance(repeats, int) or repeats < 3:
        raise NpuMoeError(f"--repeats must be an integer >= 3 (a median and a spread need several), got {repeats!r}")
    unknown = [g for g in geometries if g not in GEOMETRIES]
    if unknown or not geometries:
        raise NpuMoeError(f"unknown geometry {unknown or list(geometries)}; use some of {', '.join(GEOMETRIES)}")


def measure_device(device: str = "cpu", geometries=GEOMETRIES, repeats: int = 5, quick: bool = False,
                   seed: int = 0, dtype="auto") -> list[dict]:
    """Run the grid on `device` with models in `dtype` ("auto": this CPU's fast dtype; each dtype is fitted apart,
    so a run in fp32 is priced by fp32 rows); returns the rows (see module doc)."""
    check_args(device, geometries, repeats)
    if device == "coreml":
        raise NpuMoeError("measure_device runs the cpu and onnxruntime grids; Core ML: measure_coreml.measure_coreml")
    if device == "onnxruntime":
        from npumoe_lab.backends.onnxruntime import require_onnxruntime   # lazy: an optional, heavy dependency
        require_onnxruntime()
    npu_backend = None if device == "cpu" else device
    dtype = resolve_dtype(dtype)
    keep_freed_memory()             # no page faults in timed ops: core/host_memory.py (rows record host_malloc)
    rows = []
    for geom in geometries:
        spec = grid(geom, quick)
        models = {}
        todo = [("prefill", p) for p in spec["prefills"]] + [("groups", c) for c in spec["capacities"]]
        for what, item in progress(todo, desc=f"measure {geom}"):
            if what == "prefill":
                mode, n_layers, chunk, prompt = item
                if n_layers not in models:
                    models[n_layers] = random_model(geom, n_layers, dtype, seed)
                rows += prefill_rows(models[n_layers], geom, mode, n_layers, chunk, prompt, repeats, device,
                                     npu_backend, dtype_name(dtype), seed)
            else:
                model = models.get(1) or models.setdefault(1, random_model(geom, 1, dtype, seed))
                rows += group_rows(model, geom, item, spec["group_sizes"], repeats, device, npu_backend,
                                   dtype_name(dtype))
        del models
    return rows


def write_measurements(rows, out_dir, device: str, fallbacks=None, record=None, dtype: str = "auto") -> Path:
    """DIR/measurements.yaml (DIR/measurements-<dtype>.yaml for an explicit --dtype, so both dtypes' rows share
    one folder for fit-device): the rows, (key `host`) what they were measured on and (key `fallbacks`, Core ML) the
    graphs that fell off the NPU and were therefore not written as rows; `record`: the raw Core ML record, kept as
    DIR/coreml-record.json."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    host = {"chip": host_chip(), "device": device, "host": host_description(), "machine": _platform.machine(),
            "torch": str(torch.__version__), "torch_threads": torch.get_num_threads(),
            **row_fields(resolve_dtype(dtype)),
            "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "n_rows": len(rows),
            "n_host_busy": sum(bool(r.get("host_busy")) for r in rows)}
    path = out / (MEASUREMENTS_FILE if dtype in (None, "auto") else f"measurements-{dtype}.yaml")
    doc = {"description": f"MEASURED by npumoe-lab measure --device {device} on {host['host']} ({host['cpu_model']}, "
                          f"{host['torch_threads']} torch threads, {host['created']}); op-level micro-benchmarks, "
                          "role fit (docs/MEASUREMENTS.md)", "host": host,
           **({"fallbacks": list(fallbacks)} if fallbacks else {}), "rows": list(rows)}
    if not rows:
        raise NpuMoeError(f"no rows to write ({len(fallbacks or [])} graphs fell off the NPU); nothing written")
    if record is not None:
        with atomic_open(out / "coreml-record.json", "w") as fh:
            json.dump(record, fh, indent=1)
    with atomic_open(path, "w") as fh:
        yaml.safe_dump(doc, fh, sort_keys=False)
    return path


__all__ = ["measure_device", "write_measurements", "grid", "host_chip", "DEVICES", "GEOMETRIES"]
