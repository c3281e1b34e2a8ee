"""bench/ scripts run end to end (tiny shapes, one repeat): a broken benchmark is found by CI, not by the next
engineer. What is checked is correctness inside the benchmark (every variant against HF eager); timings are not
asserted (speed targets live in the benchmark's own output, bench/RESULTS.md)."""
import sys
from pathlib import Path

import pytest
import torch

BENCH = Path(__file__).resolve().parents[1] / "bench"
sys.path.insert(0, str(BENCH))

import moe_layer  # noqa: E402


@pytest.fixture(autouse=True)
def _threads():
    n = torch.get_num_threads()
    yield
    torch.set_num_threads(n)


@torch.no_grad()
def test_layer_bench_smoke_every_variant_matches_hf():
    from npumoe_lab.cpu_ffn import onednn_packs
    kernel = "onednn" if onednn_packs(torch.float32) else "torch"    # the packed path, as at the real geometries
    args = moe_layer.parse_args(["--geometry", "smoke", "--dtypes", "fp32", "--chunks", "64", "--repeats", "1",
                                 "--calib-chunks", "4", "--threads", "1", "--cpu-kernel", kernel])
    shares = moe_layer.load_shares(16)[0]
    peaks = {"fp32": (1e11, 1e10)}
    rows = moe_layer.bench_layer("smoke", "fp32", [64], args, shares, peaks)
    variants = {r["variant"] for r in rows}
    assert {"hf-eager", "hf-grouped_mm", "static-3tier", "static-3tier-cpu", "static-dropless",
            "static-dropless-cpu", "dropless-dynamic", "bare-gemm", "static-groupcaps16",
            "static-3tier-bf16"} <= variants
    err = rows[0]["err"]
    assert max(err.values()) < 1e-4, err          # dropless variants equal HF; skipping padding changes nothing
    r = next(r for r in rows if r["variant"] == "static-3tier")
    assert r["slots"] >= r["routed"] * (1 - r["drop_pct"] / 100) and 0 <= r["pack_scatter_pct"] < 100
    assert "static-3tier-cpu" in moe_layer.markdown(rows)


def test_gpu_check_dry_run_on_cpu(capsys):
    import gpu_check
    gpu_check.main(["--dry-run", "--geometry", "smoke", "--chunks", "64", "--repeats", "1", "--calib-chunks", "4"])
    out = capsys.readouterr().out
    assert "static-graphs" in out and "graphs-only" in out


@torch.no_grad()
def test_policy_parts_smoke(monkeypatch):
    """issue 17's bench parts on a small model: attach cost, chunked prefill rows, fp16 groups within tolerance."""
    import re

    import policy
    torch.set_num_threads(1)
    monkeypatch.setenv("NPUMOE_NO_PROGRESS", "1")
    model, tok, plans = policy.two_layer_setup(torch.float32, chunk=64, tokens=256, smoke=True)
    assert "of the first" in policy.attach_cost(model, plans, repeats=1)
    table = policy.chunked_prefill(model, tok, plans[0], [128], repeats=1, chunk=64)
    assert table.count("| 128 |") == 6 and "oracle" in table
    line = policy.fp16_groups(torch.float32, repeats=1, G=4, C=8, geometry="smoke", tiny=False)
    errs = [float(e) for e in re.findall(r"(?:emulated|native) ([0-9.]+e-[0-9]+)", line)]
    assert len(errs) == 2 and max(errs) <= 2 ** -10, line
    assert "fp16" in policy.cpu_line(torch.float32)
