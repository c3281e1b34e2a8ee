"""How the cost of one simulated row grows: time per row of `simulate` (variant npumoe, m2-max, chunk
512, synthetic routing Gini 0.45 (reachable at 16 experts, top-8), one draw) against prompt length (1k ... 32k), decoder layers (1 ... 48) and routed
experts (16 ... 128), on Qwen3-30B-A3B's geometry with the one dimension changed. Each row's time is split into the
setup (routing source, calibration, plan) and the stream (routing counts, the op stream as arrays, its schedule
and pricing), and the stream's time is divided by layers x chunks: a constant there is the linear growth the array
path promises. Process CPU seconds (the host is shared), medians of --repeats; the CPU's model and flags first."""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench.sim_grid import cpu_line  # noqa: E402  (after the path insert)
from npumoe_lab.devices import get_platform  # noqa: E402
from npumoe_lab.planning.variants import VARIANTS  # noqa: E402
from npumoe_lab.sim.array_replay import summarize_stream  # noqa: E402
from npumoe_lab.sim.geometries import GEOMETRY_DIR, load_geometry  # noqa: E402
from npumoe_lab.sim.routing import parse_routing  # noqa: E402
from npumoe_lab.sim.run import variant_executor  # noqa: E402
from npumoe_lab.sim.stream import build_stream, routing_counts  # noqa: E402

BASE = dict(prompt=4096, layers=48, experts=128)
AXES = {"prompt": (1024, 2048, 4096, 8192, 16384, 32768), "layers": (1, 6, 12, 24, 48), "experts": (16, 32, 64, 128)}
CHUNK = 512


def geometry(layers: int, experts: int, tmp: Path):
    cfg = json.loads((GEOMETRY_DIR / "qwen3-30b-a3b.json").read_text())
    cfg.update(num_hidden_layers=layers, num_experts=experts)
    cfg.pop("layer_types", None)
    cfg.pop("mlp_only_layers", None)
    path = tmp / f"qwen3-l{layers}-e{experts}.json"
    path.write_text(json.dumps(cfg))
    return load_geometry(path, hf_config=False)[2]


def one_row(geo, prompt: int, repeats: int) -> tuple[float, float, int]:
    """(setup CPU s, stream CPU s, ops in the stream): medians over repeats, each from scratch."""
    setups, streams, n = [], [], 0
    plat, v = get_platform("m2-max"), VARIANTS["npumoe"]
    specs = list(geo.moe)
    for r in range(repeats):
        c0 = time.process_time()
        src = parse_routing("synthetic:gini=0.45", specs, r)
        executor, _ = variant_executor(v, specs, src.calibration_profile(specs, CHUNK, r), plat, {}, engine="array")
        routed = src.chunks(specs, prompt, CHUNK, r)
        c1 = time.process_time()
        stream = build_stream(geo, executor, routing_counts(routed, specs, prompt, CHUNK))
        summarize_stream(stream, plat)
        c2 = time.process_time()
        setups.append(c1 - c0)
        streams.append(c2 - c1)
        n = len(stream)
    return statistics.median(setups), statistics.median(streams), n


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--repeats", type=int, default=3)
    a = ap.parse_args(argv)
    print(cpu_line())
    print(f"| axis | prompt | layers | experts | layers x chunks | ops | setup s | stream s | stream us per layer x "
          f"chunk | row s |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    with tempfile.TemporaryDirectory() as tmp:
        for axis, values in AXES.items():
            for value in values:
                p = dict(BASE, **{axis: value})
                geo = geometry(p["layers"], p["experts"], Path(tmp))
                setup, stream, n = one_row(geo, p["prompt"], a.repeats)
                lc = p["layers"] * -(-p["prompt"] // CHUNK)
                print(f"| {axis} | {p['prompt']} | {p['layers']} | {p['experts']} | {lc} | {n} | {setup:.3f} | "
                      f"{stream:.4f} | {1e6 * stream / lc:.1f} | {setup + stream:.3f} |")
    print("(process CPU seconds, modeled timing; setup = routing source + calibration + plan + the prompt's routing "
          "draw, stream = counts + op stream + schedule + pricing)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
