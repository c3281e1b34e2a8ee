"""The explorer's knob-move latency (issue 30: median <= 100 ms): the bundled model's explorer app (as the notebook
and the browser test open it: `make_lab("tiny")`, prompt 256, chunk 128) moved through a fixed sequence of knob
settings in code, each move = re-plan + the prompt's op stream as arrays + metrics table + the visible panel
(vs baselines, redrawn in place). Prints the median and every update's wall time (`Explorer.last_update_s`, what
its status line shows; the browser adds the widget round trip), and the CPU it ran on."""
from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench.sim_grid import cpu_line  # noqa: E402  (after the path insert)
from npumoe_lab.viz.explorer import Knobs, make_lab  # noqa: E402
from npumoe_lab.viz.explorer_app import Explorer  # noqa: E402

MOVES = (dict(tiers=2), dict(percentile=70.0), dict(group_size=4), dict(residency="threshold"), dict(hot_scale=2.0),
         dict(residency="cost"), dict(tiers=3), dict(percentile=90.0), dict(group_size=8), dict(tiers=1),
         dict(percentile=80.0), dict(group_size=2))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--model", default="tiny", help="a model name or a bundled geometry (e.g. phi-tiny-moe)")
    a = ap.parse_args(argv)
    print(cpu_line())
    lab = make_lab(a.model, prompt_len=256, chunk=128, calib_tokens=1024) if a.model == "tiny" else \
        make_lab(a.model, prompt_len=512, chunk=256)
    app = Explorer(lab, Knobs(chunk=lab.chunk_options()[0] if a.model != "tiny" else 128))
    times, evals = [], []
    for kw in MOVES:
        app.set(**kw)
        times.append(app.last_update_s)
        evals.append(app.evaluation.seconds)
    print(f"explorer update ({a.model}): median {1e3 * statistics.median(times):.0f} ms over {len(times)} knob moves "
          f"(re-plan + op stream {1e3 * statistics.median(evals):.0f} ms of it); each: "
          f"{', '.join(f'{1e3 * t:.0f}' for t in times)} ms wall; target <= 100 ms")
    return 0


if __name__ == "__main__":
    torch.set_num_threads(1)
    sys.exit(main())
