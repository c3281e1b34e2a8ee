"""The accuracy harness: metrics against NumPy references, and `accuracy_report` end to end on a small
stand-in model (dropless variants must show no change; a pruning plan's row must be self-consistent)."""
import numpy as np
import pytest
import torch

from npumoe_lab.studies.accuracy import accuracy_report, percentile_for_drop_rate, plan_drop_rate
from npumoe_lab.results.metrics import bootstrap_ci, logit_agreement
from npumoe_lab.models import TINY_MODEL_DIR


def _np_log_softmax(x):
    x = x - x.max(-1, keepdims=True)
    return x - np.log(np.exp(x).sum(-1, keepdims=True))


def test_logit_agreement_matches_numpy():
    g = torch.Generator().manual_seed(0)
    ref = torch.randn(2, 7, 11, generator=g)
    var = ref + 0.7 * torch.randn(2, 7, 11, generator=g)
    got = logit_agreement(ref, var)
    r, v = ref.numpy().reshape(-1, 11).astype(np.float64), var.numpy().reshape(-1, 11).astype(np.float64)
    lr, lv = _np_log_softmax(r), _np_log_softmax(v)
    assert got["kl"] == pytest.approx(float((np.exp(lr) * (lr - lv)).sum(-1).mean()), rel=1e-4)
    assert got["top1_agree"] == pytest.approx(float((r.argmax(-1) == v.argmax(-1)).mean()))
    same = logit_agreement(ref, ref.clone())
    assert same["top1_agree"] == 1.0 and same["kl"] < 1e-6


def test_logit_agreement_in_row_blocks_equals_one_block(monkeypatch):
    """Long prompts at a real vocabulary are compared in row blocks (bounded memory): same top-1, same KL, and the
    reference's log-probabilities bit-identical to one whole-tensor log_softmax (a row never depends on its block)."""
    from npumoe_lab.results import metrics
    g = torch.Generator().manual_seed(3)
    ref = torch.randn(1, 9, 11, generator=g).to(torch.bfloat16)
    var = (ref.float() + 0.5 * torch.randn(1, 9, 11, generator=g)).to(torch.bfloat16)
    whole = logit_agreement(ref, var)
    monkeypatch.setattr(metrics, "BLOCK_ELEMENTS", 2 * 11)       # 2-row blocks: 5 of them, the last one short
    assert [b.stop - b.start for b in metrics.row_blocks(9, 11)] == [2, 2, 2, 2, 1]
    blocked = logit_agreement(ref, var)
    assert blocked["top1_agree"] == whole["top1_agree"]
    assert blocked["kl"] == pytest.approx(whole["kl"], rel=1e-6)
    assert torch.equal(metrics.ReferenceLogits(ref).logprobs, torch.log_softmax(ref.float().reshape(9, 11), -1))


def test_bootstrap_ci_width_matches_the_normal_approximation():
    x = np.random.default_rng(1).normal(0.3, 2.0, size=400)
    mean, lo, hi = bootstrap_ci(x, n_boot=4000, seed=0)
    assert mean == pytest.approx(x.mean())
    half = 1.96 * x.std(ddof=1) / np.sqrt(len(x))
    assert lo < mean < hi
    assert (hi - lo) / 2 == pytest.approx(half, rel=0.1)
    assert bootstrap_ci([0.0, 0.0, 0.0]) == (0.0, 0.0, 0.0)   # no change on any sample: a zero-width CI
    assert bootstrap_ci([0.5]) == (0.5, 0.5, 0.5)


@pytest.fixture(scope="module")
def standin(tmp_path_factory):
    if not (TINY_MODEL_DIR / "tokenizer.json").exists():
        pytest.skip("bundled tokenizer not present")
    from tests.model_zoo import save_standin
    from npumoe_lab.models import load_model
    return load_model(str(save_standin(tmp_path_factory.mktemp("standin"), TINY_MODEL_DIR)))


def test_dropless_variant_shows_no_change(standin, tmp_path, monkeypatch):
    monkeypatch.setenv("NPUMOE_CACHE", str(tmp_path / "cache"))
    df = accuracy_report(standin, workloads=("lm-heldout", "fewshot-cls"), variant="cpu-only", platform="cpu",
                         prompt_len=512, chunk=256, n_samples=2, repeats=1)
    assert list(df.workload) == ["lm-heldout", "fewshot-cls"]
    assert (df.drop_rate == 0).all() and (df.top1_agree == 1.0).all() and (df.kl < 1e-8).all()
    assert np.allclose(df.accuracy_delta, 0, atol=1e-6) and np.allclose(df.score, df.ref_score, atol=1e-6)


def test_pruning_plan_row_is_consistent(standin, tmp_path, monkeypatch):
    monkeypatch.setenv("NPUMOE_CACHE", str(tmp_path / "cache"))
    # npumoe-tg: every group resident, so the static path prunes (under npumoe's cost residency the standin's tiny
    # groups all run dropless on the CPU: m2-max's 0.3 ms per NPU call outweighs their work)
    df = accuracy_report(standin, workloads=("lm-heldout",), variant="npumoe-tg", platform="m2-max",
                         prompt_len=512, chunk=256, n_samples=3, tiers=3, percentile=30)
    row = df.iloc[0]
    assert 0 < row.drop_rate < 1 and 0 <= row.pad_rate < 1
    assert row.accuracy_delta == pytest.approx(row.score - row.ref_score)   # paired mean of per-sample deltas
    assert row.accuracy_ci_low <= row.accuracy_delta <= row.accuracy_ci_high
    assert row.kl > 0 and row.percentile == 30   # pruning moved the logits (random experts: by little)
    # speed of the very plan whose accuracy the row reports (lm-heldout scores are NLLs: no exact 0/1 bound)
    assert row.ttft_s > 0 and row.timing_source == "modeled" and isinstance(row.plan_hash, str)
    assert "not 0/1" in row.statement


def test_percentile_for_drop_rate_picks_the_highest_in_range(standin, tmp_path, monkeypatch):
    monkeypatch.setenv("NPUMOE_CACHE", str(tmp_path / "cache"))
    from npumoe_lab.execution.calibrate import calibration_profile
    from npumoe_lab.planning.plan import build_plan
    model, tok = standin
    profile = calibration_profile(model, tok, "mixed", 256, 2048)
    cands = (95, 80, 60, 40, 20)
    rates = {p: plan_drop_rate(build_plan(profile, model, percentile=p, tiers=3)) for p in cands}
    assert rates[95] <= rates[40] + 1e-12           # a lower percentile never drops less
    lo, hi = rates[60] - 1e-9, rates[40] + 1e-9      # a range that holds the 60th and 40th percentile plans
    p, rate = percentile_for_drop_rate(profile, model, (lo, hi), candidates=cands, tiers=3)
    assert p == next(c for c in cands if lo <= rates[c] <= hi) and rate == pytest.approx(rates[p])


def test_target_drop_outside_range_warns(standin, tmp_path, monkeypatch):
    """The percentile is chosen on calibration text; a workload whose drops land outside the range is flagged."""
    monkeypatch.setenv("NPUMOE_CACHE", str(tmp_path / "cache"))
    with pytest.warns(UserWarning, match="fall outside target_drop"):
        accuracy_report(standin, workloads=("lm-heldout",), variant="npumoe", platform="m2-max", prompt_len=512,
                        chunk=256, n_samples=1, tiers=3, target_drop=(0.90, 0.95), calib_tokens=2048)
