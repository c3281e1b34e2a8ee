"""The explorer's knob-move latency (median <= 100 ms): the bundled model's explorer app (as the notebook
and the browser test open it: `make_lab("tiny")`, prompt 256, chunk 128) moved through a fixed sequence of knob
settings in code, each move = re-plan + the prompt's op stream as arrays + metrics table + the visible panel
(vs baselines, redrawn in place). Prints the median and every update's wall time (`Explorer.last_update_s`, what
its status line shows; measured in Python), and the CPU it ran on. `--browser` (make bench: when Chromium and
chromedriver are installed) also runs the browser test's measurement (tests/viz/test_browser.py
::test_explorer_knob_moves_timed_end_to_end: JupyterLab in headless Chromium, key press on the slider -> the
re-drawn figure decoded on screen, widget round trip included) and prints its median: the issue's number."""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench.sim_grid import cpu_line  # noqa: E402  (after the path insert)
from npumoe_lab.viz.explorer import Knobs, make_lab  # noqa: E402
from npumoe_lab.viz.explorer_app import Explorer  # noqa: E402

MOVES = (dict(tiers=2), dict(percentile=70.0), dict(group_size=4), dict(residency="threshold"), dict(hot_scale=2.0),
         dict(residency="cost"), dict(tiers=3), dict(percentile=90.0), dict(group_size=8), dict(tiers=1),
         dict(percentile=80.0), dict(group_size=2))


ROOT = Path(__file__).resolve().parent.parent
BROWSER_TEST = "tests/viz/test_browser.py::test_explorer_knob_moves_timed_end_to_end"


def browser_median() -> str:
    """The browser test's measurement (its own process: JupyterLab, a kernel, headless Chromium), as a line."""
    if not (Path("/usr/bin/chromium").exists() and Path("/usr/bin/chromedriver").exists()):
        return ("explorer update in the browser: not measured (needs /usr/bin/chromium and /usr/bin/chromedriver: "
                "apt-get install chromium chromium-driver)")
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "timing.json"
        env = {**os.environ, "NPUMOE_BROWSER_TIMING": str(out), "NPUMOE_NO_PROGRESS": "1",
               "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
        run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", BROWSER_TEST],
                             cwd=ROOT, env=env, capture_output=True, text=True)
        if not out.exists():
            tail = (run.stdout + run.stderr).strip().splitlines()[-3:]
            return f"explorer update in the browser: the browser test did not finish ({' / '.join(tail)})"
        t = json.loads(out.read_text())
    return (f"explorer update in the browser (JupyterLab + headless Chromium; key press on '{t['knob']}' -> figure "
            f"decoded on screen): median {1e3 * t['median_s']:.0f} ms over {t['moves']} knob moves (the new image "
            f"in the page after {1e3 * t['src_set_median_s']:.0f} ms); each: "
            f"{', '.join(f'{1e3 * x:.0f}' for x in t['times_s'])} ms; target <= 100 ms")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--model", default="tiny", help="a model name or a bundled geometry (e.g. phi-tiny-moe)")
    ap.add_argument("--browser", action="store_true", help="also the browser test's end-to-end median")
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
          f"{', '.join(f'{1e3 * t:.0f}' for t in times)} ms wall, measured in Python (no widget round trip)")
    if a.browser:
        print(browser_median(), flush=True)
    return 0


if __name__ == "__main__":
    torch.set_num_threads(1)
    sys.exit(main())
