"""sampled_gini (noise drawn once per tokens, E and seed) against counting the sampler's own draw."""
import numpy as np
from hypothesis import given, settings, strategies as st

from npumoe_lab.sim.routing import gini, sample_routing_np, sampled_gini, zipf_for_gini, zipf_shares


def _counted(shares, K, tokens, seed):
    idx, _ = sample_routing_np(shares, tokens, K, np.random.default_rng(seed))
    return gini(np.bincount(idx.reshape(-1), minlength=len(shares)))


@settings(max_examples=25, deadline=None)
@given(E=st.integers(2, 160), K=st.integers(1, 8), tokens=st.integers(1, 600), seed=st.integers(0, 3),
       s=st.floats(0.0, 4.0))
def test_equals_the_counted_draw(E, K, tokens, seed, s):
    K = min(K, E)
    shares = zipf_shares(E, s)
    assert sampled_gini(shares, K, tokens=tokens, seed=seed) == _counted(shares, K, tokens, seed)
    assert sampled_gini(shares[::-1], K, tokens=tokens, seed=seed) == _counted(shares[::-1], K, tokens, seed)


def test_repeated_calls_share_the_noise_without_changing_it():
    shares = zipf_shares(128, 1.1)
    first = sampled_gini(shares, 8)
    for s in (0.3, 2.0, 1.1):
        assert sampled_gini(zipf_shares(128, s), 8) == _counted(zipf_shares(128, s), 8, 4096, 0)
    assert sampled_gini(shares, 8) == first


def test_bisection_reaches_its_target():
    s = zipf_for_gini(64, 4, 0.5)
    assert abs(_counted(zipf_shares(64, s), 4, 4096, 0) - 0.5) < 0.01
