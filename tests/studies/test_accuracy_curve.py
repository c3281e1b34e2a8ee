"""The accuracy-vs-drop curve (studies/accuracy_curve.py): exact bounds against hand-computed closed forms, the
teacher-forced decoding against token-by-token greedy decoding, the curve's drop rates against drops recounted
from the routing and the plans' capacities, and bad input on the CLI (one line, exit 2, nothing written)."""
import copy
import math

import numpy as np
import pytest
import torch

from npumoe_lab.cli import main
from npumoe_lab.execution.experts import attach, detach, dropless_executor, set_executor
from npumoe_lab.execution.routing import RoutingRecorder
from npumoe_lab.execution.runtime import PrefillConfig, chunked_prefill, run_prefill
from npumoe_lab.models import TINY_MODEL_DIR, load_model
from npumoe_lab.planning.plan import variant_plan
from npumoe_lab.results.stats import paired_exact
from npumoe_lab.studies.accuracy_curve import accuracy_curve
from npumoe_lab.studies.accuracy_scoring import greedy_against
from npumoe_lab.studies.accuracy_verdict import LOSS_TARGET, loss_upper_bound, safe_drop
from npumoe_lab.workloads import get_workload
from npumoe_lab.workloads.difficulty import difficulty_for
from npumoe_lab.workloads.scoring import evaluate_sample


def _cp_upper_k1(n, tail):
    """Clopper-Pearson upper end for k = 1 by bisection of (1-p)^n + n p (1-p)^(n-1) = tail (no scipy)."""
    lo, hi = 0.0, 1.0
    for _ in range(200):
        p = (lo + hi) / 2
        lo, hi = (p, hi) if (1 - p) ** n + n * p * (1 - p) ** (n - 1) > tail else (lo, p)
    return (lo + hi) / 2


def test_exact_bounds_match_hand_computed_closed_forms():
    n = 20
    ref = np.ones(n)
    var = ref.copy()
    var[0] = 0                                    # one lost, none gained
    ex = paired_exact(ref, var)
    # Bonferroni: each rate at 97.5 % two-sided, i.e. 1.25 % per tail; k = 0: upper 1 - tail^(1/n); k = 1: lower
    # 1 - (1 - tail)^(1/n), upper by bisection
    tail = 0.0125
    u_gained, l_lost, u_lost = 1 - tail ** (1 / n), 1 - (1 - tail) ** (1 / n), _cp_upper_k1(n, tail)
    assert ex["lost"] == 1 and ex["gained"] == 0
    assert ex["exact_low"] == pytest.approx(0 - u_lost, abs=1e-9)
    assert ex["exact_high"] == pytest.approx(u_gained - l_lost, abs=1e-9)
    assert ex["loss_bound"] == pytest.approx(_cp_upper_k1(n, 0.025), abs=1e-9)   # two-sided 95 %: 2.5 % tail
    assert ex["mcnemar_p"] == 1.0                 # binomial(1 of 1, 0.5), two-sided
    var[1:3] = 0
    assert paired_exact(ref, var)["mcnemar_p"] == pytest.approx(2 * 0.5 ** 3)   # 3 lost, 0 gained
    # the verdict's one-sided 95 % bound on the lost rate: 1 - 0.05^(1/n) with none lost
    assert loss_upper_bound(0, 300) == pytest.approx(1 - 0.05 ** (1 / 300), abs=1e-12)
    assert loss_upper_bound(0, 300) < LOSS_TARGET < loss_upper_bound(1, 300)
    assert loss_upper_bound(1, 300) == pytest.approx(_cp_upper_k1(300, 0.05), abs=1e-9)
    # the acceptance: at n = 300 with 2 samples changed the loss bound is <= 2.5 points
    r300, v300 = np.ones(300), np.ones(300)
    v300[:2] = 0
    assert paired_exact(r300, v300)["loss_bound"] <= 0.025


def test_safe_drop_stops_at_the_first_failing_plan():
    import pandas as pd
    rows = pd.DataFrame(dict(drop_rate=[0.02, 0.05, 0.10, 0.20], loss_under_target=[True, True, False, True]))
    assert safe_drop(rows) == 0.05
    assert safe_drop(rows.assign(loss_under_target=False)) is None


def test_rule_vs_control_is_paired_on_the_same_samples():
    import pandas as pd
    from npumoe_lab.studies.accuracy_verdict import rule_vs_control
    n = 10
    ref = [1] * n
    sal = [1] * 8 + [0, 1]             # sample 8 lost
    rnd = [0, 0, 0] + [1] * 5 + [1, 0]  # samples 0-2 and 9 lost, sample 8 kept
    samples = pd.DataFrame(
        [dict(workload="t", saliency=r, percentile=50.0, sample=i, ref_score=ref[i], score=sc[i],
              nll=1.0 + (0.1 if r == "random" else 0.0) + 0.01 * i, top1_agree=0.9 if r == "random" else 0.95)
         for r, sc in (("weight_x_norm", sal), ("random", rnd)) for i in range(n)])
    rows = pd.DataFrame([dict(workload="t", saliency=r, percentile=50.0, drop_rate=d)
                         for r, d in (("weight_x_norm", 0.2), ("random", 0.21))])
    (c,) = rule_vs_control(samples, rows, "t", "weight_x_norm").itertuples()
    assert (c.rule_better, c.rule_worse) == (4, 1)       # right where random is wrong: 0, 1, 2, 9; the reverse: 8
    assert c.mcnemar_p == pytest.approx(2 * (1 + 5) / 2 ** 5)   # two-sided binomial, 1 of 5 discordant
    assert c.accuracy_diff == pytest.approx(0.9 - 0.6) and c.nll_diff == pytest.approx(-0.1)
    assert c.nll_diff_ci_high == pytest.approx(-0.1) and (c.drop_rate, c.control_drop_rate) == (0.2, 0.21)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    if not (TINY_MODEL_DIR / "config.json").is_file():
        pytest.skip("the bundled tiny model is not built")
    mp = pytest.MonkeyPatch()
    mp.setenv("NPUMOE_CACHE", str(tmp_path_factory.mktemp("cache")))
    yield load_model("tiny")
    mp.undo()


def test_teacher_forced_decoding_equals_step_by_step_greedy(tiny):
    model, tok = tiny
    from npumoe_lab.execution.calibrate import calibration_profile
    profile = calibration_profile(model, tok, "mixed", 256, 2048)
    attach(model, variant_plan(profile, "npumoe-tg", model, platform="m2-max", percentile=50, saliency="random"))
    wl = get_workload("ruler-vt", n_vars=4, n_chains=4)
    try:
        for s in wl.samples(tok, 512, 2, seed=1):
            res = chunked_prefill(model, torch.tensor([s.input_ids]), PrefillConfig.untimed(256, tok.pad_token_id))
            prev = set_executor(model, dropless_executor)
            slow = evaluate_sample(model, tok, s, wl, prefill_fn=lambda m, ids: (res.logits,
                                                                                 copy.deepcopy(res.past_key_values)))
            truth = slow["generated_ids"]
            assert len(truth) >= 4
            wrong_mid = truth[:3] + [(truth[3] + 1) % 4096] + truth[4:]
            for ref_ids in (truth, wrong_mid, [], [(truth[0] + 1) % 4096] + truth[1:]):
                got = greedy_against(model, res.logits[0, -1], copy.deepcopy(res.past_key_values), ref_ids,
                                     wl.max_new_tokens, tok.eos_token_id)
                assert got == truth
            set_executor(model, prev)
    finally:
        detach(model)


def test_small_curve_drop_rates_are_the_plans_measured_drops(tiny):
    model, tok = tiny
    rows, samples = accuracy_curve(model=tiny, workloads=("lm-next", "ruler-multikey"), percentiles=(50, 100),
                                   saliency=("weight_x_norm", "random"), n=2, calib_tokens=2048,
                                   difficulty={"ruler-multikey": {"n_needles": 8}})
    assert len(rows) == 8 and len(samples) == 8 * 2
    assert set(rows.timing_source) == {"modeled"} and rows.ttft_s.gt(0).all()
    assert (rows.ttft_s_lo < rows.ttft_s).all() and (rows.ttft_s < rows.ttft_s_hi).all()   # test_accuracy_cache
    from npumoe_lab.execution.calibrate import calibration_profile
    profile = calibration_profile(model, tok, "mixed", 256, 2048)
    for r in rows.itertuples():
        plan = variant_plan(profile, "npumoe-tg", model, platform="m2-max", percentile=r.percentile,
                            saliency=r.saliency)
        assert plan.hash == r.plan_hash
        caps = {lp["layer"]: np.asarray(lp["capacity"]) for lp in plan.layers}
        wl = get_workload(r.workload, **difficulty_for(r.workload, **({"n_needles": 8} if r.workload ==
                                                                      "ruler-multikey" else {})).options)
        dropped = routed = 0
        attach(model, plan, npu_dtype=PrefillConfig("m2-max", 256).npu_dtype)   # as the curve ran it: fp16 NPU
        try:
            for s in wl.samples(tok, r.prompt_len, 2, seed=0):
                with RoutingRecorder(model) as rec:
                    chunked_prefill(model, torch.tensor([s.input_ids]), PrefillConfig.untimed(256, tok.pad_token_id))
                for rc in rec.records:      # every prompt fills whole chunks: no padding token to exclude
                    load = np.bincount(rc.topk_idx.reshape(-1).numpy(), minlength=len(caps[rc.layer]))
                    dropped += int(np.maximum(load - caps[rc.layer], 0).sum())
                    routed += rc.topk_idx.numel()
        finally:
            detach(model)
        assert (r.dropped, r.routed) == (dropped, routed)
        assert r.drop_rate == pytest.approx(dropped / routed, abs=1e-12)
    for _, g in rows.groupby("workload"):      # a lower percentile: smaller capacities, more dropped
        assert g[g.percentile == 50].drop_rate.min() > g[g.percentile == 100].drop_rate.max()
    # per-sample outcomes reproduce the rows
    for r in rows.itertuples():
        s = samples[(samples.workload == r.workload) & (samples.saliency == r.saliency)
                    & (samples.percentile == r.percentile)]
        assert s.score.mean() - s.ref_score.mean() == pytest.approx(r.accuracy_delta)


@pytest.mark.parametrize("args,needle", [
    (["--percentiles", "0,50"], "percentile 0.0 is outside (0, 100]"),
    (["--percentiles", "50,100.5"], "outside (0, 100]"),
    (["--n", "0"], "n must be an integer >= 1"),
    (["--saliency", "weight_x_norm,loudest"], "unknown saliency rule 'loudest'"),
    (["--workload", "ruler-nope"], "unknown workload 'ruler-nope'"),
    (["--workload", "lm-heldout"], "not right/wrong per sample"),
    (["--workload", "ruler-multikey", "--prompt-len", "4096"], "context"),
    (["--workload", "ruler-multikey", "--difficulty", "ruler-multikey:n_needles=40"], "too short"),
    (["--workload", "ruler-vt", "--difficulty", "ruler-vt:n_hops=3"], "has no option 'n_hops'"),
])
def test_bad_input_is_one_line_exit_2_nothing_written(tmp_path, capsys, args, needle):
    out = tmp_path / "curve"
    assert main(["accuracy", "--model", "tiny", "--out", str(out), *args]) == 2
    err = capsys.readouterr().err.strip()
    assert needle in err and "\n" not in err, err
    assert not out.exists()
