"""Exact bounds of a paired accuracy change against hand-computed Clopper-Pearson and binomial references."""
from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.stats import beta, binom

from npumoe_lab.errors import NpuMoeError
from npumoe_lab.results.stats import change_statement, clopper_pearson, paired_exact


def test_no_discordant_pair_leaves_a_10_point_loss_open_at_n32():
    r = paired_exact(np.ones(32), np.ones(32))
    assert (r["lost"], r["gained"], r["mcnemar_p"]) == (0, 0, 1.0)
    # CP upper bound of 0/n at 95 % two-sided: 1 - 0.025^(1/n) (closed form)
    assert r["loss_bound"] == pytest.approx(1 - 0.025 ** (1 / 32), rel=1e-9)
    assert r["loss_bound"] == pytest.approx(0.109, abs=1e-3)
    assert r["exact_low"] < -0.10 and r["exact_high"] > 0.10      # never the collapsed [0, 0]
    text = change_statement(r["lost"], r["gained"], r["n"], r["loss_bound"])
    assert text == "no sample changed; a loss up to 10.9 points is not excluded at n = 32"


def test_discordant_pairs_match_beta_quantiles_and_binomial_test():
    ref = np.array([1] * 20 + [0] * 10)
    var = ref.copy()
    var[:5] = 0          # 5 lost
    var[20] = 1          # 1 gained
    r = paired_exact(ref, var)
    assert (r["lost"], r["gained"]) == (5, 1)
    # McNemar exact: two-sided binomial p of 1 success in 6 at 0.5 = 2 * P(X <= 1)
    assert r["mcnemar_p"] == pytest.approx(2 * binom.cdf(1, 6, 0.5))
    # Clopper-Pearson at 97.5 % each (Bonferroni) from beta quantiles
    a = 0.025
    up_lost, lo_lost = beta.ppf(1 - a / 2, 6, 25), beta.ppf(a / 2, 5, 26)
    up_gain, lo_gain = beta.ppf(1 - a / 2, 2, 29), beta.ppf(a / 2, 1, 30)
    assert r["exact_low"] == pytest.approx(lo_gain - up_lost, abs=1e-9)
    assert r["exact_high"] == pytest.approx(up_gain - lo_lost, abs=1e-9)
    assert r["exact_low"] < (1 - 5) / 30 < r["exact_high"]


def test_non_binary_scores_give_no_exact_bound_and_bad_input_is_named():
    r = paired_exact([2.9, 3.1], [3.0, 3.2])          # NLLs: no discordant pairs to count
    assert math.isnan(r["lost"]) and "not 0/1" in change_statement(r["lost"], r["gained"], 2, r["loss_bound"])
    with pytest.raises(NpuMoeError, match="one variant outcome per reference"):
        paired_exact([1, 0], [1])
    with pytest.raises(NpuMoeError, match="0 <= k <= n"):
        clopper_pearson(3, 2)
