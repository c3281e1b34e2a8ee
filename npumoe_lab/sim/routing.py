"""Routing sources for simulation: where a simulated prefill's expert choices come from.

- `profile:DIR` (or a directory): a calibration profile from `npumoe-lab calibrate` (e.g. run on a Mac with the
  real checkpoint); the popularity per layer is its routed share per expert.
- `synthetic:gini=G|zipf=S[,layer_overlap=L][,workload_overlap=W][,seed=N]`: per-layer popularity ~ (rank+1)^-s,
  s solved so that the *sampled* per-expert counts reach Gini G; hot sets shared between layers (L: fraction of the
  rank->expert map kept from the previous layer; 0 = independent) and between the calibration and the run workload
  (W: 1 = the same distribution, lower = drift).
- `tiny` : the bundled model's calibrated popularity (4 layers) stretched to E experts, layer l taking tiny layer
  l mod 4 (what bench/ samples its routing from).
- recorded routing (Python only, `RecordedRouting`): per chunk and layer, the exact choices a real run made.

Per chunk, routing is sampled token by token: K distinct experts per token drawn in proportion to the popularity
(Gumbel top-k), so drop and padding rates are real consequences of a plan's capacities against each chunk's counts.
Synthetic routing carries no hidden-state norms (norms = 1: saliency reduces to the router weight).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from npumoe_lab.planning.profile import CalibrationProfile
from npumoe_lab.errors import NpuMoeError
from npumoe_lab.models import load_model

CALIBRATION_TOKENS = 8192        # sampled calibration tokens when a source has no per-chunk counts at this chunk
MIN_CALIBRATION_CHUNKS = 8


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


def sample_routing(shares, T: int, K: int, rng: np.random.Generator, perm=None):
    """(top_k_index [T, K] int64, top_k_weights [T, K] float32): K distinct experts per token drawn ~ shares
    (Gumbel top-k = sampling without replacement in proportion to the shares), weights = softmax over the drawn
    scores (renormalised top-k, as Qwen3 routes), highest first. `perm[r]` = the expert id of share rank r, so hot
    experts are not simply the lowest ids. NumPy: thousands of small draws per simulation, no thread-pool cost."""
    logp = np.log(np.maximum(np.asarray(shares, dtype=np.float64), 1e-30)).astype(np.float32)
    if perm is not None:
        logp = logp[np.argsort(perm)]
    u = rng.random((T, len(logp)), dtype=np.float32)
    scores = logp - np.log(-np.log(np.maximum(u, np.float32(1e-30))))     # + Gumbel(0, 1) noise
    idx = np.argpartition(-scores, K - 1, axis=1)[:, :K]
    v = np.take_along_axis(scores, idx, 1)
    order = np.argsort(-v, axis=1, kind="stable")
    idx, v = np.take_along_axis(idx, order, 1), np.take_along_axis(v, order, 1)
    w = np.exp(v - v[:, :1])
    return torch.from_numpy(idx.astype(np.int64)), torch.from_numpy((w / w.sum(1, keepdims=True)).astype(np.float32))


def sampled_gini(shares, K: int, tokens: int = 4096, seed: int = 0) -> float:
    idx, _ = sample_routing(shares, tokens, K, np.random.default_rng(seed))
    return gini(np.bincount(idx.reshape(-1).numpy(), minlength=len(shares)))


def zipf_shares(E: int, s: float) -> np.ndarray:
    p = (np.arange(E) + 1.0) ** -s
    return p / p.sum()


def zipf_for_gini(E: int, K: int, target: float, seed: int = 0) -> float:
    """Zipf exponent whose sampled counts (K distinct experts per token) have Gini `target` (bisection)."""
    hi_gini = sampled_gini(zipf_shares(E, 12.0), K, seed=seed)
    if not 0 < target < 1:
        raise NpuMoeError(f"gini={target} is outside (0, 1); give e.g. synthetic:gini=0.6")
    if target >= hi_gini:
        raise NpuMoeError(f"gini={target} cannot be reached with {E} experts and top-{K} (K distinct experts per "
                          f"token cap it at about {hi_gini:.2f}); give a smaller gini")
    lo, hi = 0.0, 12.0
    for _ in range(30):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if sampled_gini(zipf_shares(E, mid), K, seed=seed) < target else (lo, mid)
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
    _gini: dict = field(default_factory=dict, repr=False)       # layer -> Gini of the last sampled run's counts
    _profiles: dict = field(default_factory=dict, repr=False)   # (chunk, seed) -> sampled calibration profile
    _sampled: dict = field(default_factory=dict, repr=False)    # last run draws: (generator, chunks, counts)
    _calib_draws: dict = field(default_factory=dict, repr=False)   # (tokens, seed) -> [idx per layer]

    def gini(self) -> float:
        """Mean over layers of the Gini of the run's sampled per-expert counts (what the simulation sees); before
        any run is sampled, of a 4096-token sample of each layer."""
        if not self._gini:
            return float(np.mean([sampled_gini(p, self.top_k, seed=0) for p in self.run.values()])) if self.run else 0.0
        return float(np.mean([self._gini[layer] for layer in sorted(self._gini)]))

    def chunks(self, specs, prompt_len: int, chunk: int, seed: int = 0):
        """[chunk index] -> {layer: (top_k_index [chunk, K], top_k_weights [chunk, K], norms [chunk])}.
        Chunks are drawn in order from one generator, so a shorter prompt's chunks are a longer one's first chunks:
        the last draw is kept and extended (a grid of prompt lengths samples the longest once)."""
        key = (tuple(s.layer for s in specs), chunk, seed)
        kept = self._sampled.get(key)
        if kept is None:
            if len(self._sampled) >= 4:          # the last few draws (one per chunk size of a grid), bounded
                self._sampled.pop(next(iter(self._sampled)))
            kept = self._sampled[key] = (np.random.default_rng(seed + 1), [], [])
        g, out, per_chunk = kept
        while len(out) < math.ceil(prompt_len / chunk):
            per_layer, counts = {}, {}
            for s in specs:
                idx, w = sample_routing(self.run[s.layer], chunk, s.top_k, g)
                per_layer[s.layer] = (idx, w, torch.ones(chunk))
                counts[s.layer] = np.bincount(idx.reshape(-1).numpy(), minlength=s.n_experts)
            out.append(per_layer)
            per_chunk.append(counts)
        n = math.ceil(prompt_len / chunk)
        self._gini = {s.layer: gini(np.sum([c[s.layer] for c in per_chunk[:n]], axis=0, dtype=float))
                      for s in specs}
        return out[:n]

    def calibration_profile(self, specs, chunk: int, seed: int = 0) -> CalibrationProfile:
        """The profile plans are built from: the real one at its own chunk, else chunks sampled from the
        calibration popularity (the plan sees per-chunk fluctuation as a real calibration would)."""
        if self.profile is not None and self.profile.chunk == chunk:
            return self.profile
        if (chunk, seed) in self._profiles:
            return self._profiles[(chunk, seed)]
        g = np.random.default_rng(seed)
        rows, matrices = [], {}
        n_chunks = max(MIN_CALIBRATION_CHUNKS, CALIBRATION_TOKENS // chunk)
        # the same token count from the same seed draws the same tokens: chunk sizes of 256..1024 share one draw
        dkey = (tuple(s.layer for s in specs), chunk * n_chunks, seed)
        draws = self._calib_draws.get(dkey)
        if draws is None:                   # only the last draw is kept (a sweep over seeds stays bounded)
            self._calib_draws = {}
            draws = self._calib_draws[dkey] = [sample_routing(self.calibration[s.layer], chunk * n_chunks, s.top_k,
                                                              g)[0].numpy() for s in specs]
        for s, idx in zip(specs, draws):
            chunk_of = np.repeat(np.arange(n_chunks), chunk * s.top_k)
            m = np.bincount(idx.reshape(-1) * n_chunks + chunk_of, minlength=s.n_experts * n_chunks)
            m = m.reshape(s.n_experts, n_chunks).astype(np.int64)
            matrices[s.layer] = m
            rows.append(pd.DataFrame({"layer": s.layer, "expert": np.repeat(np.arange(s.n_experts), m.shape[1]),
                                      "chunk_id": np.tile(np.arange(m.shape[1]), s.n_experts),
                                      "count": m.reshape(-1)}))
        counts = pd.concat(rows, ignore_index=True)
        stats = counts.groupby(["layer", "expert"], as_index=False)["count"].sum()
        stats = stats.assign(weight_sum=0.0, weight_sq_sum=0.0, norm_sum=0.0)
        meta = {"model_fingerprint": "simulated", "model": "simulated", "workload": self.label, "chunk": chunk,
                "n_tokens": chunk * n_chunks, "n_chunks": n_chunks, "seed": seed,
                "layers": [dict(vars(s)) for s in specs], "created": "simulated"}
        profile = CalibrationProfile(counts, stats, meta, None)
        profile._matrices.update(matrices)     # the [E, chunks] matrices planning reads, without re-pivoting
        self._profiles[(chunk, seed)] = profile
        return profile


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


def _parse_params(text: str, allowed: dict) -> dict:
    out = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        key, _, value = part.partition("=")
        if key in out:
            raise NpuMoeError(f"synthetic routing parameter {key} is given twice ({text!r}); give it once")
        if key not in allowed or not value:
            raise NpuMoeError(f"synthetic routing parameter {part!r} is unknown; use {', '.join(allowed)} as "
                              "key=value (e.g. synthetic:gini=0.6,layer_overlap=0.5)")
        try:
            out[key] = allowed[key](value)
        except ValueError:
            raise NpuMoeError(f"synthetic routing parameter {key}={value!r} is not a number") from None
    return out


def synthetic(specs, gini: float | None = None, zipf: float | None = None, layer_overlap: float = 0.0,
              workload_overlap: float = 1.0, seed: int = 0) -> PopularityRouting:
    if (gini is None) == (zipf is None):
        raise NpuMoeError("synthetic routing needs exactly one of gini=G (0 < G < 1) or zipf=S (S >= 0)")
    for name, v in (("layer_overlap", layer_overlap), ("workload_overlap", workload_overlap)):
        if not 0 <= v <= 1:
            raise NpuMoeError(f"{name}={v} is outside [0, 1]")
    if zipf is not None and zipf < 0:
        raise NpuMoeError(f"zipf={zipf} must be >= 0")
    rng = np.random.default_rng(seed)
    E, K = specs[0].n_experts, specs[0].top_k
    s = zipf if zipf is not None else zipf_for_gini(E, K, gini, seed)
    base = zipf_shares(E, s)
    calib, run, perm = {}, {}, rng.permutation(E)
    for sp in specs:
        perm = _reshuffle(perm, layer_overlap, rng) if calib else perm
        calib[sp.layer] = base[np.argsort(perm)]            # expert perm[r] has rank r
        drifted = _reshuffle(perm, workload_overlap, rng)
        run[sp.layer] = base[np.argsort(drifted)]
    what = f"gini={gini:g} (zipf {s:.3f})" if gini is not None else f"zipf={s:g}"
    return PopularityRouting(f"synthetic:{what},layer_overlap={layer_overlap:g},workload_overlap="
                             f"{workload_overlap:g},seed={seed}", calib, run, top_k=K)


def from_profile(specs, path) -> PopularityRouting:
    profile = CalibrationProfile.load(path)
    _check_profile(profile, specs, f"profile {path}")
    shares = {s.layer: _shares(profile, s.layer) for s in specs}
    return PopularityRouting(f"profile:{Path(path).name} ({profile.meta.get('model')}, "
                             f"{profile.meta.get('workload')}, {profile.meta.get('n_tokens')} tokens)",
                             shares, shares, profile=profile, top_k=specs[0].top_k)


def stretched_tiny(specs, seed: int = 0) -> PopularityRouting:
    """The bundled model's calibrated popularity (mixed text, chunk 256, 4096 tokens) stretched to E experts."""
    from npumoe_lab.execution.calibrate import calibration_profile  # lazy: loads the bundled model only for this source
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


def parse_routing(spec, specs, seed: int = 0):
    """A routing source from its spec string (module docstring), checked against the geometry's layer specs."""
    if not isinstance(spec, str):
        return spec                                       # already a source object (e.g. RecordedRouting)
    kind, _, rest = spec.partition(":")
    if kind == "synthetic":
        params = _parse_params(rest, {"gini": float, "zipf": float, "layer_overlap": float,
                                      "workload_overlap": float, "seed": int})
        return synthetic(specs, **{"seed": seed, **params})
    if kind == "tiny":
        return stretched_tiny(specs, seed)
    path = rest if kind == "profile" else spec
    if Path(path).is_dir():
        return from_profile(specs, path)
    if kind == "profile":
        raise NpuMoeError(f"routing {spec!r}: calibration profile folder {path} not found; give the --out folder of "
                          "`npumoe-lab calibrate`")
    raise NpuMoeError(f"routing {spec!r} is not a source: use synthetic:gini=0.6, profile:DIR (from `npumoe-lab "
                      "calibrate`), or tiny")
