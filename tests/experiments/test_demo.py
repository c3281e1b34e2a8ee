"""`make demo` end to end on a one-cell version of its sweep: the sweep's warm kernel started before the
calibration runs the cell, the paper-scale simulation runs in its own process beside the figures, and SUMMARY.md
reports each stage. Reference: what the full demo writes (rows per variant and platform, the figure files, no
progress bars in the executed notebook)."""
import json

import pytest

from npumoe_lab.experiments.demo import run_demo
from npumoe_lab.results.store import load_results
from npumoe_lab.models import TINY_MODEL_DIR
from npumoe_lab.utils import REPO_ROOT
from tests.experiments.test_demo_summary import rows_sources, summary_sources


def test_demo_end_to_end_on_one_cell(tmp_path, monkeypatch):
    if not (TINY_MODEL_DIR / "model.safetensors").exists():
        pytest.skip("bundled tiny model not present")
    monkeypatch.setenv("NPUMOE_CACHE", str(tmp_path / "cache"))
    spec = tmp_path / "demo-small.yaml"
    spec.write_text(f"include: {REPO_ROOT / 'sweeps' / 'demo.yaml'}\nname: demo-small\n"
                    "parameters:\n  variants: reference,npumoe-base,npumoe\n  n_samples: 1\n  calib_tokens: 1024\n"
                    "  repeats: 1\n  matched_percentile: null\ngrid:\n  prompt_len: [128]\n")
    out = tmp_path / "out"
    text = run_demo(out, sweep=spec, accuracy={"n": 2, "percentiles": "50", "workload": "lm-next",
                                               "calib_tokens": 1024}).read_text()
    for stage in ("imports, model load, calibration and plans", "sweep", "figures",
                  "paper-scale simulation (beside the figures)", "accuracy curve, n = 2 (beside the figures)"):
        assert f"{stage} " in text
    assert "## Accuracy vs drop rate (`npumoe-lab accuracy --n 2" in text and "**lm-next**" in text
    assert (out / "accuracy" / "curve.csv").is_file() and (out / "accuracy" / "accuracy_curve.png").is_file()
    assert "## Paper scale, simulated" in text
    rows = load_results(out / "sweep")
    assert set(rows.variant) == {"reference", "npumoe-base", "npumoe"} and set(rows.platform) == {"cpu", "m2-max"}
    assert summary_sources(text) == rows_sources(rows)             # each metric labelled as its rows say
    assert summary_sources(text)[("npumoe", "cpu")][1] != "measured"   # energy: measured time x modeled power
    assert set(load_results(out / "paper-scale").geometry) == {"qwen3-30b-a3b", "phi-3.5-moe", "phi-tiny-moe"}
    figures = {p.name for p in (out / "figures").iterdir()}
    assert {"baselines.png", "baselines.pdf", "paper-scale-baselines.png", "paper-scale-ablation.pdf",
            "ttft-vs-drop.png"} <= figures
    (cell,) = (out / "sweep" / "cells").iterdir()
    outputs = [o.get("text", "") for c in json.loads((cell / "executed.ipynb").read_text())["cells"]
               for o in c.get("outputs", [])]
    assert not any("it/s" in "".join(t) for t in outputs)          # the warm kernel knows it runs a sweep cell
