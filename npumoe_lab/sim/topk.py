"""The K smallest entries of each row, in ascending order: what the Gumbel top-k sampler keeps of its scores.

`smallest_k` returns exactly what `argpartition_smallest_k` (the sampler's original argpartition + stable argsort)
returns, faster on the sampler's shapes (thousands of [T, E] blocks, E <= a few hundred, K small): K + 1 passes of a
row-wise argmin, each taking one entry out. Where a row's K + 1 smallest values hold no tie, the K smallest in
ascending order are unique, so any exact method gives the reference's answer; a row with a tie among them (where the
reference's order follows argpartition's internals) is answered by the reference itself, row by row (argpartition
treats each row on its own, so a row's answer does not depend on the rows beside it).

`smallest_k_mask` marks the same K entries of each row without ordering them: what a count of the drawn experts
needs (calibration counts, a sampled Gini). One `np.partition` places each row's (K+1)-th smallest value after its
K smallest; where the K-th is strictly below the (K+1)-th, the K smallest are the entries <= the K-th, whatever
method picks them, and argpartition picks them too; a row where they tie (or NaN makes them unordered) is answered
by the reference. Faster than `smallest_k` and a bincount on the sampler's shapes (docs/PERFORMANCE.md).
"""
from __future__ import annotations

import numpy as np


def argpartition_smallest_k(neg: np.ndarray, K: int) -> tuple[np.ndarray, np.ndarray]:
    """(indices [T, K], values [T, K]) of each row's K smallest entries, ascending (the reference)."""
    idx = np.argpartition(neg, K - 1, axis=1)[:, :K]
    nv = np.take_along_axis(neg, idx, 1)
    order = np.argsort(nv, axis=1, kind="stable")
    return np.take_along_axis(idx, order, 1), np.take_along_axis(nv, order, 1)


def smallest_k(neg: np.ndarray, K: int) -> tuple[np.ndarray, np.ndarray]:
    """= argpartition_smallest_k(neg, K) for a 2-D float array (the module docstring says why)."""
    T, E = neg.shape
    if K >= E or T == 0 or K < 1:
        return argpartition_smallest_k(neg, K)
    work = np.array(neg, copy=True)
    flat = work.reshape(-1)
    base = np.arange(T, dtype=np.int64) * E
    idx = np.empty((K + 1, T), dtype=np.int64)
    vals = np.empty((K + 1, T), dtype=neg.dtype)
    for j in range(K + 1):
        a = work.argmin(axis=1)
        at = base + a
        idx[j] = a
        vals[j] = flat[at]
        flat[at] = np.inf
    tied = (vals[1:] == vals[:-1]).any(axis=0) | np.isnan(vals).any(axis=0)     # NaN: the reference's rule too
    idx, vals = np.ascontiguousarray(idx[:K].T), np.ascontiguousarray(vals[:K].T)
    if tied.any():
        rows = np.flatnonzero(tied)
        idx[rows], vals[rows] = argpartition_smallest_k(neg[rows], K)
    return idx, vals


def smallest_k_mask(neg: np.ndarray, K: int) -> np.ndarray:
    """[T, E] bool, True at the entries argpartition_smallest_k(neg, K) returns for each row (the module docstring
    says why they are the same); `.sum(0)` counts how often each column was among its row's K smallest."""
    T, E = neg.shape
    mask = np.zeros(neg.shape, dtype=bool)
    if K >= E or T == 0 or K < 1:
        if T:
            np.put_along_axis(mask, argpartition_smallest_k(neg, K)[0], True, 1)
        return mask
    p = np.partition(neg, K, axis=1)             # one kth: a tuple (K - 1, K) costs ~4x more here
    kth = p[:, :1].copy()                         # the K-th smallest: the max of the K before position K
    for j in range(1, K):                          # (column by column: a max over a short inner axis is ~3x slower)
        np.maximum(kth[:, 0], p[:, j], out=kth[:, 0])
    np.less_equal(neg, kth, out=mask)
    unclear = ~(kth[:, 0] < p[:, K])             # a tie across the boundary, or NaN: the reference decides the row
    if unclear.any():
        rows = np.flatnonzero(unclear)
        sub = np.zeros((len(rows), E), dtype=bool)
        np.put_along_axis(sub, argpartition_smallest_k(neg[rows], K)[0], True, 1)
        mask[rows] = sub
    return mask


def column_counts(mask: np.ndarray) -> np.ndarray:
    """[E] int64: True entries per column of a [T, E] bool mask (= mask.sum(0)), summed as bytes into uint16 where
    T < 2**16 (cannot overflow; ~2.5x faster than the bool sum on the sampler's [256, 128] masks)."""
    if mask.shape[0] < 2 ** 16:
        return mask.view(np.uint8).sum(0, dtype=np.uint16).astype(np.int64)
    return mask.sum(0)


__all__ = ["smallest_k", "smallest_k_mask", "argpartition_smallest_k", "column_counts"]
