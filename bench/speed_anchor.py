"""Does the speed anchor (devices/hostspeed.py) follow the host's speed for prefills? A development study: the
speed probe, 20 bf16 GEMMs, the anchor and a few other prefills timed in rotation for --seconds; the host's speed
moves in spells, so the readings are compared over windows of --window iterations (medians).

    .venv/bin/python bench/speed_anchor.py --seconds 420             # tiny-geometry targets (~1 s per iteration)
    .venv/bin/python bench/speed_anchor.py --seconds 480 --qwen      # Qwen3-30B-A3B-geometry targets too (4.4 GB)

Prints, per target, the sd of its windowed log time unscaled, divided by the anchor, and divided by the GEMMs (all
MEASURED); the CPU's flags first. Neither fit rows nor held-out runs: what it shows chooses no fitted value.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from npumoe_lab.core.cpu_features import cpu_flags, cpu_model  # noqa: E402
from npumoe_lab.devices import get_platform  # noqa: E402
from npumoe_lab.devices.hostspeed import probe_s  # noqa: E402
from npumoe_lab.execution.runtime import PrefillConfig, run_prefill  # noqa: E402
from npumoe_lab.experiments.geometry_model import random_ids, random_model  # noqa: E402
from npumoe_lab.experiments.geometry_model import bundled_depth  # noqa: E402
from npumoe_lab.experiments.measure import _set_mode  # noqa: E402
from npumoe_lab.experiments.speed_anchor import anchor_s  # noqa: E402
from npumoe_lab.models import describe  # noqa: E402


def prefill(model, mode: str, n: int, chunk: int):
    """A timer of one prefill of `model` in experts `mode` (measure's modes), re-set each call (others share it)."""
    specs, ids = describe(model), random_ids(model.config.vocab_size, n, 0)
    config = PrefillConfig(get_platform("cpu"), chunk, attention="cpu")

    def timed() -> float:
        _set_mode(model, mode, specs, chunk, None)
        run_prefill(model, ids[:, :chunk], config, measure_hf_experts=mode == "hf")       # untimed warm-up
        return run_prefill(model, ids, config, measure_hf_experts=mode == "hf").summary["ttft_s"]
    return timed


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=420)
    ap.add_argument("--window", type=int, default=30, help="iterations per window median")
    ap.add_argument("--qwen", action="store_true", help="add prefills of a 2-layer Qwen3-30B-A3B geometry")
    a = ap.parse_args()
    print(f"CPU: {cpu_model()}; flags: {' '.join(sorted(cpu_flags()))}; torch threads {torch.get_num_threads()}", flush=True)
    depth = bundled_depth()
    bf16, fp32 = random_model("tiny", depth, torch.bfloat16, 0), random_model("tiny", depth, torch.float32, 0)
    g = torch.Generator().manual_seed(0)
    h = bf16.config.hidden_size
    x, w = torch.randn(256, h, generator=g).bfloat16(), torch.randn(h, 4 * h, generator=g).bfloat16()

    def gemms() -> float:
        t0 = time.perf_counter()
        for _ in range(20):
            torch.mm(x, w)
        return time.perf_counter() - t0
    items = {"probe": probe_s, "gemms": gemms, "anchor": anchor_s,
             "tiny bf16 hf 1024/256": prefill(bf16, "hf", 1024, 256),
             "tiny fp32 dynamic 1024/128": prefill(fp32, "dynamic", 1024, 128)}
    if a.qwen:
        qwen = random_model("qwen3-30b-a3b", 2, torch.bfloat16, 0)
        items.update({"qwen bf16 static 256/128": prefill(qwen, "static", 256, 128),
                      "qwen bf16 hf 512/256": prefill(qwen, "hf", 512, 256)})
    else:
        items.update({"tiny bf16 static 512/64": prefill(bf16, "static", 512, 64),
                      "tiny bf16 naive 512/128": prefill(bf16, "naive", 512, 128)})
    names, rec = list(items), []
    with torch.inference_mode():
        for f in items.values():
            f()
        end = time.time() + a.seconds
        while time.time() < end:
            k = len(rec) % len(names)
            rec.append({n: items[n]() for n in names[k:] + names[:k]})       # rotating order
    lg = np.log(pd.DataFrame(rec)[names])
    win = (lg - lg.median()).rolling(a.window, center=True).median().dropna()
    print(f"{len(rec)} iterations; windows of {a.window}; range of the window medians (max/min) and sd of log time "
          "(MEASURED):")
    print("| reading | median ms | window range | sd | sd / anchor | sd / gemms | corr with anchor |")
    print("|---|---|---|---|---|---|---|")
    for n in names:
        print(f"| {n} | {1e3 * np.exp(lg[n].median()):.2f} | {np.exp(win[n].max() - win[n].min()):.2f}x | "
              f"{win[n].std():.3f} | {(win[n] - win['anchor']).std():.3f} | {(win[n] - win['gemms']).std():.3f} | "
              f"{win[n].corr(win['anchor']):+.2f} |")


if __name__ == "__main__":
    main()
