"""Routing sources from real routing data (a data/routing/NAME folder of `npumoe-lab routing-import`):

- `counts:NAME|DIR[,calib=D1+D2,eval=D3,concentration=A,doc_concentration=C,seed=N]`: each layer's popularity
  from the data's per-expert counts. The plan is calibrated on the mix of the `calib` domains (documents cycling
  over them), the prompt is one document of the `eval` domain; per-document and per-chunk variation come from the
  text-like model (textlike.py) at the model's measured concentrations where its data measures them, else the
  bundled model's. Default with several domains: leave one out (eval = the domain whose overlap with the mix of the
  others is the median, calib = the others). With one domain the prompt's hot set is shifted by the workload
  overlap that gives the measured 1 - TV of `overlap_from` (another routing folder, default olmoe-1b-7b).
- `trace:NAME|DIR[,calib=...,eval=...,phase=prefill|decode]`: per-token selections replayed chunk by chunk: the
  prompt's chunks are the eval tokens in order (wrapping round when the prompt is longer: said in the label), the
  plan calibrated on the exact per-chunk counts of the calib tokens (the other domains, else the other segments,
  else the first half of the trace).

Layers the data lacks take the nearest measured layer (by index); `routing_source` says which, and names the data,
its phase and what it cannot say.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from npumoe_lab.errors import NpuMoeError
from npumoe_lab.planning.profile import CalibrationProfile
from npumoe_lab.routing_data.schema import RoutingData
from npumoe_lab.sim.routing import PopularityRouting, _fmt, _reshuffle, gini, overlap_for_tv
from npumoe_lab.sim.textlike import ROUTING_DIR, check_concentration, load_defaults, tv_overlap

DEFAULT_OVERLAP_FROM = "olmoe-1b-7b"      # the real multi-domain counts a one-domain source borrows its shift from


def routing_folder(name_or_dir) -> Path:
    p = Path(str(name_or_dir))
    if (p / "provenance.json").is_file():
        return p
    if (ROUTING_DIR / str(name_or_dir) / "provenance.json").is_file():
        return ROUTING_DIR / str(name_or_dir)
    have = sorted(d.name for d in ROUTING_DIR.iterdir() if (d / "provenance.json").is_file())
    raise NpuMoeError(f"no routing data {str(name_or_dir)!r}: give a folder of `npumoe-lab routing-import` or one "
                      f"of {', '.join(have)} (data/routing/)")


def layer_map(data_layers, specs) -> tuple[dict, str]:
    """{geometry layer: measured layer} (nearest by index) and a sentence on the filled ones ('' if none)."""
    have = sorted(data_layers)
    m = {s.layer: min(have, key=lambda x: (abs(x - s.layer), x)) for s in specs}
    filled = [g for g, d in m.items() if g != d]
    if not filled:
        return m, ""
    runs = {}
    for g in filled:
        runs.setdefault(m[g], []).append(g)
    parts = [f"{min(v)}-{max(v)} take {d}" if len(v) > 1 else f"{v[0]} takes {d}" for d, v in sorted(runs.items())]
    return m, f"measured layers {have}; layers {'; '.join(parts)} (nearest measured layer)"


def _check(data: RoutingData, specs, where: str) -> None:
    g = data.provenance.get("geometry", {})
    E, K = specs[0].n_experts, specs[0].top_k
    if g.get("n_experts") != E or g.get("top_k") != K:
        raise NpuMoeError(f"routing {where}: the data has {g.get('n_experts')} experts top-{g.get('top_k')} "
                          f"({g.get('name')}) but the geometry {E} top-{K}; simulate the geometry of the model that "
                          "routed it")


def model_defaults(path) -> dict:
    """The text-like model's defaults for this data: its folder's textlike.yaml (re-measured from real data, each
    field naming its source) where there is one, else the bundled model's (data/routing/tiny-defaults.yaml)."""
    own = Path(path) / "textlike.yaml"
    return load_defaults(own) if own.is_file() else load_defaults()


def _origin(path, name: str, d: dict) -> str:
    """Where a text-like default came from: its textlike.yaml note's head, else the bundled model's file."""
    import yaml     # a light read of the note beside the value load_defaults returned
    own = Path(path) / "textlike.yaml"
    if own.is_file():
        note = str(((yaml.safe_load(own.read_text()) or {}).get("defaults", {}).get(name) or {}).get("note", ""))
        return note.split(":")[0][:120] or own.name
    return f"measured: {d['source'].split(' (')[0]}"


def split_domains(data: RoutingData, calib: str | None, eval_: str | None, where: str) -> tuple[list, list, str]:
    """(calib domains, eval domains, how chosen)."""
    doms = data.domains
    pick = lambda text: [d.strip() for d in text.split("+")] if text else None   # noqa: E731
    c, e = pick(calib), pick(eval_)
    for name, v in (("calib", c), ("eval", e)):
        bad = [d for d in (v or []) if d not in doms]
        if bad:
            raise NpuMoeError(f"routing {where}: {name}={'+'.join(v)} names unknown domain(s) {bad}; the data has "
                              f"{', '.join(doms)}")
    if len(doms) == 1:
        return doms, doms, "one domain"
    if e is None and c is None:
        layers = data.layers
        score = {}
        for d in doms:
            rest = [x for x in doms if x != d]
            score[d] = np.mean([tv_overlap(data.count_vector(layer, rest), data.count_vector(layer, [d]))
                                for layer in layers])
        order = sorted(doms, key=lambda d: score[d])
        e = [order[(len(order) - 1) // 2]]
        how = "leave one out: eval = the domain of median overlap with the others"
    else:
        how = "given"
    e = e or [d for d in doms if d not in c]
    c = c or [d for d in doms if d not in e]
    return c, e, how


def lodo_overlap(data: RoutingData) -> float:
    """Mean over layers and domains of 1 - TV(mix of the other domains, the domain): the measured hot-set shift."""
    doms = data.domains
    if len(doms) < 2:
        return math.nan
    return float(np.mean([tv_overlap(data.count_vector(layer, [x for x in doms if x != d]),
                                     data.count_vector(layer, [d])) for layer in data.layers for d in doms]))


def describe(data: RoutingData, path: Path) -> str:
    p = data.provenance
    tok = p.get("tokens", {})
    return (f"{path.name} ({p.get('model')}, {p.get('tool')}, phase {p.get('phase')}, "
            f"{len(data.layers)}/{len(p.get('geometry', {}).get('moe_layers', []))} layers, "
            f"{sum(tok.values()) if tok else '?'} tokens, licence {p.get('licence')})")


@dataclass
class TraceRouting:
    """Exact per-token routing replayed chunk by chunk (module docstring)."""
    label: str
    calib: dict                        # geometry layer -> [T_c, K] expert ids
    run: dict                          # geometry layer -> ([T_r, K] ids, [T_r, K] weights)
    top_k: int
    profile: CalibrationProfile | None = None
    _profiles: dict = field(default_factory=dict, repr=False)

    def gini(self) -> float:
        return float(np.mean([gini(np.bincount(ids.reshape(-1), minlength=ids.max() + 1))
                              for ids, _ in self.run.values()]))

    def chunks(self, specs, prompt_len: int, chunk: int, seed: int = 0):
        n = math.ceil(prompt_len / chunk)
        out = []
        norms = np.ones(chunk, dtype=np.float32)
        for c in range(n):
            per = {}
            for s in specs:
                ids, w = self.run[s.layer]
                rows = (np.arange(c * chunk, (c + 1) * chunk)) % len(ids)
                per[s.layer] = (ids[rows], w[rows], norms)
            out.append(per)
        return out

    def calibration_profile(self, specs, chunk: int, seed: int = 0) -> CalibrationProfile:
        if chunk in self._profiles:
            return self._profiles[chunk]
        frames, stats = [], []
        for s in specs:
            ids = self.calib[s.layer]
            if len(ids) < chunk:        # fewer calibration tokens than a chunk: wrapped round, as the prompt is
                ids = ids[np.arange(chunk) % len(ids)]
            n = max(1, len(ids) // chunk)
            m = np.zeros((s.n_experts, n), dtype=np.int64)
            for j in range(n):
                m[:, j] = np.bincount(ids[j * chunk:(j + 1) * chunk].reshape(-1), minlength=s.n_experts)
            frames.append(pd.DataFrame({"layer": s.layer, "expert": np.repeat(np.arange(s.n_experts), n),
                                        "chunk_id": np.tile(np.arange(n), s.n_experts), "count": m.reshape(-1)}))
            stats.append(pd.DataFrame({"layer": s.layer, "expert": np.arange(s.n_experts), "count": m.sum(1)}))
        counts = pd.concat(frames, ignore_index=True)
        st = pd.concat(stats, ignore_index=True).assign(weight_sum=0.0, weight_sq_sum=0.0, norm_sum=0.0)
        meta = {"model_fingerprint": "routing-data", "model": "routing-data", "workload": self.label,
                "chunk": chunk, "n_tokens": int(counts.groupby("layer")["count"].sum().iloc[0] // self.top_k),
                "n_chunks": int(counts["chunk_id"].nunique()), "seed": seed,
                "layers": [dict(vars(s)) for s in specs], "created": "routing data"}
        self._profiles[chunk] = CalibrationProfile(counts, st, meta, None)
        return self._profiles[chunk]


def from_trace(specs, path, calib=None, eval_=None, phase=None, seed: int = 0) -> TraceRouting:
    data = RoutingData.load(path)
    where = f"trace:{path}"
    if data.selections is None:
        raise NpuMoeError(f"routing {where}: {Path(path).name} holds per-expert counts only; use "
                          f"counts:{Path(path).name}")
    _check(data, specs, where)
    sel = data.selections
    if phase:
        if phase not in ("prefill", "decode"):
            raise NpuMoeError(f"routing {where}: phase={phase!r}; use prefill or decode")
        sel = sel[sel["phase"] == phase]
        if sel.empty:
            raise NpuMoeError(f"routing {where}: no {phase} tokens in the trace")
    data_layers = sorted(int(x) for x in sel["layer"].unique())
    lmap, filled = layer_map(data_layers, specs)
    K = specs[0].top_k
    c_dom, e_dom, how = split_domains(data, calib, eval_, where)
    segs = sorted(sel["segment"].unique())
    if c_dom != e_dom:
        split, sel_c, sel_e = f"calib = {'+'.join(c_dom)}, eval = {'+'.join(e_dom)} ({how})", \
            sel[sel["domain"].isin(c_dom)], sel[sel["domain"].isin(e_dom)]
    elif len(segs) > 1:
        split = f"calib = segments {segs[0]}..{segs[-2]}, eval = segment {segs[-1]}"
        sel_c, sel_e = sel[sel["segment"] != segs[-1]], sel[sel["segment"] == segs[-1]]
    else:
        split = "calib = the first half of each layer's tokens, eval = the second half"
        sel_c = sel_e = None
    order = ["segment", "phase", "token", "rank"]
    calib_ids, run = {}, {}
    n_run = []
    for s in specs:
        lay = lmap[s.layer]
        both = sel[sel["layer"] == lay].sort_values(order)
        ids = both["expert"].to_numpy().reshape(-1, K)
        w = both["weight"].to_numpy().reshape(-1, K)
        if sel_c is None:
            h = len(ids) // 2
            ci, ri, rw = ids[:h], ids[h:], w[h:]
        else:
            cc = sel_c[sel_c["layer"] == lay].sort_values(order)
            ee = sel_e[sel_e["layer"] == lay].sort_values(order)
            ci, ri, rw = cc["expert"].to_numpy().reshape(-1, K), ee["expert"].to_numpy().reshape(-1, K), \
                ee["weight"].to_numpy().reshape(-1, K)
        rw = np.where(np.isnan(rw), 1.0 / K, rw).astype(np.float32)     # weights unknown: equal
        calib_ids[s.layer], run[s.layer] = ci.astype(np.int64), (ri.astype(np.int64), rw)
        n_run.append(len(ri))
    label = (f"trace:{describe(data, Path(path))}, {split}, replayed chunk by chunk "
             f"({min(n_run)}-{max(n_run)} eval tokens per layer: a longer prompt wraps round)"
             + (f", phase {phase}" if phase else "") + (f"; {filled}" if filled else "")
             + "".join(f"; {n}" for n in data.provenance.get("notes", [])[:2]))
    return TraceRouting(label, calib_ids, run, K)


def from_counts(specs, path, calib=None, eval_=None, concentration=None, doc_concentration=None, seed: int = 0,
                defaults=None, overlap_from: str | None = None, shift: bool = True):
    """`shift=False`: with one domain the prompt keeps the calibration's hot set (in-sample: the best case)."""
    data = RoutingData.load(path)
    where = f"counts:{path}"
    _check(data, specs, where)
    lmap, filled = layer_map(data.layers, specs)
    c_dom, e_dom, how = split_domains(data, calib, eval_, where)
    d = defaults or model_defaults(path)
    conc = d["concentration"] if concentration is None else check_concentration("concentration", concentration)
    dconc = d["doc_concentration"] if doc_concentration is None else \
        check_concentration("doc_concentration", doc_concentration)
    share = lambda layer, doms: (lambda v: (v + 1e-9) / (v + 1e-9).sum())(data.count_vector(layer, doms))  # noqa
    calib_pop, run, sources = {}, {}, {}
    shift = shift and c_dom == e_dom
    if shift:
        if overlap_from is None and (Path(path) / "textlike.yaml").is_file():
            target, whence = float(d["workload_tv_overlap"]), _origin(path, "workload_tv_overlap", d)
        else:
            target = lodo_overlap(RoutingData.load(routing_folder(overlap_from or DEFAULT_OVERLAP_FROM)))
            whence = f"the leave-one-domain-out 1-TV of {overlap_from or DEFAULT_OVERLAP_FROM}"
        rng = np.random.default_rng(seed)
    for s in specs:
        lay = lmap[s.layer]
        sources[s.layer] = np.stack([share(lay, [x]) for x in c_dom])
        calib_pop[s.layer] = share(lay, c_dom)
        if not shift:
            run[s.layer] = share(lay, e_dom)
            continue
    if shift:      # one overlap for all layers, solved at their mean popularity curve (as profile: sources do)
        curve = np.mean([np.sort(v)[::-1] for v in calib_pop.values()], axis=0)
        w = overlap_for_tv(curve, 1, target, seed) if math.isfinite(target) else 1.0
        for s in specs:
            ids = _reshuffle(np.arange(s.n_experts), w, rng)
            run[s.layer] = calib_pop[s.layer][np.argsort(ids)]
    said = ""
    if shift:
        said = (f"; one domain: the prompt's hot set shifted to 1-TV {target:.3f} ({whence}; workload_overlap "
                f"{w:.3g})")
    label = (f"counts:{describe(data, Path(path))}, calib = {'+'.join(c_dom)}, eval = {'+'.join(e_dom)} ({how}); "
             f"per-document and per-chunk variation from the text-like model (concentration={_fmt(conc)} "
             f"[{_origin(path, 'concentration', d)}], doc_concentration={_fmt(dconc)} "
             f"[{_origin(path, 'doc_concentration', d)}]){said}"
             + (f"; {filled}" if filled else "") + "".join(f"; {n}" for n in data.provenance.get("notes", [])[:2]))
    return PopularityRouting(label, calib_pop, run, top_k=specs[0].top_k, concentration=conc,
                             doc_concentration=dconc, calib_sources=sources)


REAL_FALLBACK_GINI = 0.56       # Qwen3-30B-A3B's median per-layer Gini (data/routing/qwen3-30b-a3b)


def matching_folder(specs) -> Path | None:
    """The shipped routing folder whose geometry has these MoE layers, experts and top-k (None if none)."""
    want = ([s.layer for s in specs], specs[0].n_experts, specs[0].top_k)
    for d in sorted(ROUTING_DIR.iterdir()):
        if (d / "provenance.json").is_file() and (d / "counts.parquet").is_file():
            g = RoutingData.load(d).provenance.get("geometry", {})
            if (g.get("moe_layers"), g.get("n_experts"), g.get("top_k")) == want:
                return d
    return None


def real_default(specs, seed: int = 0):
    """`real`: each geometry's own shipped counts where data/routing holds some (counts:NAME), else synthetic
    routing at real-data statistics: Gini 0.56 (Qwen3-30B-A3B's median) and OLMoE's leave-one-domain-out 1 - TV."""
    from npumoe_lab.sim.routing import synthetic     # sibling: real_routing is imported by routing lazily
    d = matching_folder(specs)
    if d is not None:
        src = from_counts(specs, d, seed=seed)
        src.label = "real -> " + src.label
        return src
    olmoe = RoutingData.load(routing_folder(DEFAULT_OVERLAP_FROM))
    tv = lodo_overlap(olmoe)
    tiny = load_defaults()
    src = synthetic(specs, gini=REAL_FALLBACK_GINI, seed=seed, workload_overlap=None, workload_tv_overlap=tv,
                    concentration=tiny["concentration"], doc_concentration=tiny["doc_concentration"])
    src.label = (f"real -> no routing data for this geometry: {src.label} [Gini {REAL_FALLBACK_GINI} = Qwen3-30B-A3B's "
                 f"median (data/routing/qwen3-30b-a3b); 1-TV {tv:.3f} = OLMoE's leave-one-domain-out "
                 f"(data/routing/{DEFAULT_OVERLAP_FROM}); concentrations: {tiny['source'].split(' (')[0]}]")
    return src


__all__ = ["real_default", "matching_folder", "from_counts", "from_trace", "routing_folder", "layer_map", "lodo_overlap", "TraceRouting"]
