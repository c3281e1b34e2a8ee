"""The premise check of NPUMoE on a routing source: is there a hot set, and does it stay put between the
calibration text and the workload? Per measured layer and domain (`routing_stats.csv`):
- `gini` of the per-expert counts, sum_ij |x_i - x_j| / (2 E^2 mean) (no small-sample correction);
- `hot10_share`: the share of the routing taken by the hottest ceil(E/10) experts;
- `overlap_vs_calib` = 1 - TV(calibration popularity, the domain's) and `hot10_jaccard_vs_calib` (Jaccard of the
  two hot-10 % sets); the calibration is the mix of the other domains (leave one out), or the domain itself where
  the data has one domain (in-sample: the best case, said in the row's `calibration`);
- `drop_rate` / `pad_rate` of the default npumoe-tg plan (m2-max) calibrated on that calibration and run on the
  domain's chunks (chunk 512): replayed exactly from a trace, sampled from counts with the text-like per-chunk
  variation. Rows with domain `all` pool every domain.
"""
from __future__ import annotations

import math

import numpy as np
import pandas as pd

from npumoe_lab.planning.plan import variant_plan
from npumoe_lab.routing_data.schema import RoutingData
from npumoe_lab.sim.real_routing import from_counts, from_trace, routing_folder
from npumoe_lab.sim.textlike import tv_overlap

CHUNK, PROMPT = 512, 2048
WEAK_JACCARD, WEAK_OVERLAP, FLAT_GINI = 0.5, 0.8, 0.15     # the verdict's thresholds (ROUTING_STATS.md states them)


def gini_pairs(x) -> float:
    """sum_ij |x_i - x_j| / (2 E^2 mean), computed as the sorted-rank sum (equal, O(E log E))."""
    x = np.sort(np.asarray(x, dtype=np.float64))
    n, tot = len(x), x.sum()
    return 0.0 if tot <= 0 else float(((2 * np.arange(1, n + 1) - n - 1) * x).sum() / (n * tot))


def hot_set(x) -> np.ndarray:
    x = np.asarray(x, dtype=np.float64)
    return np.argsort(-x, kind="stable")[:math.ceil(len(x) / 10)]


def hot10_share(x) -> float:
    x = np.asarray(x, dtype=np.float64)
    return float(x[hot_set(x)].sum() / x.sum()) if x.sum() > 0 else 0.0


def jaccard(a, b) -> float:
    a, b = set(hot_set(a).tolist()), set(hot_set(b).tolist())
    return len(a & b) / len(a | b)


def _drop_pad(src, specs, seed: int) -> dict:
    """{layer: (drop, pad)} of the npumoe-tg plan on `src`'s calibration against its run chunks."""
    plan = variant_plan(src.calibration_profile(specs, CHUNK, seed), "npumoe-tg", specs, platform="m2-max")
    chunks = src.chunks(specs, PROMPT, CHUNK, seed)
    out = {}
    for lp in plan.layers:
        layer = lp["layer"]
        E = next(s.n_experts for s in specs if s.layer == layer)
        cnt = np.stack([np.bincount(c[layer][0].reshape(-1), minlength=E) for c in chunks]).astype(float)
        cap = np.asarray(lp["capacity"], dtype=float)[None, :E]
        kept = np.minimum(cnt, cap)
        out[layer] = (float((cnt - kept).sum() / cnt.sum()), float((cap - kept).sum() / (cap.sum() * len(cnt))))
    return out


def premise_stats(spec: str, seed: int = 0) -> tuple[pd.DataFrame, dict]:
    """(rows, facts) of a routing source spec: counts:NAME|DIR, trace:NAME|DIR or a routing-import folder."""
    from npumoe_lab.sim.geometries import load_geometry   # lazy: sibling module, only for this check
    kind, _, rest = spec.partition(":")
    folder = tiny_folder() if spec == "tiny" else routing_folder(rest if kind in ("counts", "trace") else spec)
    data = RoutingData.load(folder)
    trace = (kind == "trace") or (kind != "counts" and data.selections is not None)
    geo_name = data.provenance["geometry"]["name"]
    try:
        specs = list(load_geometry(geo_name, hf_config=False)[2].moe)
    except Exception:          # a user's config.json geometry by name: the data's own facts suffice
        specs = None
    doms = data.domains
    rows = []
    drops = {}
    for d in doms + (["all"] if len(doms) > 1 else []):
        members = doms if d == "all" else [d]
        calib = [x for x in doms if x not in members] or members
        if specs is not None and d != "all":
            src = (from_trace(specs, folder, "+".join(calib), d, None, seed) if trace and calib != members else
                   from_trace(specs, folder, None, None, None, seed) if trace else
                   from_counts(specs, folder, "+".join(calib), d, seed=seed, shift=False))
            drops[d] = _drop_pad(src, specs, seed)
        for layer in data.layers:
            x, c = data.count_vector(layer, members), data.count_vector(layer, calib)
            dp = drops.get(d, {}).get(layer, (math.nan, math.nan))
            rows.append(dict(layer=layer, domain=d, tokens=int(x.sum() / data.provenance["geometry"]["top_k"]),
                             gini=gini_pairs(x), hot10_share=hot10_share(x),
                             max_over_mean=float(x.max() / x.mean()) if x.mean() > 0 else math.nan,
                             overlap_vs_calib=tv_overlap(c, x) if d != "all" else math.nan,
                             hot10_jaccard_vs_calib=jaccard(c, x) if d != "all" else math.nan,
                             calibration="+".join(calib) if calib != members else
                             "itself (one domain: in-sample" + ("; drop: first half calibrates, second half runs)"
                                                               if trace else ")"),
                             drop_rate=dp[0], pad_rate=dp[1]))
    return pd.DataFrame(rows), {"folder": folder, "data": data, "trace": trace}


def tiny_folder():
    """The bundled model's held-out routing per workload (routing_stats.tiny_profiles) as a routing folder (cached)."""
    # lazy: the bundled model runs only here
    from npumoe_lab.routing_data.schema import counts_frame
    from npumoe_lab.sim.routing_stats import tiny_profiles
    from npumoe_lab.utils import cache_dir
    profiles = tiny_profiles()
    cal = profiles.pop("mixed")
    out = cache_dir() / "routing" / f"tiny-heldout-{str(cal.meta.get('model_fingerprint'))[:12]}"
    if (out / "provenance.json").is_file():
        return out
    rows = []
    K = int(cal.meta["layers"][0]["top_k"])
    for name, prof in profiles.items():
        for layer in prof.layers:
            v = prof.count_matrix(layer).sum(1)
            rows += [(layer, e, name, "prefill", int(n), int(v.sum()) // K) for e, n in enumerate(v)]
    specs = cal.meta["layers"]
    prov = {"model": "npumoe-tiny (bundled)", "tool": "npumoe-lab calibrate", "phase": "prefill",
            "licence": "this project's", "source": "routing_stats.tiny_profiles (held-out text / prompts)",
            "geometry": {"name": "data/models/npumoe-tiny", "moe_layers": [s["layer"] for s in specs],
                         "n_experts": int(specs[0]["n_experts"]), "top_k": K},
            "tokens": {n: int(p.meta.get("n_tokens") or 0) for n, p in profiles.items()}, "notes": []}
    RoutingData("counts", counts_frame(rows), prov).save(out)
    return out


def verdict(df: pd.DataFrame) -> str:
    per = df[df["domain"] != "all"]
    g, j, o = per["gini"].median(), per["hot10_jaccard_vs_calib"].median(), per["overlap_vs_calib"].median()
    in_sample = per["calibration"].str.startswith("itself").all()
    if g < FLAT_GINI:
        return (f"WEAK premise: routing is nearly balanced (median Gini {g:.2f} < {FLAT_GINI}): no hot set for "
                "capacity tiers or residency to exploit")
    if in_sample:
        return (f"NOT TESTED: one domain, so the hot set's stability cannot be measured (median Gini {g:.2f}, "
                f"hot-10 % share {per['hot10_share'].median():.0%}); only a skew exists")
    if j < WEAK_JACCARD or o < WEAK_OVERLAP:
        return (f"WEAK premise: the hot set moves with the domain (median hot-10 % Jaccard vs calibration {j:.2f}, "
                f"1-TV {o:.2f}; weak below {WEAK_JACCARD} / {WEAK_OVERLAP}): a plan calibrated on other text "
                "misplaces capacity")
    return (f"HOLDS: a skewed (median Gini {g:.2f}) hot set that stays between domains (median Jaccard {j:.2f}, "
            f"1-TV {o:.2f})")


def figure(df: pd.DataFrame, data: RoutingData, title: str):
    from matplotlib.figure import Figure
    fig = Figure(figsize=(11, 4.2), layout="constrained")
    a, b = fig.subplots(1, 2, width_ratios=[1.6, 1])
    E = int(data.provenance["geometry"]["n_experts"])
    layers = data.layers
    m = np.stack([data.count_vector(layer) for layer in layers])
    m = m / m.sum(1, keepdims=True) * E
    im = a.imshow(m, aspect="auto", cmap="magma", interpolation="nearest")
    a.set_yticks(range(len(layers)), layers if len(layers) <= 16 else [x if i % 4 == 0 else "" for i, x in
                                                                        enumerate(layers)])
    a.set(xlabel="expert id", ylabel="layer", title="popularity (share x E; 1 = average), all domains")
    fig.colorbar(im, ax=a, shrink=0.8)
    for d, g in df[df["domain"] != "all"].groupby("domain"):
        b.plot(g["layer"], g["overlap_vs_calib"], marker="o", ms=3, label=d)
    b.set(xlabel="layer", ylabel="1 - TV vs calibration", ylim=(0, 1.02), title="overlap with the calibration mix")
    b.legend(fontsize=7)
    fig.suptitle(title, fontsize=9)
    return fig


__all__ = ["premise_stats", "verdict", "figure", "gini_pairs", "hot10_share"]
