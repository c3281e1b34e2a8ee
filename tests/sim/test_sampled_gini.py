"""sampled_gini and zipf_for_gini's bisection (its noise drawn once) against the sampler's rule written out here:
Gumbel top-k by argpartition + stable sort, drawn by a fresh generator per count, as the code did before."""
import numpy as np
from hypothesis import given, settings, strategies as st

from npumoe_lab.sim.routing import gini, sampled_gini, zipf_for_gini, zipf_shares
from npumoe_lab.sim.topk import argpartition_smallest_k


def _counted(shares, K, tokens, seed):
    """The Gini of `tokens` tokens routed ~ shares by default_rng(seed): the sampler's float32 formula, inline."""
    logp = np.log(np.maximum(np.asarray(shares, dtype=np.float64), 1e-30)).astype(np.float32)
    u = np.random.default_rng(seed).random((tokens, len(logp)), dtype=np.float32)
    neg = np.log(-np.log(np.maximum(u, np.float32(1e-30)))) - logp
    idx, _ = argpartition_smallest_k(neg, K)
    return gini(np.bincount(idx.reshape(-1), minlength=len(shares)))


def _bisection(E, K, target, seed=0):
    lo, hi = 0.0, 12.0
    for _ in range(30):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if _counted(zipf_shares(E, mid), K, 4096, seed) < target else (lo, mid)
    return (lo + hi) / 2


@settings(max_examples=25, deadline=None)
@given(E=st.integers(2, 160), K=st.integers(1, 8), tokens=st.integers(1, 600), seed=st.integers(0, 3),
       s=st.floats(0.0, 4.0))
def test_equals_the_counted_draw(E, K, tokens, seed, s):
    K = min(K, E)
    shares = zipf_shares(E, s)
    assert sampled_gini(shares, K, tokens=tokens, seed=seed) == _counted(shares, K, tokens, seed)
    assert sampled_gini(shares[::-1], K, tokens=tokens, seed=seed) == _counted(shares[::-1], K, tokens, seed)


def test_bisection_equals_one_that_draws_afresh_each_step():
    for E, K, target, seed in [(64, 4, 0.5, 0), (16, 2, 0.3, 1)]:
        s = zipf_for_gini(E, K, target, seed)
        assert s == _bisection(E, K, target, seed)
        assert abs(_counted(zipf_shares(E, s), K, 4096, seed) - target) < 0.01
