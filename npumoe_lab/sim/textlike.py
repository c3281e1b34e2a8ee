"""Routing that varies like text: the per-document and per-chunk variation of expert popularity, the hot-set shift
between workloads, and the measured defaults of both (data/routing/tiny-defaults.yaml, from `npumoe-lab
routing-stats`).

Model (sim/routing.py samples it): a document's popularity q ~ Dirichlet(doc_concentration * E * p) around its
workload's popularity p, each chunk's r ~ Dirichlet(concentration * E * q) around q, and each token picks K distinct
experts ~ r (Gumbel top-k). A concentration is per expert: an expert of average popularity gets Dirichlet parameter
`concentration`, so the same value means the same relative spread at any expert count; inf = no variation at that
level. Workloads: every named workload (WORKLOAD_NAMES) has its own hot set, a fraction
`workload_overlap` of the shared rank -> expert map kept and the rest permuted; a mix averages its members. The
measured default is the overlap of routing mass, 1 - TV(calibration mix, workload) (`workload_tv_overlap`), and each
geometry solves the workload_overlap that gives it at its own popularity curve (routing.overlap_for_tv).

Statistics (what the fits match; the same functions measure a real profile and a sampled one):
- dispersion(counts [E, chunks]) = sum over experts of the variance of the per-chunk counts / sum of their means
  (about 1 for independent tokens, larger when chunks are bursty);
- tv_overlap(p, q) = sum_e min(p_e, q_e) = 1 - total variation distance between two popularities.
"""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import yaml

from npumoe_lab.errors import NpuMoeError
from npumoe_lab.utils import REPO_ROOT
from npumoe_lab.workloads.texts import DOMAINS

ROUTING_DIR = REPO_ROOT / "data" / "routing"
DEFAULTS_FILE = ROUTING_DIR / "tiny-defaults.yaml"
# the workloads a synthetic mix can name ("mixed" = all of them): the bundled text domains and the workloads that
# run offline (their prompts: few-shot classification, RULER-style retrieval, held-out LM text)
WORKLOAD_NAMES = (*DOMAINS, "fewshot-cls", "ruler-multikey", "ruler-vt", "lm-heldout")
DEFAULT_FIELDS = ("concentration", "doc_concentration", "workload_tv_overlap", "calibration", "workload")


def dirichlet(p: np.ndarray, concentration: float | None, rng: np.random.Generator) -> np.ndarray:
    """A popularity drawn around `p` (Dirichlet(concentration * E * p)); `p` itself for None or inf."""
    p = np.asarray(p, dtype=np.float64)
    if concentration is None or math.isinf(concentration):
        return p
    g = rng.gamma(np.maximum(concentration * len(p) * p, 1e-12))
    s = g.sum()
    return g / s if s > 0 else p


def dispersion(counts) -> float:
    """Pooled index of dispersion of per-chunk counts [E, chunks]: sum_e var_c / sum_e mean_c."""
    c = np.asarray(counts, dtype=np.float64)
    if c.ndim != 2 or c.shape[1] < 2:
        raise NpuMoeError(f"dispersion needs counts [experts, chunks] over at least 2 chunks, got {c.shape}")
    mean = c.mean(1).sum()
    return float(c.var(1, ddof=1).sum() / mean) if mean > 0 else 0.0


def tv_overlap(p, q) -> float:
    p, q = np.asarray(p, dtype=np.float64), np.asarray(q, dtype=np.float64)
    return float(np.minimum(p / p.sum(), q / q.sum()).sum())


def mix_names(text: str, field: str) -> tuple[str, ...]:
    """'mixed' | 'code' | 'code+drama' -> workload names, each checked."""
    names = WORKLOAD_NAMES if text == "mixed" else tuple(n.strip() for n in text.split("+"))
    bad = [n for n in names if n not in WORKLOAD_NAMES]
    if bad or not names:
        raise NpuMoeError(f"routing {field}={text!r} names unknown workload(s) {bad or [text]}; use 'mixed' or "
                          f"'+'-joined names of {', '.join(WORKLOAD_NAMES)}")
    if len(set(names)) != len(names):
        raise NpuMoeError(f"routing {field}={text!r} names a workload twice; give each once")
    return names


def check_concentration(name: str, value) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value) or value <= 0:
        raise NpuMoeError(f"routing {name}={value!r} must be a Dirichlet concentration > 0 (inf = no variation); "
                          f"e.g. {name}=4")
    return float(value)


def load_defaults(path=DEFAULTS_FILE) -> dict:
    """The measured routing defaults: {field: value} for DEFAULT_FIELDS plus 'source' (where they come from)."""
    p = Path(path)
    if not p.is_file():
        raise NpuMoeError(f"no routing defaults at {p}; derive them with `npumoe-lab routing-stats --model tiny "
                          f"--out {p}`")
    raw = yaml.safe_load(p.read_text())
    d = (raw or {}).get("defaults") if isinstance(raw, dict) else None
    missing = [k for k in DEFAULT_FIELDS if not isinstance(d, dict) or k not in d]
    if missing:
        raise NpuMoeError(f"{p} lacks defaults {missing}; regenerate it with `npumoe-lab routing-stats`")
    out = {k: d[k]["value"] if isinstance(d[k], dict) else d[k] for k in DEFAULT_FIELDS}
    for k in ("concentration", "doc_concentration"):
        out[k] = check_concentration(k, float(out[k]))
    out["source"] = f"{p.relative_to(REPO_ROOT) if p.is_relative_to(REPO_ROOT) else p} ({raw.get('source', '?')})"
    return out


__all__ = ["dirichlet", "dispersion", "tv_overlap", "mix_names", "load_defaults", "DEFAULTS_FILE"]
