"""The small version of the bench's full curve (bench/accuracy_curve.py): worker processes, the
outputs, a second run reading every reference from the disk cache with the same rows, and --assemble-parts
rebuilding the outputs from the workers' per-task files."""
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from npumoe_lab.models import TINY_MODEL_DIR

BENCH = Path(__file__).resolve().parents[2] / "bench" / "accuracy_curve.py"


def _bench(args, cache) -> str:
    """The bench as `make bench` runs it (its own process: its workers are spawned from a module on disk)."""
    env = {**os.environ, "NPUMOE_CACHE_DIR": str(cache), "NPUMOE_NO_PROGRESS": "1"}
    res = subprocess.run([sys.executable, str(BENCH), *args], env=env, capture_output=True, text=True, timeout=900)
    assert res.returncode == 0, res.stderr[-2000:]
    return res.stdout


def test_small_bench_curve_then_cached_rerun_and_assembly(tmp_path):
    if not (TINY_MODEL_DIR / "config.json").is_file():
        pytest.skip("the bundled tiny model is not built")
    cache = tmp_path / "cache"
    args = ["--workload", "lm-next,fewshot-cls", "--percentiles", "50,100", "--saliency", "weight_x_norm,random",
            "--n", "2", "--workers", "2", "--calib-tokens", "1024", "--draws", "16"]
    out = tmp_path / "curve"
    first = _bench(args + ["--out", str(out)], cache)
    assert "reference records: 0 of 4 read from the on-disk cache" in first and "wall" in first
    rows = pd.read_csv(out / "curve.csv")
    assert len(rows) == 2 * 2 * 2 and list(dict.fromkeys(rows.workload)) == ["lm-next", "fewshot-cls"]
    assert rows.ttft_s_lo.notna().all() and (rows.interval_draws == 16).all()
    assert (out / "ACCURACY.md").is_file() and (out / "accuracy_curve.png").is_file()
    again = tmp_path / "again"
    assert "reference records: 4 of 4 read from the on-disk cache" in _bench(args + ["--out", str(again)], cache)
    cols = ["workload", "saliency", "percentile", "ref_score", "score", "nll_delta", "drop_rate", "ttft_s"]
    assert pd.read_csv(again / "curve.csv")[cols].equals(rows[cols])
    (out / "curve.csv").unlink()
    assert "assembled 8 rows" in _bench(args + ["--out", str(out), "--assemble-parts"], cache)
    assert pd.read_csv(out / "curve.csv")[cols].equals(rows[cols])
