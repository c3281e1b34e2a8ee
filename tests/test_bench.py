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
    from npumoe_lab.core.cpu_ffn import onednn_packs
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
    """the bench parts on a small model: attach cost, chunked prefill rows, fp16 groups within tolerance."""
    import re

    import policy
    torch.set_num_threads(1)
    monkeypatch.setenv("NPUMOE_NO_PROGRESS", "1")
    model, tok, plans = policy.two_layer_setup(torch.float32, chunk=64, tokens=256, smoke=True)
    assert "of the first" in policy.attach_cost(model, plans, repeats=1)
    checks = []
    table = policy.chunked_prefill(model, tok, plans[0], [128], repeats=1, chunk=64, checks=checks)
    assert table.count("| 128 |") == 6 and "oracle" in table
    targets = {c["check"]: c for c in checks if not c["info"]}
    skip = targets["2-layer prefill 128: padding skipped vs HF eager"]
    printed = re.search(r"\| 128 \| static, padding skipped \(CPU\) \| [^|]+\| [^|]+\| ([0-9.]+)x", table).group(1)
    assert f"{skip['value']:.2f}" == printed and skip["holds"] == (skip["value"] >= 1.25)   # the table's ratio
    assert len(checks) == 6 and targets["2-layer prefill 128: padding computed / skipped"]["threshold"] > 1
    for row in ("HF eager", "static, padding skipped (CPU)"):     # the timeline's split lies inside the wall time
        cells = next(ln for ln in table.splitlines() if ln.startswith(f"| 128 | {row} |")).split(" | ")
        wall, att, exp = float(cells[2]), float(cells[5]), float(cells[6])
        assert att > 0 and exp > 0 and att + exp < wall, cells
    assert "(not timed apart)" in next(ln for ln in table.splitlines() if "dropless, no plan" in ln)
    line = policy.fp16_groups(torch.float32, repeats=1, G=4, C=8, geometry="smoke", tiny=False, checks=checks)
    assert checks[-2]["check"].startswith("fp16 groups: emulated max error") and checks[-2]["holds"]
    errs = [float(e) for e in re.findall(r"(?:emulated|native) ([0-9.]+e-[0-9]+)", line)]
    assert len(errs) == 2 and max(errs) <= 2 ** -10, line
    assert "fp16" in policy.cpu_line(torch.float32)


def test_layer_checks_and_rounds_summary_by_hand():
    """bench/rounds.py's verdict: the median round against the target, k of N rounds meeting it (hand-made rounds)."""
    import rounds
    rows = [dict(geometry="g", dtype="bf16", chunk=512, variant="static-3tier", median_ms=150.0, pad_pct=25.0,
                 vs_eager=0.8),
            dict(geometry="g", dtype="bf16", chunk=512, variant="static-3tier-cpu", median_ms=100.0, pad_pct=0.0,
                 vs_eager=1.3)]
    checks = []
    moe_layer.layer_checks(rows, checks)
    assert [(c["value"], c["threshold"], c["holds"]) for c in checks] == [(1.3, 1.25, True), (1.5, 4 / 3, False)]

    def doc(skip, comp, prov):
        return dict(cpu="CPU: test", provenance=prov, loadavg=[1.0, 1.5, 1.0],
                    checks=[dict(check="skip vs eager", value=skip, op=">=", threshold=1.25, holds=skip >= 1.25),
                            dict(check="computed / skipped", value=comp, op="<=", threshold=1.5, holds=comp <= 1.5),
                            dict(check="equal work", value=1.1, op=">=", threshold=1.25, holds=False, info=True)])
    text = rounds.summarise([doc(1.20, 1.4, "t1, c"), doc(1.30, 1.45, "t2, c"), doc(1.26, 1.6, "t3, c")])
    rows = {ln.split(" | ")[0].strip("| "): ln for ln in text.splitlines() if ln.startswith("| ")}
    assert "| 1.26 | 1.20-1.30 | 2 of 3 | holds |" in rows["skip vs eager"]     # median 1.26 >= 1.25
    assert "| 1.45 | 1.40-1.60 | 2 of 3 | holds |" in rows["computed / skipped"]
    assert rows["equal work"].endswith("| 0 of 3 | info |")
    one = rounds.summarise([doc(1.20, 1.4, "t1, c")])
    assert "| 1.20 | 1.20-1.20 | 0 of 1 | **misses** |" in one and "load average" in one and "measured" in one


def test_rounds_pools_kept_batches(tmp_path, capsys):
    """`rounds.py --from A B` reads both folders' rounds in order: one pooled verdict, the checkouts named."""
    import json

    import rounds

    def doc(v, commit):
        return dict(cpu="CPU: test", provenance=f"t, commit {commit}, cpu", loadavg=[1.0, 1.0, 1.0],
                    checks=[dict(check="skip vs eager", value=v, op=">=", threshold=1.25, holds=v >= 1.25)])
    for name, vals, commit in (("a", [1.20, 1.22, 1.30], "aaa"), ("b", [1.27, 1.28], "bbb")):
        (tmp_path / name).mkdir()
        for i, v in enumerate(vals):
            (tmp_path / name / f"round{i + 1}.json").write_text(json.dumps(doc(v, commit)))
    rounds.main(["--from", str(tmp_path / "a"), str(tmp_path / "b")])
    out = capsys.readouterr().out
    assert "| 1.20 | 1.22 | 1.30 | 1.27 | 1.28 | 1.27 | 1.20-1.30 | 3 of 5 | holds |" in out   # median of all 5
    assert "5 rounds" in out and "commit aaa; commit bbb" in out
    (tmp_path / "empty").mkdir()
    with pytest.raises(SystemExit):
        rounds.main(["--from", str(tmp_path / "a"), str(tmp_path / "empty")])
    assert "no round*.json in" in capsys.readouterr().err
    (tmp_path / "a" / "round9.json").write_text("{trunc")                     # a round cut off mid-write
    (tmp_path / "a" / "rounds-notes.json").write_text("{}")                   # not a round: ignored
    with pytest.raises(SystemExit):
        rounds.main(["--from", str(tmp_path / "a")])
    err = capsys.readouterr().err
    assert "round9.json: not a readable round" in err and "rounds-notes" not in err


def test_experts_path_inside_the_prefill_smoke(monkeypatch):
    """bench/experts_path.py on a small model: three rows per prompt, the hooks' experts time inside each prefill,
    the check recorded with the table's own ratio, and the step table whenever the target is missed."""
    import experts_path
    import policy
    torch.set_num_threads(1)
    monkeypatch.setenv("NPUMOE_NO_PROGRESS", "1")
    model, tok, plans = policy.two_layer_setup(torch.float32, chunk=64, tokens=256, smoke=True)
    checks = []
    text = experts_path.experts_in_prefill(model, tok, plans[0], [128], 1, (1e11, 1e10), checks=checks, chunk=64)
    names = ["HF eager", "HF grouped_mm", "static plan (padding skipped)"]
    rows = [r for r in (ln.split(" | ") for ln in text.splitlines() if ln.startswith("| 128 | ")) if r[1] in names]
    assert [r[1] for r in rows] == names
    for r in rows:
        wall, inside = float(r[2]), float(r[3])
        assert 0 < inside < wall, r
    target = next(c for c in checks if not c["info"])
    assert f"{target['value']:.2f}x" == rows[2][5]
    assert ("| 128 | groups |" in text) == (not target["holds"])
    assert getattr(model, "_npumoe", None) is None       # the model is left detached
