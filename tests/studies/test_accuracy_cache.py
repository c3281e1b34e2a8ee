"""The accuracy curve's on-disk reference cache (studies/accuracy_cache.py) and the modeled TTFT interval of its rows:
a second curve over the same samples reads every reference instead of computing it and gives the same rows; any
change of a key part (weights, dtype, task, difficulty, prompt length, seed, chunk) computes it again; the TTFT
interval is re-derived by hand from each plan's op streams priced under the platform's parameter draws."""
import copy

import numpy as np
import pytest
import torch

from npumoe_lab.devices import get_platform
from npumoe_lab.execution.calibrate import calibration_profile
from npumoe_lab.execution.experts import attach, detach
from npumoe_lab.execution.runtime import PrefillConfig, run_prefill
from npumoe_lab.models import TINY_MODEL_DIR, load_model, model_fingerprint
from npumoe_lab.planning.plan import variant_plan
from npumoe_lab.sim.array_replay import stream_metrics
from npumoe_lab.sim.pricing import draws_source, parameter_draws, platform_params
from npumoe_lab.sim.stream import stream_from_ops
from npumoe_lab.studies import accuracy_curve as curve_mod
from npumoe_lab.studies.accuracy_cache import ReferenceCache, reference_key
from npumoe_lab.studies.accuracy_curve import accuracy_curve, reference_scan
from npumoe_lab.studies.accuracy_scoring import reference_record
from npumoe_lab.workloads import get_workload
from npumoe_lab.workloads.difficulty import difficulty_for
from npumoe_lab.workloads.scoring import evaluate_sample

SMALL = dict(percentiles=(50,), saliency=("weight_x_norm",), n=2, calib_tokens=2048)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    if not (TINY_MODEL_DIR / "config.json").is_file():
        pytest.skip("the bundled tiny model is not built")
    mp = pytest.MonkeyPatch()
    cache = tmp_path_factory.mktemp("cache")
    mp.setenv("NPUMOE_CACHE_DIR", str(cache))
    mp.setenv("NPUMOE_CACHE", str(cache))
    yield load_model("tiny")
    mp.undo()


class _Counting:
    """reference_record wrapped: counts the references really computed."""

    def __init__(self):
        self.calls = 0

    def __call__(self, *a, **k):
        self.calls += 1
        return reference_record(*a, **k)


def test_reference_key_changes_with_every_part(tiny):
    model, _ = tiny
    d = difficulty_for("ruler-vt")
    base = reference_key(model, "ruler-vt", d, 0, 256)
    variants = [reference_key(model, "lm-next", d, 0, 256),
                reference_key(model, "ruler-vt", difficulty_for("ruler-vt", n_chains=3), 0, 256),
                reference_key(model, "ruler-vt", difficulty_for("ruler-vt", 384), 0, 256),
                reference_key(model, "ruler-vt", d, 1, 256),
                reference_key(model, "ruler-vt", d, 0, 128)]
    bf16 = copy.deepcopy(model).to(torch.bfloat16)
    variants.append(reference_key(bf16, "ruler-vt", d, 0, 256))
    moved = copy.deepcopy(model)
    with torch.no_grad():
        next(moved.parameters()).add_(0.05)         # far above the fingerprint's bf16 rounding
    model_fingerprint(moved, refresh=True)
    variants.append(reference_key(moved, "ruler-vt", d, 0, 256))
    dirs = {ReferenceCache(k, "/x").dir for k in [base] + variants}
    assert len(dirs) == 1 + len(variants)            # every changed part: another folder, nothing shared
    assert base["dtype"] == "fp32" and variants[-2]["dtype"] == "bf16"


def test_a_second_curve_reads_every_reference_and_gives_the_same_rows(tiny, tmp_path, monkeypatch):
    where = tmp_path / "refs"
    count = _Counting()
    monkeypatch.setattr(curve_mod, "reference_record", count)
    first, s1 = accuracy_curve(model=tiny, workloads=("ruler-vt",), ref_cache=where, **SMALL)
    assert count.calls == 2 and first.ref_cached.tolist() == [0]
    assert len(list(where.rglob("*.pt"))) == 2
    again, s2 = accuracy_curve(model=tiny, workloads=("ruler-vt",), ref_cache=where, **SMALL)
    assert count.calls == 2 and again.ref_cached.tolist() == [2]          # no reference forward this time
    cols = ["ref_score", "score", "ref_nll", "nll", "top1_agree"]
    assert np.array_equal(s1[cols].to_numpy(), s2[cols].to_numpy())
    assert first.accuracy_delta.equals(again.accuracy_delta)
    # a key part changed: computed again (seed: other samples; difficulty; prompt length)
    accuracy_curve(model=tiny, workloads=("ruler-vt",), ref_cache=where, seed=1, **SMALL)
    assert count.calls == 4
    accuracy_curve(model=tiny, workloads=("ruler-vt",), ref_cache=where, difficulty={"ruler-vt": {"n_chains": 3}},
                   **SMALL)
    assert count.calls == 6
    accuracy_curve(model=tiny, workloads=("ruler-vt",), ref_cache=where, prompt_len=384, **SMALL)
    assert count.calls == 8
    # ref_cache off: always computed, nothing read
    off, _ = accuracy_curve(model=tiny, workloads=("ruler-vt",), ref_cache=False, **SMALL)
    assert count.calls == 10 and off.ref_cached.tolist() == [0]


def test_changed_weights_invalidate_the_cache(tiny, tmp_path, monkeypatch):
    model, tok = tiny
    where = tmp_path / "refs"
    count = _Counting()
    monkeypatch.setattr(curve_mod, "reference_record", count)
    accuracy_curve(model=tiny, workloads=("lm-next",), ref_cache=where, **SMALL)
    moved = copy.deepcopy(model)
    with torch.no_grad():
        for p in moved.parameters():
            p.mul_(1.05)
    model_fingerprint(moved, refresh=True)
    accuracy_curve(model=(moved, tok), workloads=("lm-next",), ref_cache=where, **SMALL)
    assert count.calls == 4                                               # not read from the first model's cache


def test_cached_record_round_trips_and_a_foreign_file_is_not_trusted(tiny, tmp_path):
    model, tok = tiny
    wl = get_workload("ruler-vt", **difficulty_for("ruler-vt").options)
    s = wl.samples(tok, 512, 1, seed=0)[0]
    rec = reference_record(model, tok, s, wl, 256, tok.pad_token_id)
    key = reference_key(model, "ruler-vt", difficulty_for("ruler-vt"), 0, 256)
    cache = ReferenceCache(key, tmp_path)
    assert cache.get(0, s) is None
    cache.put(0, s, rec)
    got = cache.get(0, s)
    assert (got.score, got.nll, got.generated) == (rec.score, rec.nll, rec.generated)
    assert torch.equal(got.top1, rec.top1)
    other = wl.samples(tok, 512, 2, seed=5)[1]                              # other tokens at the same index
    assert cache.get(0, other) is None
    # a file under this key's name that holds another key (collision, hand edit): recomputed, not read
    ReferenceCache(dict(key, seed=9), tmp_path).put(0, s, rec)
    path = next((ReferenceCache(dict(key, seed=9), tmp_path).dir).glob("*.pt"))
    path.replace(cache.dir / path.name)
    assert cache.get(0, s) is None


def test_reference_scan_scores_equal_independent_evaluation(tiny, tmp_path):
    model, tok = tiny
    scan = reference_scan(model=tiny, workloads=("lm-next", "ruler-vt"), n=3, ref_cache=tmp_path)
    for r in scan.itertuples():
        d = difficulty_for(r.workload)
        wl = get_workload(r.workload, **d.options)
        detach(model)
        model.set_experts_implementation("eager")
        truth = [evaluate_sample(model, tok, s, wl)["score"] for s in wl.samples(tok, d.prompt_len, 3, seed=0)]
        assert r.ref_score == pytest.approx(np.mean(truth)) and r.n == 3
        assert r.ref_score_lo <= r.ref_score <= r.ref_score_hi
    # the curve after the scan reads the scan's records
    rows, _ = accuracy_curve(model=tiny, workloads=("lm-next",), ref_cache=tmp_path, **{**SMALL, "n": 3})
    assert rows.ref_cached.tolist() == [3] and rows.ref_score.iloc[0] == scan.ref_score.iloc[0]


def test_ttft_interval_is_the_samples_mean_over_the_platforms_draws(tiny):
    model, tok = tiny
    rows, _ = accuracy_curve(model=tiny, workloads=("ruler-vt",), percentiles=(50, 100),
                             saliency=("weight_x_norm",), n=2, calib_tokens=2048, draws=64, seed=3, ref_cache=False)
    plat = get_platform("m2-max")
    assert set(rows.interval_source) == {draws_source(plat)} and set(rows.interval_note) == {""}
    assert (rows.interval_draws == 64).all()
    # by hand: every sample's prefill under the row's plan -> its op stream -> priced under the same 64 draws
    # (parameter_draws with the curve's seed) -> mean over samples per draw -> 5th / 95th percentile
    draws = parameter_draws(plat, 64, 3)
    profile = calibration_profile(model, tok, "mixed", 256, 2048, 3)
    wl = get_workload("ruler-vt", **difficulty_for("ruler-vt").options)
    samples = wl.samples(tok, 512, 2, seed=3)
    config = PrefillConfig(plat, 256, pad_token_id=tok.pad_token_id)
    for r in rows.itertuples():
        plan = variant_plan(profile, "npumoe-tg", model, platform="m2-max", percentile=r.percentile,
                            saliency="weight_x_norm")
        attach(model, plan, npu_dtype=config.npu_dtype)
        try:
            per, point = [], []
            for s in samples:
                res = run_prefill(model, torch.tensor([s.input_ids]), config)
                stream = stream_from_ops(res.ops, len(s.input_ids))
                per.append(stream_metrics(stream, draws, plat.npu_shares_cpu)["ttft_s"])
                # the stream is the plan's: at the point parameters it prices as the per-op engine did
                point.append(stream_metrics(stream, platform_params(plat), plat.npu_shares_cpu)["ttft_s"][0])
                assert point[-1] == pytest.approx(res.summary["ttft_s"], rel=1e-9)
        finally:
            detach(model)
        lo, hi = np.percentile(np.mean(per, axis=0), [5, 95])
        assert (r.ttft_s_lo, r.ttft_s_hi) == pytest.approx((lo, hi), rel=1e-12)
        assert r.ttft_s_lo < r.ttft_s < r.ttft_s_hi and r.ttft_s == pytest.approx(np.mean(point), rel=1e-9)


def test_no_interval_says_why(tiny):
    rows, _ = accuracy_curve(model=tiny, workloads=("lm-next",), percentiles=(100,), saliency=("random",), n=1,
                             calib_tokens=2048, platform="m2-max", draws=0, ref_cache=False)
    r = rows.iloc[0]
    assert np.isnan(r.ttft_s_lo) and np.isnan(r.ttft_s_hi) and r.interval_source == "none"
    assert "draws = 0" in r.interval_note and r.ttft_s > 0


def test_graph_level_platform_has_an_interval(tiny):
    # the graph-level NPU cost is priced on arrays over draws (sim/pricing STRUCTURES): its rows carry an interval
    rows, _ = accuracy_curve(model=tiny, workloads=("lm-next",), percentiles=(100,), saliency=("random",), n=1,
                             calib_tokens=2048, platform="m2-max[npu_graph_model=graph]", draws=16, ref_cache=False)
    r = rows.iloc[0]
    assert r.interval_source != "none" and r.interval_note == ""
    assert r.ttft_s_lo < r.ttft_s_hi and r.ttft_s_lo <= r.ttft_s * 1.5 and r.ttft_s_hi >= r.ttft_s / 1.5


def test_bad_draws_is_one_line_exit_2_nothing_written(tmp_path, capsys):
    from npumoe_lab.cli import main
    out = tmp_path / "curve"
    assert main(["accuracy", "--model", "tiny", "--workload", "lm-next", "--n", "1", "--draws", "-1",
                 "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert "draws must be an integer >= 0" in err and "\n" not in err
    assert not out.exists()
