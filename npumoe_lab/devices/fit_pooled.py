"""`fit-device --platform A,B --pool`: fit the chips of one ANE generation together.

A hierarchy of two levels: the GENERATION's compute and per-call terms (SHARED: peak rate, pipeline fill, row tile,
attention rate, direct-path dispatch and row tile, the power model) are one set of parameters for every chip of
the pool, since the chips carry the same engine (an Ultra is two Max dies; Core ML runs one model on one cluster,
docs/sources/DEVICE_MODEL.md §7); each CHIP keeps its own memory-side terms (Core ML and direct bandwidth,
decompression rate) and CPU terms: whatever its YAML's `fit:` lists beyond SHARED. The rows of every chip inform
the shared terms (e.g. the M2 Ultra's two LM-head rows and the M2 Max's 24 micro-benchmarks), so a chip with few
rows borrows the generation's compute terms from measurements of the same silicon instead of a transfer block.

Same method as devices/fit.py otherwise: least-squares point on log(predicted / measured) over log-parameters in
their prior box, emcee over the joint vector plus one log-noise sigma, and the transfer sigma by leave-one-group-out
cross-validation on the pool's fit rows only (a group = device/kind across the chips; power rows never held out).
Each chip gets an ordinary fitted platform YAML (write_fit): its columns of the joint posterior, the shared
columns the same draws for every chip (a coherent joint posterior, not draws paired at random).
"""
from __future__ import annotations

import logging

import numpy as np

from npumoe_lab.errors import NpuMoeError
from npumoe_lab.utils import progress
from npumoe_lab.devices.fit import (NOT_HELD_OUT, SIGMA_BOUNDS, FitResult, RowSet, _base_params, _least_squares,
                                    fit_rows, row_group)
from npumoe_lab.devices.price import with_draws

SHARED = ("npu_graph_peak_flops", "npu_work_half_flops", "npu_rows_half", "npu_attention_flops",
          "npu_direct_dispatch_s", "npu_direct_rows_half", "npu_active_power_w", "npu_floor_power_w")


class Pool:
    """The joint parameter vector of the pooled platforms and the residuals of their fit rows."""

    def __init__(self, platforms, df, shared=SHARED):
        self.platforms = list(platforms)
        chips = [p.chip for p in self.platforms]
        if len(set(chips)) != len(chips):
            raise NpuMoeError(f"--pool needs one platform per chip, got chips {chips}")
        bounds = {}
        for p in self.platforms:
            for f in p.fit or ():
                bounds.setdefault(f["param"], (f["low"], f["high"]))
        self.shared = [n for n in shared if n in bounds]
        self.own = [[f["param"] for f in (p.fit or ()) if f["param"] not in self.shared] for p in self.platforms]
        self.names = list(self.shared) + [f"{p.chip}:{n}" for p, own in zip(self.platforms, self.own) for n in own]
        self.lo = np.log([bounds[n.split(":")[-1]][0] for n in self.names])
        self.hi = np.log([bounds[n.split(":")[-1]][1] for n in self.names])
        self.frames = [fit_rows(df, p) for p in self.platforms]
        if sum(len(f) for f in self.frames) < len(self.names):
            raise NpuMoeError(f"the pool {chips} has {sum(len(f) for f in self.frames)} fit rows for "
                              f"{len(self.names)} free parameters; add fit rows or pool fewer parameters")
        self.sets = [RowSet.of(f) for f in self.frames]
        self.bases = [_base_params(p) for p in self.platforms]
        cols, i = [], len(self.shared)
        for own in self.own:
            cols.append(list(range(len(self.shared))) + list(range(i, i + len(own))))
            i += len(own)
        self.cols = cols                                    # joint-vector columns of each platform's names
        self.local = [list(self.shared) + own for own in self.own]
        self.groups = np.array([row_group(d, k) for f in self.frames for d, k in zip(f.device, f.kind)], dtype=object)
        src = []
        for j, n in enumerate(self.names):
            k = n.split(":")[-1]
            owner = 0 if ":" not in n else [p.chip for p in self.platforms].index(n.split(":")[0])
            src.append(float(np.ravel(self.bases[owner][k])[0]))
        self.x_src = np.clip(np.log(src), self.lo + 1e-9, self.hi - 1e-9)

    def resid(self, x, keep=None) -> np.ndarray:
        """(D, rows of the pool) confidence-weighted log residuals at log-parameters x (D, P); `keep`: a bool mask
        over the pool's rows (others dropped)."""
        x = np.atleast_2d(x)
        parts = [rs.log_residuals(with_draws(base, names, np.exp(x[:, c]))) * rs.weight
                 for rs, base, names, c in zip(self.sets, self.bases, self.local, self.cols)]
        r = np.concatenate(parts, axis=1)
        return r if keep is None else r[:, keep]

    def transfer_cv(self) -> dict:
        """Leave one device/kind group of the pool's fit rows out (fit.transfer_cv, across the chips)."""
        out = {}
        for g in sorted(set(self.groups)):
            if g.split("/", 1)[1] in NOT_HELD_OUT:
                continue
            train, test = self.groups != g, self.groups == g
            if not train.any():
                continue
            r0 = self.resid(self.x_src, train)[0]
            probe = self.x_src + 0.05 * np.eye(len(self.x_src))
            free = np.max(np.abs(self.resid(probe, train) - r0), axis=1) > 1e-6
            x = self.x_src.copy()
            if free.any():
                def res(xf):
                    full = np.tile(self.x_src, (len(xf), 1))
                    full[:, free] = xf
                    return self.resid(full, train)
                x[free] = _least_squares(lambda xf: res(xf), [self.x_src[free]], self.lo[free], self.hi[free]).x
            out[str(g)] = self.resid(x, test)[0].tolist()
        return out


def fit_pool(platforms, df, steps: int = 30000, walkers: int = 0, seed: int = 0, starts: int = 8,
             shared=SHARED) -> list[FitResult]:
    """One FitResult per platform from the joint fit of the pool (module doc); write each with fit.write_fit."""
    import emcee
    logging.getLogger("emcee").setLevel(logging.ERROR)
    pool = Pool(platforms, df, shared)
    lo, hi, P = pool.lo, pool.hi, len(pool.names)
    rng = np.random.default_rng(seed)
    x0s = [pool.x_src] + [lo + (hi - lo) * rng.uniform(0.05, 0.95, P) for _ in range(starts)]
    best = _least_squares(lambda x: pool.resid(x), x0s, lo, hi)
    cv = pool.transfer_cv()
    errs = [e for v in cv.values() for e in v]
    tsigma = float(np.sqrt(np.mean(np.square(errs)))) if len(cv) >= 2 else None
    nw = walkers or max(4 * (P + 1), 32)
    nw += nw % 2
    r0 = pool.resid(best.x)[0]
    s0 = float(np.clip(np.sqrt(np.mean(r0 ** 2)), SIGMA_BOUNDS[0] * 1.5, SIGMA_BOUNDS[1] / 1.5))
    slo, shi = np.log(SIGMA_BOUNDS)

    def log_prob(theta):
        x, ls = theta[:, :-1], theta[:, -1]
        inside = np.all((x > lo) & (x < hi), axis=1) & (ls > slo) & (ls < shi)
        r = pool.resid(np.where(inside[:, None], x, best.x))
        lp = -0.5 * np.sum(r ** 2, axis=1) / np.exp(2 * ls) - r.shape[1] * ls
        return np.where(inside, lp, -np.inf)

    start = np.column_stack([np.clip(best.x + 1e-3 * (hi - lo) * rng.standard_normal((nw, P)), lo + 1e-9, hi - 1e-9),
                             np.log(s0) + 1e-2 * rng.standard_normal(nw)])
    sampler = emcee.EnsembleSampler(nw, P + 1, log_prob, vectorize=True,
                                    moves=[(emcee.moves.DEMove(), 0.8), (emcee.moves.DESnookerMove(), 0.2)])
    sampler.random_state = np.random.RandomState(seed).get_state()
    chips = "+".join(p.chip for p in pool.platforms)
    for _ in progress(sampler.sample(start, iterations=steps), total=steps, desc=f"fit pool {chips}"):
        pass
    burn = steps // 3
    tau = float(np.nanmax(sampler.get_autocorr_time(discard=burn, quiet=True)))
    chain = sampler.get_chain(discard=burn, flat=True)
    keep = chain[np.random.default_rng(seed).choice(len(chain), size=min(400, len(chain)), replace=False)]
    acc = float(np.mean(sampler.acceptance_fraction))
    groups = tuple(sorted(set(pool.groups)))
    info = {"chips": [p.chip for p in pool.platforms], "shared": list(pool.shared),
            "priors": {n: (float(np.exp(lo[j])), float(np.exp(hi[j]))) for j, n in enumerate(pool.shared)},
            "rows": [i for rs in pool.sets for i in rs.ids]}
    out, start_row = [], 0
    for rs, names, c in zip(pool.sets, pool.local, pool.cols):
        n = len(rs.ids)
        out.append(FitResult(list(names), np.exp(best.x[c]), np.exp(keep[:, c]), np.exp(keep[:, -1]), rs,
                             r0[start_row:start_row + n] / rs.weight, acc, tau, nw, steps, burn, cv, tsigma, (),
                             groups, info))
        start_row += n
    return out


__all__ = ["fit_pool", "Pool", "SHARED"]
