"""Routing that behaves like text: per-chunk dispersion against the Dirichlet-multinomial formula, workload mixes,
profile routing that keeps its per-chunk structure, the measured defaults, and bad input."""
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest

from npumoe_lab import cli
from npumoe_lab.errors import NpuMoeError
from npumoe_lab.planning.profile import CalibrationProfile
from npumoe_lab.sim.routing import mix_overlap_curve, overlap_for_tv, parse_routing, synthetic, zipf_shares
from npumoe_lab.sim.textlike import DEFAULTS_FILE, dispersion, load_defaults, tv_overlap

SPECS = [SimpleNamespace(layer=l, n_experts=16, top_k=1, hidden=64, intermediate=32) for l in range(2)]


def test_chunk_dispersion_follows_the_dirichlet_multinomial():
    """top-1 routing: a chunk's counts are Dirichlet-multinomial(n = chunk, A = concentration * E * p), whose pooled
    index of dispersion is (1 - sum p^2) (n + A) / (1 + A) (independent tokens: 1 - sum p^2)."""
    n, E = 128, 16
    for conc in (0.5, 4.0, None):
        src = synthetic(SPECS, zipf=0.8, seed=1, concentration=conc)
        routed = src.chunks(SPECS, n * 400, n, seed=2)
        counts = np.stack([np.bincount(np.asarray(c[0][0]).reshape(-1), minlength=E) for c in routed], axis=1)
        p = src.run[0]
        A = np.inf if conc is None else conc * E
        want = (1 - (p ** 2).sum()) * ((n + A) / (1 + A) if conc else 1.0)
        assert dispersion(counts) == pytest.approx(want, rel=0.12)


def test_workload_mixes_and_their_hot_sets():
    same = synthetic(SPECS, zipf=1.0, workload_overlap=1.0, calibration="mixed", workload="code")
    assert np.allclose(same.calibration[0], same.run[0])            # one hot set for every workload
    apart = synthetic(SPECS, zipf=1.0, workload_overlap=0.0, calibration="mixed", workload="code")
    assert tv_overlap(apart.calibration[0], apart.run[0]) < 0.9
    mine = synthetic(SPECS, zipf=1.0, workload_overlap=0.0, calibration="code", workload="code")
    assert np.allclose(mine.calibration[0], mine.run[0])             # calibrated on the prompt's own workload
    # the solved overlap reproduces the asked 1 - TV on this curve (the transfer of the measured default)
    curve = zipf_shares(16, 1.0)
    lo, hi = mix_overlap_curve(curve, 4)[[0, -1]]
    target = (lo + hi) / 2
    w = overlap_for_tv(curve, 4, target)
    got = [synthetic(SPECS, zipf=1.0, workload_overlap=w, calibration="mixed", workload=n, seed=s)
           for n in ("code", "drama") for s in range(4)]
    assert 0 < w < 1 and np.mean([tv_overlap(g.calibration[0], g.run[0]) for g in got]) == pytest.approx(target,
                                                                                                       abs=0.05)


def test_defaults_are_measured_and_stated():
    d = load_defaults()
    assert "routing-stats --model tiny" in d["source"] and d["concentration"] > 0 and 0 < d["workload_tv_overlap"] < 1
    src = parse_routing("synthetic:gini=0.6", [SimpleNamespace(layer=0, n_experts=64, top_k=4)])
    assert f"concentration={d['concentration']:g}" in src.label and "defaults measured" in src.label
    assert f"workload={d['workload']}" in src.label and str(DEFAULTS_FILE.name) in src.label
    given = parse_routing("synthetic:gini=0.6,concentration=inf,doc_concentration=inf,workload_overlap=1,"
                          "calibration=mixed,workload=mixed", [SimpleNamespace(layer=0, n_experts=64, top_k=4)])
    assert "defaults measured" not in given.label                   # every field given: nothing from the file


def _profile(path: Path, E=8, n_chunks=6, chunk=64):
    """Even chunks route everything to expert 0 and 1, odd ones to 6 and 7 (top-2): a strong per-chunk structure."""
    rows = []
    for c in range(n_chunks):
        hot = (0, 1) if c % 2 == 0 else (6, 7)
        for e in range(E):
            rows.append(dict(layer=0, expert=e, chunk_id=c, count=chunk if e in hot else 0))
    counts = pd.DataFrame(rows)
    stats = counts.groupby(["layer", "expert"], as_index=False)["count"].sum().assign(
        weight_sum=0.0, weight_sq_sum=0.0, norm_sum=0.0)
    meta = {"chunk": chunk, "model_fingerprint": "f" * 64, "workload": "toy", "n_tokens": chunk * n_chunks,
            "layers": [dict(layer=0, n_experts=E, top_k=2, hidden=64, intermediate=32)]}
    CalibrationProfile(counts, stats, meta).save(path)
    return [SimpleNamespace(layer=0, n_experts=E, top_k=2, hidden=64, intermediate=32)]


def test_profile_routing_keeps_its_per_chunk_structure(tmp_path):
    specs = _profile(tmp_path / "p")
    src = parse_routing(f"profile:{tmp_path / 'p'},workload_overlap=1", specs)
    for c, per in enumerate(src.chunks(specs, 64 * 6, 64)):
        assert set(per[0][0].reshape(-1).tolist()) == ({0, 1} if c % 2 == 0 else {6, 7})
    other = parse_routing(f"profile:{tmp_path / 'p'},run={tmp_path / 'p'}", specs)
    assert "replays the chunks of p" in other.label
    shifted = parse_routing(f"profile:{tmp_path / 'p'}", specs)      # default: the measured hot-set shift
    assert "solved for the measured 1-TV" in shifted.label


@pytest.mark.parametrize("spec,message", [
    ("synthetic:gini=0.6,gini=0.7", "given twice"),
    ("synthetic:gini=0.6,hotness=2", "unknown"),
    ("synthetic:gini=0.6,concentration=0", "concentration"),
    ("synthetic:gini=0.6,doc_concentration=-1", "doc_concentration"),
    ("synthetic:gini=0.6,workload=novels", "unknown workload"),
    ("synthetic:gini=0.6,calibration=code+poetry", "unknown workload"),
    ("synthetic:gini=0.6,calibration=code+code", "twice"),
    ("tiny:workload=novels", "unknown workload"),
])
def test_bad_routing_is_one_line_exit_2_nothing_written(spec, message, tmp_path, capsys):
    with pytest.raises(NpuMoeError, match=message):
        parse_routing(spec, SPECS)
    out = tmp_path / "sim"
    rc = cli.main(["simulate", "--geometry", "phi-tiny-moe", "--routing", spec, "--variant", "anemll",
                   "--prompt-len", "256", "--chunk", "256", "--out", str(out)])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and len(err.splitlines()) == 1 and message.split()[0] in err
    assert not out.exists()


def test_routing_stats_from_profiles_writes_defaults_simulate_can_read(tmp_path, capsys):
    specs = _profile(tmp_path / "cal")
    _profile(tmp_path / "run", n_chunks=8)
    out = tmp_path / "defaults.yaml"
    assert cli.main(["routing-stats", "--profile", str(tmp_path / "cal"), "--profile", str(tmp_path / "run"),
                     "--out", str(out)]) == 0
    d = load_defaults(out)
    assert "routing-stats --profile" in d["source"] and d["calibration"] == "mixed"
    # two hot pairs alternating chunk by chunk: far more dispersed than independent tokens, finite concentration
    assert d["concentration"] < 1e3 and d["workload_tv_overlap"] == pytest.approx(1.0)
    src = parse_routing("synthetic:zipf=1", specs, defaults=d)
    assert f"concentration={d['concentration']:g}" in src.label
    capsys.readouterr()                      # the first run's progress bar: not part of the refusal below
    assert cli.main(["routing-stats", "--model", "tiny", "--profile", str(tmp_path / "cal"),
                     "--out", str(tmp_path / "x.yaml")]) == 2
    assert not (tmp_path / "x.yaml").exists() and len(capsys.readouterr().err.strip().splitlines()) == 1
