"""Routing sources for simulation: where a simulated prefill's expert choices come from.

- `synthetic:gini=G|zipf=S[,FIELD=VALUE...]`: per-layer popularity ~ (rank+1)^-s, s solved so that the *sampled*
  per-expert counts reach Gini G; hot sets shared between layers (layer_overlap L: fraction of the rank->expert map
  kept from the previous layer; 0 = independent). Text-like variation (textlike.py): every named workload has its
  own hot set (workload_overlap W: fraction of the map kept; 1 = one hot set for all), a document's popularity
  ~ Dirichlet around its workload's (doc_concentration), each chunk's ~ Dirichlet around its document's
  (concentration); the plan is calibrated on the `calibration` mix (documents cycling over its workloads) and the
  prompt is one document of `workload`. Fields not given take the measured defaults of
  data/routing/tiny-defaults.yaml (`npumoe-lab routing-stats` derives them from the bundled model's routing);
  `routing_source` states every value and where the defaults came from. Each field at most once.
- `profile:DIR[,run=DIR2][,workload_overlap=W]` (or a directory): a calibration profile from `npumoe-lab calibrate`
  (e.g. run on a Mac with the real checkpoint): the plan is calibrated on its counts; the prompt's chunks replay the
  per-chunk popularity of DIR2's recorded chunks (its per-chunk structure kept), by default of DIR's own chunks with
  the measured hot-set shift applied (a fraction 1 - W of the expert ids permuted; W=1: DIR itself).
- `tiny[:workload=NAME]` : the bundled model's own routing. Plain `tiny`: its calibrated popularity (mixed text,
  4096 tokens) stretched to E experts, layer l taking tiny layer l mod 4 (what bench/ samples its routing from).
  With a workload (geometries of 32 experts, e.g. data/models/npumoe-tiny): planned on its real mixed-text profile
  (chunk 256), the prompt routed by that workload's held-out popularity with the measured per-document and
  per-chunk variation: what the 3-point test against its measured drop and padding uses.
- recorded routing (Python only, `RecordedRouting`): per chunk and layer, the exact choices a real run made.

Per chunk, routing is sampled token by token: K distinct experts per token drawn in proportion to the chunk's
popularity (Gumbel top-k), so drop and padding rates are real consequences of a plan's capacities against each
chunk's counts. Synthetic routing carries no hidden-state norms (norms = 1: saliency reduces to the router weight). Sampled chunks
are NumPy arrays (the array path needs no torch; the per-op replay converts them).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from npumoe_lab.planning.profile import CalibrationProfile
from npumoe_lab.errors import NpuMoeError
from npumoe_lab.sim import draw_cache
from npumoe_lab.sim.topk import column_counts, smallest_k, smallest_k_mask
from npumoe_lab.sim.textlike import (WORKLOAD_NAMES, check_concentration, dirichlet, load_defaults, mix_names,
                                     tv_overlap)

CALIBRATION_TOKENS = 8192        # sampled calibration tokens when a source has no per-chunk counts at this chunk
MIN_CALIBRATION_CHUNKS = 8
CALIBRATION_DOC_CHUNKS = 4       # sampled calibration chunks per document (a new document's popularity after each)


def gini(x) -> float:
    """Gini coefficient of non-negative loads (0 = uniform, (n-1)/n = one expert takes everything)."""
    x = np.sort(np.asarray(x, dtype=float))
    n, total = len(x), x.sum()
    if n == 0 or total <= 0:
        return 0.0
    return float(((2 * np.arange(1, n + 1) - n - 1) * x).sum() / (n * total))


def stretch(shares, n: int) -> np.ndarray:
    """A sorted share curve of m experts resampled at n points (same shape over the rank fraction)."""
    s = np.sort(np.asarray(shares, dtype=float))[::-1]
    x = (np.arange(len(s)) + 0.5) / len(s)
    out = np.interp((np.arange(n) + 0.5) / n, x, s)
    return out / out.sum()


def _spec_key(specs) -> tuple:
    """What the sampler reads of the layer specs (the draw cache's key)."""
    return tuple((s.layer, s.n_experts, s.top_k) for s in specs)


def _layers_of(per_layer: dict | None, specs):
    """The specs' layers of a per-layer dict (None stays None): the arrays a draw reads."""
    return None if per_layer is None else [per_layer[s.layer] for s in specs]


def _packed(kept: tuple) -> tuple:
    """A prompt's kept draws (generator, document, chunks, counts) for the draw cache, expert ids in the smallest
    unsigned type that holds them (a third of the int64 bytes to write and read; _unpacked restores int64)."""
    g, doc, out, per_chunk = kept
    return g, doc, [{layer: (_small(i), w, n) for layer, (i, w, n) in c.items()} for c in out], per_chunk


def _small(idx: np.ndarray) -> np.ndarray:
    return idx.astype(np.min_scalar_type(int(idx.max()))) if idx.size and idx.min() >= 0 else idx


def _unpacked(kept: tuple | None) -> tuple | None:
    if kept is None:
        return None
    g, doc, out, per_chunk = kept
    return g, doc, [{layer: (i.astype(np.int64), w, n) for layer, (i, w, n) in c.items()} for c in out], per_chunk


def sample_routing_np(shares, T: int, K: int, rng: np.random.Generator, perm=None):
    """(top_k_index [T, K] int64, top_k_weights [T, K] float32) as NumPy arrays: K distinct experts per token drawn
    ~ shares (Gumbel top-k = sampling without replacement in proportion to the shares), weights = softmax over the
    drawn scores (renormalised top-k, as Qwen3 routes), highest first. `perm[r]` = the expert id of share rank r, so
    hot experts are not simply the lowest ids. NumPy: thousands of small draws per simulation, no thread-pool cost."""
    logp = _logp(shares, perm)
    # neg = -(logp + Gumbel(0, 1) noise) = log(-log u) - logp, in place (the same float32 values as negating the
    # scores: IEEE negation is exact): the K smallest are the K drawn experts
    neg = _neg_gumbel(rng.random((T, len(logp)), dtype=np.float32))
    np.subtract(neg, logp, out=neg)
    idx, nv = smallest_k(neg, K)                    # the K smallest, ascending (= argpartition + stable sort)
    w = np.exp(nv[:, :1] - nv)                      # = exp(v - v_max) of the scores v = -nv
    return idx.astype(np.int64), (w / w.sum(1, keepdims=True)).astype(np.float32)


def sample_routing_mask(shares, T: int, K: int, rng: np.random.Generator) -> np.ndarray:
    """[T, E] bool: the experts sample_routing_np(shares, T, K, rng) draws, marked, not ordered and without weights
    (the same uniforms from `rng`, the same float32 scores; a count needs no more: `.sum(0)` per expert)."""
    neg = _neg_gumbel(rng.random((T, len(shares)), dtype=np.float32))
    np.subtract(neg, _logp(shares), out=neg)
    return smallest_k_mask(neg, K)


def sample_routing(shares, T: int, K: int, rng: np.random.Generator, perm=None):
    """sample_routing_np as torch tensors (what the engine's numerics take: bench/moe_layer.py, tests)."""
    import torch      # lazy: a simulation samples in NumPy and never needs torch
    idx, w = sample_routing_np(shares, T, K, rng, perm)
    return torch.from_numpy(idx), torch.from_numpy(w)


def _logp(shares, perm=None) -> np.ndarray:
    logp = np.log(np.maximum(np.asarray(shares, dtype=np.float64), 1e-30)).astype(np.float32)
    return logp if perm is None else logp[np.argsort(perm)]


def _neg_gumbel(u: np.ndarray) -> np.ndarray:
    """log(-log u) = minus a Gumbel(0, 1) draw per uniform, in place in `u` (float32)."""
    neg = np.maximum(u, np.float32(1e-30), out=u)
    np.log(neg, out=neg)
    np.negative(neg, out=neg)
    return np.log(neg, out=neg)


def _gini_noise(tokens: int, E: int, seed: int) -> np.ndarray:
    """What a fresh generator of `seed` draws in sample_routing_np for `tokens` x `E`: log(-log u) per uniform."""
    return _neg_gumbel(np.random.default_rng(seed).random((tokens, E), dtype=np.float32))


def sampled_gini(shares, K: int, tokens: int = 4096, seed: int = 0, noise: np.ndarray | None = None) -> float:
    """Gini of the per-expert counts of `tokens` tokens routed ~ shares (K distinct experts each) by a fresh
    generator of `seed`: = sample_routing_np(shares, tokens, K, default_rng(seed)) counted, bit for bit (the same
    noise, the same float32 subtraction; the weights are not needed). `noise`: `_gini_noise(tokens, E, seed)` where
    the caller draws it once for many shares (zipf_for_gini's bisection)."""
    noise = _gini_noise(tokens, len(shares), seed) if noise is None else noise
    return gini(column_counts(smallest_k_mask(np.subtract(noise, _logp(shares)), K)))


def zipf_shares(E: int, s: float) -> np.ndarray:
    p = (np.arange(E) + 1.0) ** -s
    return p / p.sum()


def zipf_for_gini(E: int, K: int, target: float, seed: int = 0) -> float:
    """Zipf exponent whose sampled counts (K distinct experts per token) have Gini `target` (bisection; every step
    counts the same 4096 tokens' noise, drawn once)."""
    noise = _gini_noise(4096, E, seed)
    hi_gini = sampled_gini(zipf_shares(E, 12.0), K, seed=seed, noise=noise)
    if not 0 < target < 1:
        raise NpuMoeError(f"gini={target} is outside (0, 1); give e.g. synthetic:gini=0.6")
    if target >= hi_gini:
        raise NpuMoeError(f"gini={target} cannot be reached with {E} experts and top-{K} (K distinct experts per "
                          f"token cap it at about {hi_gini:.2f}); give a smaller gini")
    lo, hi = 0.0, 12.0
    for _ in range(30):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if sampled_gini(zipf_shares(E, mid), K, seed=seed, noise=noise) < target else (lo, mid)
    return (lo + hi) / 2


def _reshuffle(perm: np.ndarray, keep: float, rng: np.random.Generator) -> np.ndarray:
    """`perm` with a fraction 1 - keep of its positions permuted among themselves (keep=1: unchanged)."""
    out = perm.copy()
    moved = rng.choice(len(perm), size=int(round((1 - keep) * len(perm))), replace=False)
    out[moved] = perm[rng.permutation(moved)]
    return out


@dataclass
class PopularityRouting:
    """Per MoE layer: calibration and run popularity [E] (expert id order); routing sampled from them."""
    label: str
    calibration: dict                      # layer -> [E] shares the plan is calibrated on
    run: dict                              # layer -> [E] shares the prompt is routed by
    profile: CalibrationProfile | None = None    # a real profile: planned on its own counts at its own chunk
    top_k: int = 1                               # experts per token (for the Gini before any run is sampled)
    concentration: float | None = None           # per-chunk Dirichlet concentration per expert (None: none)
    doc_concentration: float | None = None       # per-document one
    calib_sources: dict | None = None            # layer -> [S, E] popularity of each workload of the calibration mix
    run_records: dict | None = None              # layer -> [n, E] recorded per-chunk popularity the prompt replays
    calib_records: dict | None = None            # layer -> [n, E] recorded per-chunk popularity for calibration
    _gini: dict = field(default_factory=dict, repr=False)       # layer -> Gini of the last sampled run's counts
    _profiles: dict = field(default_factory=dict, repr=False)   # (chunk, seed) -> sampled calibration profile
    _sampled: dict = field(default_factory=dict, repr=False)    # the last run draws: (generator, doc, chunks, counts)

    def gini(self) -> float:
        """Mean over layers of the Gini of the run's sampled per-expert counts (what the simulation sees); before
        any run is sampled, of a 4096-token sample of each layer."""
        if not self._gini:
            return float(np.mean([sampled_gini(p, self.top_k, seed=0) for p in self.run.values()])) if self.run else 0.0
        return float(np.mean([self._gini[layer] for layer in sorted(self._gini)]))

    def chunks(self, specs, prompt_len: int, chunk: int, seed: int = 0):
        """[chunk index] -> {layer: (top_k_index [chunk, K] int64, top_k_weights [chunk, K] float32, norms [chunk])}
        (NumPy arrays). One document's popularity is drawn first, then the chunks in order from one generator, so a
        shorter prompt's chunks are a longer one's first chunks: the last draw is kept and extended (a grid of
        prompt lengths samples the longest once; tests/sim/test_simulate.py holds it equal to a fresh draw)."""
        norms = np.ones(chunk, dtype=np.float32)

        def draw(shares, s, g):
            idx, w = sample_routing_np(shares, chunk, s.top_k, g)
            return (idx, w, norms), np.bincount(idx.reshape(-1), minlength=s.n_experts)
        return self._drawn(self._sampled, "chunks", draw, specs, prompt_len, chunk, seed, _packed, _unpacked)[0]

    def chunk_counts(self, specs, prompt_len: int, chunk: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
        """(every token's, real tokens'): [n chunks, MoE layers, E = the specs' most experts] int64 per-expert counts
        of the prompt's chunks (padding of the last chunk in the first, not in the second): what chunks(...) draws,
        counted. The same generator stream and float32 scores as chunks(); smallest_k_mask marks the experts
        smallest_k returns, without ordering or weighting them (what counts need; a third less time a chunk). Each
        chunk's mask is kept bit-packed for a later prompt ending inside it (tests/sim/test_chunk_counts.py holds
        both equal to chunks()'s counts)."""
        def draw(shares, s, g):
            mask = sample_routing_mask(shares, chunk, s.top_k, g)
            return np.packbits(mask, axis=1), column_counts(mask)
        packed, per_chunk = self._drawn(self.__dict__.setdefault("_counted", {}), "chunk-counts", draw, specs,
                                        prompt_len, chunk, seed)
        n, E = len(per_chunk), max(s.n_experts for s in specs)
        every = np.zeros((n, len(specs), E), dtype=np.int64)
        for c, counts in enumerate(per_chunk):
            for i, s in enumerate(specs):
                every[c, i, :s.n_experts] = counts[s.layer]
        real = every.copy()
        n_last = prompt_len - (n - 1) * chunk
        if n_last < chunk:            # padding tokens of the last chunk take no capacity
            for i, s in enumerate(specs):
                real[-1, i, :s.n_experts] = np.unpackbits(packed[-1][s.layer][:n_last], axis=1,
                                                          count=s.n_experts).sum(0, dtype=np.int64)
        return every, real

    def _drawn(self, kept_draws: dict, kind: str, draw, specs, prompt_len, chunk, seed, pack=None, unpack=None):
        """(per chunk {layer: draw's first value}, per chunk {layer: [E] counts of every token}) of the prompt's
        first ceil(prompt_len / chunk) chunks, `draw(shares, spec, generator)` -> (value, counts) sampling one
        chunk of one layer. The generator and document are kept with the draws (in `kept_draws`, and on disk under
        `kind`), so a longer prompt extends them; sets the run Gini (gini())."""
        key = (tuple(s.layer for s in specs), chunk, seed)
        kept = kept_draws.get(key)
        disk = draw_cache.key(kind, _spec_key(specs), chunk, seed, self.concentration, self.doc_concentration,
                              _layers_of(self.run, specs), _layers_of(self.run_records, specs))
        if kept is None:
            if len(kept_draws) >= 4:          # the last few draws (one per chunk size of a grid), bounded
                kept_draws.pop(next(iter(kept_draws)))
            # the generator's state is kept with the chunks: a longer prompt continues the same stream
            loaded = draw_cache.load(disk)
            kept = unpack(loaded) if unpack is not None else loaded
            if kept is None:
                g = np.random.default_rng(seed + 1)
                doc = {s.layer: dirichlet(self.run[s.layer], self.doc_concentration, g) for s in specs}  # one doc
                kept = (g, doc, [], [])
            kept_draws[key] = kept
        g, doc, out, per_chunk = kept
        n = math.ceil(prompt_len / chunk)
        drawn = len(out)
        for c in range(len(out), n):
            values, counts = {}, {}
            for s in specs:
                if self.run_records is not None:
                    rec = self.run_records[s.layer]
                    shares = rec[c % len(rec)]
                else:
                    shares = dirichlet(doc[s.layer], self.concentration, g)
                values[s.layer], counts[s.layer] = draw(shares, s, g)
            out.append(values)
            per_chunk.append(counts)
        if len(out) > drawn:
            draw_cache.store(disk, pack(kept) if pack is not None else kept)
        self._gini = {s.layer: gini(np.sum([cc[s.layer] for cc in per_chunk[:n]], axis=0, dtype=float))
                      for s in specs}
        return out[:n], per_chunk[:n]

    def calibration_profile(self, specs, chunk: int, seed: int = 0) -> CalibrationProfile:
        """The profile plans are built from: the real one at its own chunk, else chunks sampled from the
        calibration popularity (the plan sees per-chunk fluctuation as a real calibration would)."""
        if self.profile is not None and self.profile.chunk == chunk:
            return self.profile
        if (chunk, seed) in self._profiles:
            return self._profiles[(chunk, seed)]
        n_chunks = max(MIN_CALIBRATION_CHUNKS, CALIBRATION_TOKENS // chunk)
        matrices = draw_cache.cached(
            draw_cache.key("calibration", _spec_key(specs), chunk, seed, n_chunks, self.concentration,
                           self.doc_concentration, _layers_of(self.calibration, specs),
                           _layers_of(self.calib_sources, specs), _layers_of(self.calib_records, specs)),
            lambda: self._calibration_matrices(specs, chunk, seed, n_chunks))
        rows = [(np.full(m.size, s.layer, dtype=np.int64), np.repeat(np.arange(s.n_experts), m.shape[1]),
                 np.tile(np.arange(m.shape[1]), s.n_experts), m.reshape(-1))
                for s, m in ((s, matrices[s.layer]) for s in specs)]
        # one frame from the layers' columns (a frame per layer and a concat cost ~0.4 s of a paper grid)
        counts = pd.DataFrame({name: np.concatenate([r[i] for r in rows])
                               for i, name in enumerate(("layer", "expert", "chunk_id", "count"))})
        stats = counts.groupby(["layer", "expert"], as_index=False)["count"].sum()
        stats = stats.assign(weight_sum=0.0, weight_sq_sum=0.0, norm_sum=0.0)
        meta = {"model_fingerprint": "simulated", "model": "simulated", "workload": self.label, "chunk": chunk,
                "n_tokens": chunk * n_chunks, "n_chunks": n_chunks, "seed": seed,
                "layers": [dict(vars(s)) for s in specs], "created": "simulated"}
        profile = CalibrationProfile(counts, stats, meta, None)
        profile._matrices.update(matrices)     # the [E, chunks] matrices planning reads, without re-pivoting
        self._profiles[(chunk, seed)] = profile
        return profile

    def _calibration_matrices(self, specs, chunk: int, seed: int, n_chunks: int) -> dict:
        """{layer: [E, n_chunks] int64}: the calibration counts per chunk, sampled from the calibration popularity."""
        g = np.random.default_rng(seed)
        matrices = {}
        varied = self.concentration is not None or self.doc_concentration is not None or \
            self.calib_sources is not None or self.calib_records is not None
        for s in specs:
            m = np.zeros((s.n_experts, n_chunks), dtype=np.int64)
            if not varied:       # one popularity for every chunk: all tokens in one draw
                drawn = sample_routing_mask(self.calibration[s.layer], chunk * n_chunks, s.top_k, g)
                m[:] = drawn.reshape(n_chunks, chunk, s.n_experts).sum(1).T
            for j in range(n_chunks if varied else 0):
                if self.calib_records is not None:
                    rec = self.calib_records[s.layer]
                    shares = rec[j % len(rec)]
                else:
                    if j % CALIBRATION_DOC_CHUNKS == 0:      # a new document, of the mix's next workload
                        src = self.calib_sources[s.layer] if self.calib_sources is not None else \
                            self.calibration[s.layer][None]
                        doc = dirichlet(src[(j // CALIBRATION_DOC_CHUNKS) % len(src)], self.doc_concentration, g)
                    shares = dirichlet(doc, self.concentration, g)
                m[:, j] = column_counts(sample_routing_mask(shares, chunk, s.top_k, g))
            matrices[s.layer] = m
        return matrices


@dataclass
class RecordedRouting:
    """The exact routing of a real prefill (RoutingRecorder records grouped by chunk), with the profile its plans
    were built from: the simulation must reproduce the run's timeline."""
    records: list                          # [chunk] -> {layer: RoutingRecord}
    profile: CalibrationProfile
    label: str = "recorded"

    def chunks(self, specs, prompt_len: int, chunk: int, seed: int = 0):
        return [{layer: (r.topk_idx, r.topk_weight, r.hidden_norm) for layer, r in per.items()}
                for per in self.records]

    def calibration_profile(self, specs, chunk: int, seed: int = 0) -> CalibrationProfile:
        return self.profile

    def gini(self) -> float:
        return float(np.mean([gini(np.bincount(r.topk_idx.reshape(-1).numpy(), minlength=int(r.router_logits.shape[1])))
                              for per in self.records for r in per.values()]))


def _check_profile(profile: CalibrationProfile, specs, where: str) -> None:
    layers = sorted(s.layer for s in specs)
    if sorted(profile.layers) != layers:
        raise NpuMoeError(f"{where}: the profile's MoE layers {sorted(profile.layers)} do not match the geometry's "
                          f"{layers[:3]}...{layers[-1:]} ({len(layers)} layers); calibrate the model of this geometry")
    for s in specs:
        E = profile.n_experts(s.layer)
        if E != s.n_experts:
            raise NpuMoeError(f"{where}: layer {s.layer} has {E} experts in the profile but {s.n_experts} in the "
                              "geometry; calibrate the model of this geometry")


def _shares(profile: CalibrationProfile, layer: int) -> np.ndarray:
    m = profile.count_matrix(layer).sum(1).astype(float) + 1e-9     # never-routed experts keep a tiny share
    return m / m.sum()


def _parse_params(text: str, allowed: dict, kind: str = "synthetic") -> dict:
    """'k=v,k=v' -> {k: cast(v)}: each key known and given once, each value of its type."""
    out = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        key, _, value = part.partition("=")
        key, value = key.strip(), value.strip()
        if key not in allowed or not value:
            raise NpuMoeError(f"{kind} routing parameter {part!r} is unknown; use {', '.join(allowed)} as key=value "
                              "(e.g. synthetic:gini=0.6,layer_overlap=0.5)")
        if key in out:
            raise NpuMoeError(f"{kind} routing parameter {key!r} is given twice ({key}={out[key]!r} and {part!r}); "
                              "give each field once")
        try:
            out[key] = allowed[key](value)
        except ValueError:
            raise NpuMoeError(f"{kind} routing parameter {key}={value!r} is not a number") from None
    return out


WORKLOAD_INDEX = {n: i for i, n in enumerate(sorted(WORKLOAD_NAMES))}   # seeds each workload's own hot set
SYNTHETIC_FIELDS = {"gini": float, "zipf": float, "layer_overlap": float, "workload_overlap": float,
                    "concentration": float, "doc_concentration": float, "calibration": str, "workload": str,
                    "seed": int}


def _fmt(v) -> str:
    return "inf" if v is None else f"{v:g}" if isinstance(v, float) else str(v)


OVERLAP_GRID = np.linspace(0.0, 1.0, 21)


def mix_overlap_curve(curve, n_mix: int, seed: int = 0, reps: int = 8) -> np.ndarray:
    """Mean 1 - TV(mix of n_mix workloads, one member) of the synthetic workload model at each OVERLAP_GRID value
    (each workload: the shared rank -> expert map with a fraction 1 - W permuted; popularity `curve` by rank)."""
    curve = np.sort(np.asarray(curve, dtype=np.float64))[::-1]
    E, vals = len(curve), []
    for w in OVERLAP_GRID:
        tv = []
        for r in range(reps):
            perm = np.random.default_rng([seed, r]).permutation(E)
            pops = [curve[np.argsort(_reshuffle(perm, w, np.random.default_rng([seed, r, i])))]
                    for i in range(max(n_mix, 2))]
            mix = np.mean(pops[:n_mix] if n_mix > 1 else pops[:1], axis=0)
            tv += [tv_overlap(mix, q) for q in (pops[:n_mix] if n_mix > 1 else pops[1:2])]
        vals.append(np.mean(tv))
    return np.maximum.accumulate(np.array(vals))          # the overlap rises with W


def overlap_for_tv(curve, n_mix: int, target: float, seed: int = 0) -> float:
    """The workload_overlap whose synthetic mix overlaps its members by 1 - TV = target (1 when even W=1 is below,
    0 when even W=0 is above: the workloads are at least as different as independent hot sets)."""
    ov = mix_overlap_curve(curve, n_mix, seed)
    if target >= ov[-1]:
        return 1.0
    return float(np.interp(target, ov, OVERLAP_GRID))


def synthetic(specs, gini: float | None = None, zipf: float | None = None, layer_overlap: float = 0.0,
              workload_overlap: float | None = 1.0, seed: int = 0, concentration: float | None = None,
              doc_concentration: float | None = None, calibration: str | None = None, workload: str | None = None,
              workload_tv_overlap: float | None = None, defaults_source: str | None = None) -> PopularityRouting:
    """Synthetic routing (module docstring). Without `calibration`/`workload` the plan is calibrated on the base
    hot set and the prompt routed by one with a fraction 1 - workload_overlap of it permuted; with them, every
    named workload has its own hot set and the mixes average them. `workload_overlap=None` with
    `workload_tv_overlap`: the overlap solved so that the mix overlaps its members by 1 - TV = that value at this
    geometry's popularity curve (how the measured default transfers). Concentrations None: no per-document or
    per-chunk variation (tokens independent)."""
    if (gini is None) == (zipf is None):
        raise NpuMoeError("synthetic routing needs exactly one of gini=G (0 < G < 1) or zipf=S (S >= 0)")
    if workload_overlap is None and workload_tv_overlap is None:
        raise NpuMoeError("synthetic routing needs workload_overlap=W or a measured workload_tv_overlap")
    for name, v in (("layer_overlap", layer_overlap), ("workload_overlap", workload_overlap),
                    ("workload_tv_overlap", workload_tv_overlap)):
        if v is not None and not 0 <= v <= 1:
            raise NpuMoeError(f"{name}={v} is outside [0, 1]")
    if zipf is not None and zipf < 0:
        raise NpuMoeError(f"zipf={zipf} must be >= 0")
    concentration = check_concentration("concentration", concentration)
    doc_concentration = check_concentration("doc_concentration", doc_concentration)
    mixes = None
    if calibration is not None or workload is not None:
        mixes = (mix_names(calibration or "mixed", "calibration"), mix_names(workload or "mixed", "workload"))
    rng = np.random.default_rng(seed)
    E, K = specs[0].n_experts, specs[0].top_k
    s = zipf if zipf is not None else draw_cache.cached(draw_cache.key("zipf", E, K, float(gini), seed),
                                                        lambda: zipf_for_gini(E, K, gini, seed))
    base = zipf_shares(E, s)
    solved = ""
    if workload_overlap is None:
        n_mix = len(mixes[0]) if mixes else 1
        workload_overlap = draw_cache.cached(
            draw_cache.key("overlap", base, n_mix, float(workload_tv_overlap), seed),
            lambda: overlap_for_tv(base, n_mix, workload_tv_overlap, seed))
        solved = f" (solved for the measured 1-TV {workload_tv_overlap:.3f})"
    calib, run, sources, perm = {}, {}, {}, rng.permutation(E)
    for sp in specs:
        perm = _reshuffle(perm, layer_overlap, rng) if calib else perm
        if mixes is None:
            calib[sp.layer] = base[np.argsort(perm)]            # expert perm[r] has rank r
            drifted = _reshuffle(perm, workload_overlap, rng)
            run[sp.layer] = base[np.argsort(drifted)]
            continue
        names = sorted(set(mixes[0]) | set(mixes[1]))
        # each workload's hot set: its own generator (seed, layer, workload), so a mix does not change the others
        pop = {n: base[np.argsort(_reshuffle(perm, workload_overlap, np.random.default_rng(
            [seed, sp.layer, WORKLOAD_INDEX[n]])))] for n in names}
        sources[sp.layer] = np.stack([pop[n] for n in mixes[0]])
        calib[sp.layer] = sources[sp.layer].mean(0)
        run[sp.layer] = np.mean([pop[n] for n in mixes[1]], axis=0)
    what = f"gini={gini:g} (zipf {s:.3f})" if gini is not None else f"zipf={s:g}"
    label = f"synthetic:{what},layer_overlap={layer_overlap:g},workload_overlap={workload_overlap:.3g}{solved}"
    if mixes is not None or concentration is not None or doc_concentration is not None:
        label += (f",concentration={_fmt(concentration)},doc_concentration={_fmt(doc_concentration)}")
    if mixes is not None:
        label += f",calibration={'+'.join(mixes[0])},workload={'+'.join(mixes[1])}"
    label += f",seed={seed}" + (f" [defaults measured: {defaults_source}]" if defaults_source else "")
    return PopularityRouting(label, calib, run, top_k=K, concentration=concentration,
                             doc_concentration=doc_concentration, calib_sources=sources or None)


def _chunk_shares(profile: CalibrationProfile, layer: int) -> np.ndarray:
    """[chunks, E] routed share per recorded chunk (a chunk routed nowhere keeps a uniform share)."""
    m = profile.count_matrix(layer).astype(float).T
    tot = m.sum(1, keepdims=True)
    return np.where(tot > 0, m / np.maximum(tot, 1e-12), 1.0 / m.shape[1])


def from_profile(specs, path, run=None, workload_overlap: float | None = None, seed: int = 0,
                 defaults_source: dict | None = None) -> PopularityRouting:
    """Planned on the profile at `path`; the prompt replays the per-chunk popularity of the profile `run`
    (default: this one's chunks with a fraction 1 - workload_overlap of the expert ids permuted)."""
    profile = CalibrationProfile.load(path)
    _check_profile(profile, specs, f"profile {path}")
    shares = {s.layer: _shares(profile, s.layer) for s in specs}
    records = {s.layer: _chunk_shares(profile, s.layer) for s in specs}
    what = f"{Path(path).name} ({profile.meta.get('model')}, {profile.meta.get('workload')}, " \
           f"{profile.meta.get('n_tokens')} tokens)"
    if run is not None:
        other = CalibrationProfile.load(run)
        _check_profile(other, specs, f"profile {run}")
        run_records = {s.layer: _chunk_shares(other, s.layer) for s in specs}
        label = f"profile:{what}, run replays the chunks of {Path(run).name} ({other.meta.get('workload')})"
    else:
        solved = ""
        if workload_overlap is None and defaults_source is not None:    # the measured hot-set shift
            target = defaults_source["workload_tv_overlap"]
            curve = np.mean([np.sort(v)[::-1] for v in shares.values()], axis=0)
            workload_overlap = overlap_for_tv(curve, 1, target, seed)
            solved = f" (solved for the measured 1-TV {target:.3f})"
            defaults_source = defaults_source["source"]
        w = 1.0 if workload_overlap is None else workload_overlap
        if not 0 <= w <= 1:
            raise NpuMoeError(f"workload_overlap={w} is outside [0, 1]")
        rng, run_records = np.random.default_rng(seed), {}
        for s in specs:
            ids = _reshuffle(np.arange(s.n_experts), w, rng)     # expert ids[e] takes the recorded expert e's share
            run_records[s.layer] = records[s.layer][:, np.argsort(ids)]
        label = f"profile:{what}, run replays its chunks with workload_overlap={w:.3g}{solved}" + \
            (f" [default measured: {defaults_source}]" if defaults_source else "")
    run_mean = {layer: r.mean(0) for layer, r in run_records.items()}
    return PopularityRouting(label, shares, run_mean, profile=profile, top_k=specs[0].top_k,
                             run_records=run_records, calib_records=records)


def stretched_tiny(specs, seed: int = 0) -> PopularityRouting:
    """The bundled model's calibrated popularity (mixed text, chunk 256, 4096 tokens) stretched to E experts."""
    # lazy: calibrating loads torch and the bundled model, only for this source
    from npumoe_lab.execution.calibrate import calibration_profile
    from npumoe_lab.models import load_model
    model, tok = load_model("tiny")
    prof = calibration_profile(model, tok, "mixed", 256, 4096, seed)
    rng = np.random.default_rng(seed)
    tiny_layers = prof.layers
    shares = {}
    for s in specs:
        curve = stretch(_shares(prof, tiny_layers[s.layer % len(tiny_layers)]), s.n_experts)
        shares[s.layer] = curve[np.argsort(rng.permutation(s.n_experts))]
    return PopularityRouting(f"tiny: npumoe-tiny calibrated popularity (mixed, 4096 tokens) stretched to "
                             f"{specs[0].n_experts} experts", shares, shares, top_k=specs[0].top_k)


def tiny_workload(specs, workload: str, defaults: dict, concentration=None, doc_concentration=None
                  ) -> PopularityRouting:
    """The bundled model's own routing statistics: planned on its real mixed-text profile (chunk 256), the prompt
    one document of `workload`'s held-out text popularity with the measured per-document and per-chunk variation."""
    from npumoe_lab.sim.routing_stats import tiny_profiles      # lazy: calibrates the bundled model once (cached)
    mix_names(workload, "workload")
    profiles = tiny_profiles()
    cal = profiles["mixed"]
    _check_profile(cal, specs, "routing tiny:workload=... (the bundled model's 32 experts per layer)")
    names = mix_names(workload, "workload")
    run = {s.layer: np.mean([_shares(profiles[n], s.layer) for n in names], axis=0) for s in specs}
    c = defaults["concentration"] if concentration is None else concentration
    d = defaults["doc_concentration"] if doc_concentration is None else doc_concentration
    return PopularityRouting(f"tiny:workload={workload} (npumoe-tiny: planned on its mixed calib profile, "
                             f"{cal.meta.get('n_tokens')} tokens at chunk {cal.chunk}; routed by the held-out "
                             f"popularity, concentration={_fmt(c)},doc_concentration={_fmt(d)} [measured: "
                             f"{defaults['source']}])", {s.layer: _shares(cal, s.layer) for s in specs}, run,
                             profile=cal, top_k=specs[0].top_k, concentration=c, doc_concentration=d)


def parse_routing(spec, specs, seed: int = 0, defaults=None):
    """A routing source from its spec string (module docstring), checked against the geometry's layer specs.
    `defaults`: the measured routing defaults (textlike.load_defaults(); read from the data file when needed)."""
    if not isinstance(spec, str):
        return spec                                       # already a source object (e.g. RecordedRouting)
    kind, _, rest = spec.partition(":")
    if kind == "synthetic":
        params = _parse_params(rest, SYNTHETIC_FIELDS)
        for k in ("concentration", "doc_concentration"):
            if k in params:
                check_concentration(k, params[k])
        if "calibration" in params:
            mix_names(params["calibration"], "calibration")
        if "workload" in params:
            mix_names(params["workload"], "workload")
        d = defaults or load_defaults()
        filled = {k: d[k] for k in ("concentration", "doc_concentration", "calibration", "workload")
                  if k not in params}
        if "workload_overlap" not in params:
            filled |= {"workload_overlap": None, "workload_tv_overlap": d["workload_tv_overlap"]}
        return synthetic(specs, **{"seed": seed, **filled, **params},
                         defaults_source=d["source"] + " for " + ", ".join(k for k in filled if k != "workload_overlap")
                         if filled else None)
    if kind == "tiny":
        if not rest:
            return stretched_tiny(specs, seed)
        params = _parse_params(rest, {"workload": str, "concentration": float, "doc_concentration": float}, "tiny")
        if "workload" not in params:
            raise NpuMoeError(f"routing {spec!r}: tiny with fields needs workload=NAME (e.g. tiny:workload=code)")
        for k in ("concentration", "doc_concentration"):
            check_concentration(k, params.get(k))
        return tiny_workload(specs, params.pop("workload"), defaults or load_defaults(), **params)
    if spec == "real":
        from npumoe_lab.sim.real_routing import real_default    # lazy: real_routing imports this module
        return real_default(specs, seed)
    if kind in ("counts", "trace") or (Path(spec.partition(",")[0]) / "provenance.json").is_file():
        # lazy: real_routing imports this module (its sources are PopularityRouting and friends)
        from npumoe_lab.sim import real_routing
        where, _, fields = (rest if kind in ("counts", "trace") else spec).partition(",")
        folder = real_routing.routing_folder(where)
        if kind not in ("counts", "trace"):      # a routing-import folder: whichever kind it holds
            kind = "trace" if (folder / "selections.parquet").is_file() else "counts"
        if kind == "trace":
            params = _parse_params(fields, {"calib": str, "eval": str, "phase": str}, "trace")
            return real_routing.from_trace(specs, folder, params.get("calib"), params.get("eval"),
                                           params.get("phase"), seed)
        params = _parse_params(fields, {"calib": str, "eval": str, "concentration": float,
                                        "doc_concentration": float, "overlap_from": str}, "counts")
        return real_routing.from_counts(specs, folder, params.get("calib"), params.get("eval"),
                                        params.get("concentration"), params.get("doc_concentration"), seed,
                                        overlap_from=params.get("overlap_from"))
    path, _, fields = (rest if kind == "profile" else spec).partition(",")
    if Path(path).is_dir():
        params = _parse_params(fields, {"run": str, "workload_overlap": float}, "profile")
        if "run" in params and not Path(params["run"]).is_dir():
            raise NpuMoeError(f"routing {spec!r}: run={params['run']!r} is not a profile directory")
        if "run" in params and "workload_overlap" in params:
            raise NpuMoeError(f"routing {spec!r}: give run=DIR (replay another profile) or workload_overlap=W "
                              "(shift this one's hot set), not both")
        w, src = params.get("workload_overlap"), None
        if w is None and "run" not in params:
            d = defaults or load_defaults()
            w, src = None, d
        return from_profile(specs, path, params.get("run"), w, seed, src)
    if kind == "profile":
        raise NpuMoeError(f"routing {spec!r}: calibration profile folder {path} not found; give the --out folder of "
                          "`npumoe-lab calibrate`")
    raise NpuMoeError(f"routing {spec!r} is not a source: use synthetic:gini=0.6, profile:DIR (from `npumoe-lab "
                      "calibrate`), counts:NAME | trace:NAME (data/routing/, `npumoe-lab routing-import`), or tiny")
