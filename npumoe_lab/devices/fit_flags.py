"""Which fitted parameters a reader must not take at face value (`fit-device` prints them; the fitted YAML keeps them
in `posterior.flags` and each parameter's note): a point or posterior at a prior bound, a posterior as wide as the
prior (the rows do not identify it), a point outside its own posterior. Thresholds below."""
from __future__ import annotations

import numpy as np


def priors_of(platform, res) -> dict:
    """{param: (low, high)} of every fitted parameter: the platform's `fit:` list, and a pool's shared priors."""
    out = {f["param"]: (f["low"], f["high"]) for f in platform.fit or ()}
    for k, b in ((res.pooled or {}).get("priors") or {}).items():
        out.setdefault(k, tuple(b))
    return out


AT_BOUND_LOG = 0.01        # a value within 1 % of a prior bound sits at it
UNIDENTIFIED_SHARE = 0.5    # a 90 % posterior spanning >= half of the prior's log-range: the rows do not pin it


def parameter_flags(platform, res) -> dict:
    """{param: [flag, ...]} of the fitted (not transferred) parameters that need a reader's attention:
    'point at the lower/upper bound' (the least-squares point within 1 % of a prior bound: the rows push it
    there, the bound decides it), 'posterior at the lower/upper bound' (its 5 % / 95 % point there),
    'not identified by the rows' (the 90 % posterior spans >= half the prior's log-range: as wide as the
    prior), 'point outside its 90 % posterior' (the least-squares point and the posterior disagree: quote the
    posterior median). Empty lists are left out."""
    out = {}
    for n, (low, high) in priors_of(platform, res).items():
        if n not in res.names:
            continue
        i = res.names.index(n)
        lo, hi = np.log(low), np.log(high)
        x, q5, q95 = np.log(res.point[i]), *np.log(np.percentile(res.draws[:, i], [5, 95]))
        flags = []
        if x - lo < AT_BOUND_LOG or hi - x < AT_BOUND_LOG:
            flags.append(f"point at the {'lower' if x - lo < AT_BOUND_LOG else 'upper'} bound")
        if q5 - lo < AT_BOUND_LOG:
            flags.append("posterior at the lower bound")
        if hi - q95 < AT_BOUND_LOG:
            flags.append("posterior at the upper bound")
        if (q95 - q5) >= UNIDENTIFIED_SHARE * (hi - lo):
            flags.append("not identified by the rows (posterior as wide as the prior)")
        if not q5 <= x <= q95:
            flags.append("point outside its 90 % posterior")
        if flags:
            out[n] = flags
    return out


__all__ = ["parameter_flags", "priors_of", "AT_BOUND_LOG", "UNIDENTIFIED_SHARE"]
