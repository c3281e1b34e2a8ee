"""`npumoe-lab measure --device coreml` (macOS): the static expert-group graphs of the grid through Core ML on the
Neural Engine (CPU_AND_NE), placement checked, energy read where permitted, written as measurement rows.

Two halves, so the second is tested off macOS on a recorded fixture:
- `record_coreml` (Mac only) builds each group package (graphs/coreml.py), asks MLComputePlan where every op runs
  (backends/coreml.placement), times `repeats` predictions after a warm-up, and samples `powermetrics` around them
  when `sudo -n powermetrics` is permitted; it returns a plain record (saved as DIR/coreml-record.json).
- `rows_from_record` turns a record into schema rows. A graph with any op off the ANE (it fell back to CPU/GPU) is
  NEVER written as an NPU row: it goes to the file's `fallbacks` list with the ops that moved, and is counted.
Rows: kind `gemm` (a group's GEMM chain: gemms [[C, 2I, H, G], [C, H, I, G]], weight_format fp16, one call) and
`call_floor` (the smallest graph), role fit, chip from the Mac's CPU brand ("Apple M2 Max" -> m2-max).
"""
from __future__ import annotations

import platform as _platform
import re
import subprocess
import time

import numpy as np

from npumoe_lab.errors import NpuMoeError
from npumoe_lab.experiments.geometry_model import random_model
from npumoe_lab.graphs.coreml import CoreMLOptions, build_group_package, group_function_name
from npumoe_lab.models import find_moe_blocks
from npumoe_lab.models.weights import expert_weights

RECORD_FILE = "coreml-record.json"
RECORD_FIELDS = ("chip_brand", "macos", "coremltools", "compute_units", "graphs")
GRAPH_FIELDS = ("id", "geometry", "experts", "capacity", "hidden", "intermediate", "times_s", "placement")
# (geometry, hidden, intermediate) -> capacities x group sizes timed on the ANE
GRID = {"tiny": (256, 128, (1, 16, 64, 256), (1, 4, 16)),
        "qwen3-30b-a3b": (2048, 768, (8, 32, 128, 512), (1, 8))}
QUICK = {"tiny": (256, 128, (1, 64), (1, 4)), "qwen3-30b-a3b": (2048, 768, (32,), (1,))}


def chip_of(brand: str) -> str:
    """'Apple M2 Max' -> 'm2-max' (the chip names of data/measurements); one clear error otherwise."""
    m = re.fullmatch(r"Apple (M\d+|A\d+)(?: (Pro|Max|Ultra))?", str(brand).strip())
    if not m:
        raise NpuMoeError(f"CPU brand {brand!r} is not an Apple M/A chip; measure --device coreml needs one")
    return m.group(1).lower() + (f"-{m.group(2).lower()}" if m.group(2) else "")


def _median_iqr(ts):
    q = np.percentile(np.asarray(ts, float), [25, 50, 75])
    return float(q[1]), float(q[2] - q[0])


def rows_from_record(record: dict, source: str = "coreml record") -> tuple[list, list]:
    """(rows, fallbacks) of a Core ML record; raises one NpuMoeError naming a malformed graph entry."""
    if not isinstance(record, dict) or any(k not in record for k in RECORD_FIELDS):
        raise NpuMoeError(f"{source}: a Core ML record needs {', '.join(RECORD_FIELDS)}")
    chip = chip_of(record["chip_brand"])
    rows, fallbacks = [], []
    ref = (f"npumoe-lab measure --device coreml on {record['chip_brand']} (macOS {record['macos']}, coremltools "
           f"{record['coremltools']}, {record['compute_units']})")
    for i, g in enumerate(record["graphs"]):
        if not isinstance(g, dict) or any(k not in g for k in GRAPH_FIELDS):
            raise NpuMoeError(f"{source}: graph {i} lacks some of {', '.join(GRAPH_FIELDS)}")
        times = g["times_s"]
        if not isinstance(times, list) or len(times) < 3 or not all(isinstance(t, (int, float)) and t > 0
                                                                    for t in times):
            raise NpuMoeError(f"{source}: graph {g['id']!r} needs >= 3 positive times_s")
        off = list(g["placement"].get("off_ane", [])) if isinstance(g["placement"], dict) else None
        if off is None:
            raise NpuMoeError(f"{source}: graph {g['id']!r} placement must be a mapping with off_ane")
        if off:
            fallbacks.append({"id": g["id"], "off_ane": off, "ops": g["placement"].get("ops", {}),
                              "note": "fell off the ANE (MLComputePlan): not written as an NPU row"})
            continue
        G, C, H, I = (int(g[k]) for k in ("experts", "capacity", "hidden", "intermediate"))
        med, iqr = _median_iqr(times)
        floor = G == 1 and C == 1
        row = {"id": f"coreml-{chip}-{g['id']}", "chip": chip, "device": "npu", "path": "coreml",
               "kind": "call_floor" if floor else "gemm",
               "work": {"gemms": [[C, 2 * I, H, G], [C, H, I, G]], "weight_format": "fp16", "calls": 1},
               "measured_s": med, "iqr_s": iqr, "repeats": len(times),
               "source": {"ref": ref, "read": f"median of {len(times)} predictions after a warm-up; MLComputePlan: "
                                              f"every op on the ANE"},
               "confidence": "H" if iqr <= 0.25 * med else "M", "role": "fit",
               "note": f"{g['geometry']} expert group, {G} experts at capacity {C}, one Core ML prediction"}
        power = g.get("ane_power_w")
        if isinstance(power, (int, float)) and power > 0:
            row["power_w"] = float(power)
            row["note"] += "; power_w = mean ANE rail power over the predictions (powermetrics)"
        rows.append(row)
    return rows, fallbacks


def record_coreml(geometries, repeats: int, quick: bool, seed: int = 0) -> dict:
    """Build, place, time and (where permitted) power-sample every group graph of the grid (macOS only)."""
    from npumoe_lab.backends.coreml import CoreMLDevice, PowerMetrics, placement, require_macos   # lazy: Mac-only
    require_macos("measure --device coreml")
    import tempfile
    from pathlib import Path

    import coremltools as ct
    import torch

    brand = subprocess.run(["sysctl", "-n", "machdep.cpu.brand_string"], capture_output=True, text=True).stdout
    dev, options, tmp = CoreMLDevice("CPU_AND_NE"), CoreMLOptions(), Path(tempfile.mkdtemp(prefix="npumoe-measure-"))
    graphs, permitted = [], True
    for geom in geometries:
        H, I, caps, sizes = (QUICK if quick else GRID)[geom]
        layer = expert_weights(find_moe_blocks(random_model(geom, 1, torch.float32, seed))[0].experts)
        for G in sizes:
            w = layer.select(list(range(G))).contiguous()
            path = build_group_package(w, list(caps), tmp / f"{geom}-G{G}.mlpackage", options)
            for C in caps:
                fn = group_function_name(C)
                rep = placement(path, fn, graph=f"{geom}-G{G}", resident=False)
                handle = dev.load(path, fn)
                x = np.random.default_rng(seed).standard_normal((G, C, H)).astype(np.float32)
                dev.run_group(handle, x, options.layout)        # warm-up (specialisation for the device)
                times, power = [], None
                try:
                    with PowerMetrics() if permitted else _nothing() as pm:
                        for _ in range(repeats):
                            times.append(dev.run_group(handle, x, options.layout)[1])
                    if pm is not None:
                        vals = [s["ane_w"] for s in pm.samples if s["ane_w"] is not None]
                        power = float(np.mean(vals)) if vals else None
                except NpuMoeError:          # powermetrics not permitted: time without energy from now on
                    permitted = False
                    times = [dev.run_group(handle, x, options.layout)[1] for _ in range(repeats)]
                graphs.append({"id": f"{geom}-G{G}-C{C}", "geometry": geom, "experts": G, "capacity": C,
                               "hidden": H, "intermediate": I, "times_s": times, "ane_power_w": power,
                               "placement": {"ops": rep.ops, "off_ane": rep.off_ane}})
    return {"chip_brand": brand.strip(), "macos": _platform.mac_ver()[0], "coremltools": ct.__version__,
            "compute_units": "CPU_AND_NE", "powermetrics": "permitted" if permitted else "not permitted",
            "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "graphs": graphs}


class _nothing:
    def __enter__(self):
        return None

    def __exit__(self, *exc):
        return False


def measure_coreml(geometries, repeats: int, quick: bool, seed: int = 0) -> tuple[list, list, dict]:
    """(rows, fallbacks, record) of the Core ML grid; off macOS one clear NpuMoeError before any work."""
    from npumoe_lab.backends.coreml import require_macos   # lazy: the Core ML stack is only on a Mac
    require_macos("measure --device coreml")
    unknown = [g for g in geometries if g not in GRID]
    if unknown:
        raise NpuMoeError(f"unknown geometry {unknown}; use some of {', '.join(GRID)}")
    record = record_coreml(geometries, repeats, quick, seed)
    rows, fallbacks = rows_from_record(record)
    return rows, fallbacks, record


__all__ = ["measure_coreml", "record_coreml", "rows_from_record", "chip_of", "RECORD_FILE"]
