"""Exact statistics of a paired accuracy change (variant vs reference on the same samples).

A bootstrap CI of the mean delta collapses to [0, 0] when no sample changed, which reads as "no loss"; with n
samples and no discordant pair a loss of 1 - (alpha/2)^(1/n) (about 11 points at n = 32) is still consistent
with the data. The exact view uses only the discordant pairs: `lost` (reference right, variant wrong) and
`gained` (the reverse). McNemar's exact test is a binomial test of lost vs gained; Clopper-Pearson intervals of
the lost and gained rates bound the change: delta = gained/n - lost/n lies in [L_gained - U_lost,
U_gained - L_lost] with joint coverage >= 1 - alpha (Bonferroni: each interval at 1 - alpha/2).
"""
from __future__ import annotations

import math

import numpy as np

from npumoe_lab.errors import NpuMoeError


def clopper_pearson(k: int, n: int, confidence: float = 0.95) -> tuple[float, float]:
    """Exact (Clopper-Pearson) two-sided interval of a binomial proportion k/n."""
    from scipy.stats import binomtest
    if n < 1 or not 0 <= k <= n:
        raise NpuMoeError(f"clopper_pearson needs 0 <= k <= n and n >= 1; got k={k}, n={n}")
    ci = binomtest(k, n).proportion_ci(confidence_level=confidence, method="exact")
    return float(ci.low), float(ci.high)


def paired_exact(ref_correct, var_correct, alpha: float = 0.05) -> dict:
    """Exact bounds of the accuracy change from paired 0/1 outcomes (NaN fields when scores are not 0/1)."""
    from scipy.stats import binomtest
    ref = np.asarray(ref_correct, dtype=float)
    var = np.asarray(var_correct, dtype=float)
    if ref.shape != var.shape:
        raise NpuMoeError(f"paired_exact needs one variant outcome per reference outcome; got {ref.shape} and "
                          f"{var.shape}")
    n = int(ref.size)
    nan = float("nan")
    if n == 0 or not np.isin(np.concatenate([ref, var]), (0.0, 1.0)).all():
        return dict(n=n, lost=nan, gained=nan, mcnemar_p=nan, exact_low=nan, exact_high=nan, loss_bound=nan)
    lost = int(((ref == 1) & (var == 0)).sum())
    gained = int(((ref == 0) & (var == 1)).sum())
    lo_l, hi_l = clopper_pearson(lost, n, 1 - alpha / 2)
    lo_g, hi_g = clopper_pearson(gained, n, 1 - alpha / 2)
    p = binomtest(lost, lost + gained, 0.5).pvalue if lost + gained else 1.0
    return dict(n=n, lost=lost, gained=gained, mcnemar_p=float(p), exact_low=lo_g - hi_l, exact_high=hi_g - lo_l,
                loss_bound=clopper_pearson(lost, n, 1 - alpha)[1])


def change_statement(lost, gained, n, loss_bound, exact_low=None, exact_high=None) -> str:
    """One sentence a reader cannot misread as 'no loss' when nothing changed."""
    if n is None or (isinstance(lost, float) and math.isnan(lost)):
        return "no exact bound (scores are not 0/1 per sample)"
    if lost == 0 and gained == 0:
        return f"no sample changed; a loss up to {100 * loss_bound:.1f} points is not excluded at n = {int(n)}"
    span = "" if exact_low is None else f", exact 95% bounds on the change [{100 * exact_low:+.1f}, " \
                                        f"{100 * exact_high:+.1f}] points"
    return f"{int(lost)} sample(s) lost, {int(gained)} gained of n = {int(n)}{span}"
