"""`npumoe-lab routing-stats`: the routing defaults of simulation, measured (textlike.py says what they mean).

From a calibration profile and the profiles of other workloads (`--profile CAL --profile RUN ...`), or from the
bundled model (`--model tiny`: calibrated on its mixed calib text, evaluated on the held-out text of each domain
and on the prompts of each offline workload, textlike.WORKLOAD_NAMES):
- per-chunk dispersion within a document and the dispersion of documents' totals (textlike.dispersion; the median
  over workloads and layers: a few workloads of short, unlike documents must not set it alone), turned into
  Dirichlet concentrations by matching the same statistic of routing sampled by sim/routing.py's own sampler at the
  same popularity, chunk, top-k and document length (grid over log concentration, interpolated);
- the cross-workload overlap 1 - TV(calibration popularity, evaluation popularity), turned into workload_overlap by
  matching the overlap of the synthetic workload model (each workload's own hot set, the mix their average) on the
  calibration profile's share curve;
- for reference, the drop and padding rates of the npumoe-tg plan (calibrated on CAL) against each evaluation
  profile's real per-chunk counts (planning.tiers), the numbers simulation has to reproduce.
Written as YAML with its source (default data/routing/tiny-defaults.yaml, which `simulate` reads).
"""
from __future__ import annotations

import math
import time

import numpy as np

from npumoe_lab.models import load_model, model_fingerprint
from npumoe_lab.planning.plan import variant_plan
from npumoe_lab.planning.profile import CalibrationProfile
from npumoe_lab.sim.routing import overlap_for_tv
from npumoe_lab.sim.textlike import WORKLOAD_NAMES, dirichlet, dispersion, tv_overlap
from npumoe_lab.utils import cache_dir, progress
from npumoe_lab.workloads.texts import DOMAINS, bundled_text

GRID = np.geomspace(0.05, 2000.0, 28)      # concentrations tried (per expert); above the last: no variation
FIT_REPLICAS = 2                           # simulated documents per measured one (a smoother statistic)
TINY = dict(chunk=256, tokens=8192, seed=0)


def tiny_profiles(chunk: int = TINY["chunk"], tokens: int = TINY["tokens"], seed: int = TINY["seed"]) -> dict:
    """{'mixed': the bundled model's mixed calib-text profile, domain: its held-out text profile}; cached."""
    from npumoe_lab.execution.calibrate import calibrate, calibration_profile   # lazy: runs the model, only here
    model, tok = load_model("tiny")
    out = {"mixed": calibration_profile(model, tok, "mixed", chunk, tokens, seed)}
    for d in WORKLOAD_NAMES:
        path = cache_dir() / "profiles" / f"{model_fingerprint(model)[:16]}-heldout-{d}-c{chunk}-n{tokens}-s{seed}"
        if (path / "profile.json").exists():
            out[d] = CalibrationProfile.load(path)
        elif d in DOMAINS:       # a text domain: its held-out text (the calibration mix used its calib text)
            out[d] = calibrate(model, tok, chunk=chunk, tokens=tokens, seed=seed, text={d: bundled_text(d, "heldout")})
            out[d].meta["workload"] = f"{d} (held-out text)"
            out[d].save(path)
        else:                    # a bundled workload: its own prompts
            out[d] = calibrate(model, tok, workload=d, chunk=chunk, tokens=tokens, seed=seed)
            out[d].save(path)
    return out


def _shares(profile, layer) -> np.ndarray:
    m = profile.count_matrix(layer).sum(1).astype(float) + 1e-9
    return m / m.sum()


def _doc_blocks(profile) -> int:
    """Chunks per document (calibrate cuts documents to the context, whole chunks): n_chunks / n_documents."""
    n_docs = int(profile.meta.get("n_documents") or 1)
    return max(1, round(profile.n_chunks / n_docs))


def _stats(counts: np.ndarray, per_doc: int) -> tuple[float, float]:
    """(within-document chunk dispersion, dispersion of document totals per chunk) of counts [E, chunks]."""
    n_docs = counts.shape[1] // per_doc
    if n_docs < 1 or per_doc < 2:
        return dispersion(counts), math.nan
    blocks = counts[:, :n_docs * per_doc].reshape(counts.shape[0], n_docs, per_doc)
    within = (blocks.var(2, ddof=1).sum() / blocks.mean(2).sum())
    totals = blocks.sum(2)
    between = dispersion(totals) / per_doc if n_docs >= 2 else math.nan
    return float(within), float(between)


def _simulate(p, chunk, K, per_doc, n_docs, conc, doc_conc, seed) -> np.ndarray:
    """Counts [E, n_docs * per_doc] of routing drawn as sim/routing.py draws it (document and chunk popularity
    around `p` by textlike.dirichlet, K distinct experts per token by Gumbel top-k), all chunks in one array."""
    g = np.random.default_rng(seed)
    p = np.asarray(p, dtype=np.float64)
    E, n = len(p), n_docs * per_doc
    docs = np.stack([dirichlet(p, doc_conc, g) for _ in range(n_docs)])
    shares = np.stack([dirichlet(docs[c // per_doc], conc, g) for c in range(n)])
    logp = np.log(np.maximum(shares, 1e-30)).astype(np.float32)[:, None, :]
    u = g.random((n, chunk, E), dtype=np.float32)
    scores = logp - np.log(-np.log(np.maximum(u, np.float32(1e-30))))
    idx = np.argpartition(-scores, K - 1, axis=2)[:, :, :K]
    counts = np.zeros((n, E), dtype=np.int64)
    np.add.at(counts, (np.repeat(np.arange(n), chunk * K), idx.reshape(-1)), 1)
    return counts.T


def _fit(measured: float, curve: np.ndarray) -> float | None:
    """The concentration whose simulated statistic equals `measured` (curve decreasing in the concentration,
    made monotone); None (= no variation) when the measured value is at or below the independent-token end."""
    c = np.minimum.accumulate(curve)
    if not math.isfinite(measured) or measured <= c[-1]:
        return None
    if measured >= c[0]:
        return float(GRID[0])
    j = int(np.argmax(c <= measured))      # first grid point at or below
    t = (c[j - 1] - measured) / max(c[j - 1] - c[j], 1e-12)
    return float(math.exp(math.log(GRID[j - 1]) + t * (math.log(GRID[j]) - math.log(GRID[j - 1]))))


def _drop_pad(cal: CalibrationProfile, run: CalibrationProfile) -> tuple[float, float]:
    """Drop and padding rates of the npumoe-tg plan calibrated on `cal` against `run`'s real per-chunk counts."""
    plan = variant_plan(cal, "npumoe-tg", None, platform="m2-max")
    routed = dropped = slots = padded = 0.0
    for lp in plan.layers:
        counts = run.count_matrix(lp["layer"]).astype(float)
        cap = np.asarray(lp["capacity"], dtype=float)[:counts.shape[0], None]
        kept = np.minimum(counts, cap)
        routed += counts.sum()
        dropped += (counts - kept).sum()
        slots += cap.sum() * counts.shape[1]
        padded += (cap - kept).sum()
    return dropped / routed, padded / slots


def measure(cal: CalibrationProfile, runs: dict, source: str, seed: int = 0, calibration: str = "mixed") -> dict:
    """The defaults document (YAML-ready) from a calibration profile and {workload name: evaluation profile};
    `calibration`: the workload mix the calibration profile stands for."""
    layers = cal.layers
    specs = {s["layer"]: s for s in cal.meta.get("layers", [])}
    rows, cases = {}, []
    for name, prof in runs.items():
        per_doc = _doc_blocks(prof)
        within, between, tvs = [], [], []
        for layer in layers:
            counts = prof.count_matrix(layer)
            w, b = _stats(counts, per_doc)
            within.append(w)
            between.append(b)
            tvs.append(tv_overlap(_shares(cal, layer), _shares(prof, layer)))
            K = int(specs.get(layer, {}).get("top_k") or round(counts[:, 0].sum() / prof.chunk))
            cases.append((name, layer, _shares(prof, layer), prof.chunk, K, per_doc, counts.shape[1] // per_doc, w, b))
        drop, pad = _drop_pad(cal, prof) if cal.meta.get("layers") else (math.nan, math.nan)
        rows[name] = {"chunk_dispersion": float(np.mean(within)), "doc_dispersion": float(np.nanmean(between))
                      if not all(map(math.isnan, between)) else None,
                      "tv_overlap": float(np.mean(tvs)), "drop_rate_npumoe_tg": float(drop),
                      "pad_rate_npumoe_tg": float(pad), "chunks": prof.n_chunks, "chunks_per_document": per_doc}
    bar = progress(total=2 * len(GRID), desc="routing-stats fits")
    chunk_curve = np.zeros(len(GRID))
    for i, a in enumerate(GRID):
        chunk_curve[i] = np.mean([_stats(_simulate(p, T, K, m, max(1, n) * FIT_REPLICAS, a, None, seed + j), m)[0]
                                  for j, (_, _, p, T, K, m, n, _, _) in enumerate(cases)])
        bar.update(1)
    conc = _fit(float(np.median([c[7] for c in cases])), chunk_curve)
    docs = [c[8] for c in cases if math.isfinite(c[8])]
    measured_doc = float(np.median(docs)) if docs else math.nan       # no document of 2+ chunks: not measured
    doc_curve = np.zeros(len(GRID))
    for i, a in enumerate(GRID if docs else []):
        doc_curve[i] = np.nanmean([_stats(_simulate(p, T, K, m, max(2, n) * FIT_REPLICAS, conc, a, seed + j), m)[1]
                                   for j, (_, _, p, T, K, m, n, _, _) in enumerate(cases)])
        bar.update(1)
    bar.close()
    doc_conc = _fit(float(measured_doc), doc_curve)
    tv = float(np.mean([r["tv_overlap"] for r in rows.values()])) if rows else math.nan
    curve = np.mean([np.sort(_shares(cal, layer))[::-1] for layer in layers], axis=0)
    w = overlap_for_tv(curve, max(len(runs), 2), tv, seed) if math.isfinite(tv) else 1.0
    by_tv = sorted(rows, key=lambda n: rows[n]["tv_overlap"])
    default_workload = by_tv[(len(by_tv) - 1) // 2] if by_tv and set(by_tv) <= set(WORKLOAD_NAMES) else "mixed"
    note = "per expert of average popularity; inf = no variation at this level"
    return {
        "source": source,
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "defaults": {
            "concentration": {"value": "inf" if conc is None else round(conc, 4),
                              "note": f"per-chunk Dirichlet concentration ({note}), fitted so that sampled routing "
                                      f"has the measured within-document chunk dispersion "
                                      f"{np.median([c[7] for c in cases]):.3f} (median over workloads and layers)"},
            "doc_concentration": {"value": "inf" if doc_conc is None else round(doc_conc, 4),
                                  "note": f"per-document Dirichlet concentration ({note}), fitted to the measured "
                                          f"dispersion of document totals {measured_doc:.3f} (median)"},
            "workload_tv_overlap": {"value": round(tv, 4) if math.isfinite(tv) else 1.0,
                                    "note": f"1 - TV(calibration popularity, evaluation workload's), mean over "
                                            f"workloads and layers; simulate solves each geometry's "
                                            f"workload_overlap for it (at this model's own curve: {w:.3f})"},
            "calibration": {"value": calibration, "note": "plans are calibrated on this mix, as the bundled "
                                                           "model's profile is (its mixed calib text)"},
            "workload": {"value": default_workload, "note": "the evaluation workload of median measured overlap"},
        },
        "measured": rows,
    }


__all__ = ["measure", "tiny_profiles"]
