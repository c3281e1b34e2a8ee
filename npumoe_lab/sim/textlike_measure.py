"""The text-like model's parameters re-measured from real routing data, per model (`textlike.yaml` in a routing
folder, which counts: sources read before the bundled model's data/routing/tiny-defaults.yaml):
- `workload_tv_overlap`: the leave-one-domain-out 1 - TV (mean over layers and domains) where the data has several
  domains; else borrowed from the multi-domain data named (said in its note);
- `concentration`: fitted to the within-document per-chunk dispersion of a per-token trace (routing_stats' fit:
  sampled routing at the same popularity, chunk, top-k and document length); counts carry no per-chunk structure, so
  otherwise the bundled model's;
- `doc_concentration`: the bundled model's (no data here has several documents of one domain per-token).
Every field says whether it was measured on this data or taken from elsewhere."""
from __future__ import annotations

import math
import time

import numpy as np

from npumoe_lab.routing_data.schema import RoutingData
from npumoe_lab.sim.real_routing import DEFAULT_OVERLAP_FROM, lodo_overlap, routing_folder, split_domains
from npumoe_lab.sim.routing_stats import GRID, _fit, _simulate, _stats
from npumoe_lab.sim.textlike import load_defaults

TRACE_CHUNK = 32          # per-chunk dispersion of a short trace: chunks of 32 tokens (a few hundred tokens exist)


def _trace_dispersion(data: RoutingData):
    """(median within-trace chunk dispersion over layers and segments, cases for the fit) of a per-token trace."""
    sel, K, E = data.selections, int(data.provenance["geometry"]["top_k"]), int(data.provenance["geometry"]["n_experts"])
    vals, cases = [], []
    for (layer, seg), g in sel.groupby(["layer", "segment"]):
        ids = g.sort_values(["phase", "token", "rank"])["expert"].to_numpy().reshape(-1, K)
        n = len(ids) // TRACE_CHUNK
        if n < 2:
            continue
        m = np.stack([np.bincount(ids[j * TRACE_CHUNK:(j + 1) * TRACE_CHUNK].ravel(), minlength=E)
                      for j in range(n)], 1)
        w, _ = _stats(m, n)
        vals.append(w)
        p = (m.sum(1) + 1e-9) / (m.sum() + E * 1e-9)
        cases.append((p, K, n))
    return (float(np.median(vals)) if vals else math.nan), cases


def measure_textlike(spec_or_folder, seed: int = 0) -> dict:
    """The textlike.yaml document (YAML-ready) of a routing folder."""
    folder = routing_folder(str(spec_or_folder).partition(":")[2] if ":" in str(spec_or_folder) else spec_or_folder)
    data = RoutingData.load(folder)
    tiny = load_defaults()
    tsrc = tiny["source"].split(" (")[0]
    out = {}
    tv = lodo_overlap(data)
    if math.isfinite(tv):
        out["workload_tv_overlap"] = {"value": round(tv, 4), "note": f"measured on {folder.name}: leave-one-domain-"
                                      f"out 1 - TV, mean over layers {data.layers} and domains {data.domains}"}
    else:
        other = RoutingData.load(routing_folder(DEFAULT_OVERLAP_FROM))
        out["workload_tv_overlap"] = {"value": round(lodo_overlap(other), 4), "note": (
            f"NOT measurable on {folder.name} (one domain): borrowed from {DEFAULT_OVERLAP_FROM}'s leave-one-domain-"
            "out 1 - TV (the nearest real multi-domain data)")}
    conc = {"value": tiny["concentration"], "note": f"the bundled model's ({tsrc}): {folder.name} holds counts "
                                                    "only, no per-chunk structure"}
    if data.selections is not None:
        measured, cases = _trace_dispersion(data)
        if cases:
            curve = np.array([np.mean([_stats(_simulate(p, TRACE_CHUNK, K, n, 4, a, None, seed + j), n)[0]
                                       for j, (p, K, n) in enumerate(cases)]) for a in GRID])
            c = _fit(measured, curve)
            conc = {"value": "inf" if c is None else round(c, 4), "note": (
                f"measured on {folder.name}: per-chunk dispersion {measured:.3f} (median over layers, chunks of "
                f"{TRACE_CHUNK} tokens) fitted by sampled routing; a short trace: a rough value")}
    out["concentration"] = conc
    out["doc_concentration"] = {"value": tiny["doc_concentration"] if tiny["doc_concentration"] is not None else "inf",
                                "note": f"the bundled model's ({tsrc}): not measurable on {folder.name}"}
    c_dom, e_dom, how = split_domains(data, None, None, str(folder))
    out["calibration"] = {"value": "+".join(c_dom), "note": f"counts: default ({how})"}
    out["workload"] = {"value": "+".join(e_dom), "note": f"counts: default ({how})"}
    return {"source": f"npumoe-lab routing-stats --routing {spec_or_folder} ({data.provenance.get('model')}, "
                      f"{data.provenance.get('tool')})",
            "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "defaults": out}


__all__ = ["measure_textlike"]
