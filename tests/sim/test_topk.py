"""smallest_k and smallest_k_mask against the sampler's original argpartition + stable argsort, ties and NaNs
included."""
import numpy as np
from hypothesis import given, settings, strategies as st
from hypothesis.extra.numpy import arrays

from npumoe_lab.sim.topk import argpartition_smallest_k, column_counts, smallest_k, smallest_k_mask


def _same(neg, K):
    a, b = argpartition_smallest_k(neg, K), smallest_k(neg, K)
    np.testing.assert_array_equal(a[0], b[0])
    np.testing.assert_array_equal(a[1], b[1])
    assert b[0].dtype == a[0].dtype and b[1].dtype == a[1].dtype
    mask = smallest_k_mask(neg, K)          # the same entries, unordered: each row's picks marked one by one
    want = np.zeros(neg.shape, dtype=bool)
    for r, picks in enumerate(a[0]):
        want[r, picks] = True
    np.testing.assert_array_equal(mask, want)


def test_sampler_shapes_equal_the_reference():
    rng = np.random.default_rng(3)
    for T, E, K in [(256, 128, 8), (1024, 128, 8), (512, 16, 2), (7, 60, 4), (1, 3, 2)]:
        logp = np.log(rng.dirichlet(np.ones(E))).astype(np.float32)
        u = rng.random((T, E), dtype=np.float32)
        _same(np.log(-np.log(np.maximum(u, np.float32(1e-30)))) - logp, K)


def test_rows_with_ties_follow_the_reference():
    rng = np.random.default_rng(4)
    neg = rng.integers(0, 6, size=(300, 16)).astype(np.float32)     # ties everywhere, also at the K-th value
    for K in (1, 2, 5, 15, 16):
        _same(neg, K)
    neg[::7, 3] = np.nan
    _same(neg, 4)


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 40).flatmap(lambda E: st.tuples(
    arrays(np.float32, st.tuples(st.integers(1, 30), st.just(E)),
           elements=st.floats(-4, 4, width=32) | st.sampled_from([0.0, 1.0, -1.0, float("inf")])),
    st.integers(1, E))))
def test_any_block_equals_the_reference(case):
    neg, K = case
    _same(neg, K)


def test_column_counts_equal_the_bool_sum():
    rng = np.random.default_rng(5)
    for T, E in [(0, 4), (1, 3), (256, 128), (2 ** 16 - 1, 2), (2 ** 16 + 3, 2)]:
        mask = rng.random((T, E)) < 0.9
        got = column_counts(mask)
        np.testing.assert_array_equal(got, mask.sum(0))
        assert got.dtype == np.int64
    full = np.ones((2 ** 16 - 1, 3), dtype=bool)       # the largest count the byte sum takes, exactly
    np.testing.assert_array_equal(column_counts(full), [2 ** 16 - 1] * 3)
