"""The routing-trace schema: what `npumoe-lab routing-import` writes to data/routing/NAME/ and the routing sources
read.

A routing folder holds
- `selections.parquet` (per-token traces only): one row per token, layer and rank: `layer`, `token` (position in
  its segment), `segment` (document / request / problem id, a string), `domain`, `phase` (prefill|decode), `rank`
  (0 = the expert of highest weight), `expert`, `weight` (NaN where the tool does not record it);
- `counts.parquet` (always): per layer, expert, domain and phase: `count` (tokens whose top-k holds the expert) and
  `tokens` (tokens routed at that layer, domain and phase; sum of `count` = top_k * tokens). For a trace it is
  computed from the selections, for a counts-only source it is the source's own counts;
- `provenance.json`: the model, tool and version, text, quantisation, phase, licence and address of the source, the
  geometry it was checked against (`moe_layers`, `n_experts`, `top_k`), `kind` (trace|counts), what the data can
  and cannot say (`notes`) and what the import removed (`warnings`).
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from npumoe_lab.errors import NpuMoeError

SELECTION_COLUMNS = ("layer", "token", "segment", "domain", "phase", "rank", "expert", "weight")
COUNT_COLUMNS = ("layer", "expert", "domain", "phase", "count", "tokens")
PHASES = ("prefill", "decode", "mixed")
PROVENANCE_KEYS = ("model", "tool", "tool_version", "text", "quantisation", "phase", "licence", "source")


@dataclass(frozen=True)
class RoutingGeometry:
    """What a routing file is checked against: the MoE layer indices, experts per layer and experts per token."""
    name: str
    moe_layers: tuple
    n_experts: int
    top_k: int
    norm_topk_prob: bool = True                  # top-k weights renormalised to sum 1 (router-logit imports)


@dataclass
class RoutingData:
    kind: str                                    # "trace" (per-token selections) or "counts"
    counts: pd.DataFrame
    provenance: dict
    selections: pd.DataFrame | None = None
    warnings: list = field(default_factory=list)

    @property
    def layers(self) -> list[int]:
        return sorted(int(x) for x in self.counts["layer"].unique())

    @property
    def domains(self) -> list[str]:
        return sorted(str(x) for x in self.counts["domain"].unique())

    def count_vector(self, layer: int, domains=None, n_experts: int | None = None) -> np.ndarray:
        """[E] per-expert counts of `layer` summed over `domains` (None: all)."""
        c = self.counts[self.counts["layer"] == layer]
        if domains is not None:
            c = c[c["domain"].isin(list(domains))]
        E = n_experts or int(self.provenance["geometry"]["n_experts"])
        out = np.zeros(E, dtype=np.float64)
        np.add.at(out, c["expert"].to_numpy(dtype=np.int64), c["count"].to_numpy(dtype=np.float64))
        return out

    def save(self, out) -> Path:
        """Write the folder: into a hidden sibling first, renamed into place at the end (a failure leaves none)."""
        out = Path(out)
        if out.exists() and any(out.iterdir()):
            raise NpuMoeError(f"{out} exists and is not empty; choose a new --out (imports never overwrite)")
        tmp = out.parent / f".{out.name}.importing"
        if tmp.exists():
            for p in tmp.iterdir():
                p.unlink()
        tmp.mkdir(parents=True, exist_ok=True)
        self.counts.loc[:, list(COUNT_COLUMNS)].to_parquet(tmp / "counts.parquet", index=False)
        if self.selections is not None:
            self.selections.loc[:, list(SELECTION_COLUMNS)].to_parquet(tmp / "selections.parquet", index=False)
        prov = dict(self.provenance, kind=self.kind, warnings=list(self.warnings))
        (tmp / "provenance.json").write_text(json.dumps(prov, indent=2, default=_jsonable) + "\n")
        if out.exists():
            out.rmdir()
        tmp.rename(out)
        return out

    @staticmethod
    def load(path) -> "RoutingData":
        p = Path(path)
        if not (p / "provenance.json").is_file() or not (p / "counts.parquet").is_file():
            raise NpuMoeError(f"{p} is not a routing folder (no provenance.json / counts.parquet); make one with "
                              "`npumoe-lab routing-import`")
        prov = json.loads((p / "provenance.json").read_text())
        counts = pd.read_parquet(p / "counts.parquet")
        sel = pd.read_parquet(p / "selections.parquet") if (p / "selections.parquet").is_file() else None
        missing = set(COUNT_COLUMNS) - set(counts.columns)
        if missing:
            raise NpuMoeError(f"{p}/counts.parquet lacks columns {sorted(missing)}; re-import it")
        return RoutingData(prov.get("kind", "trace" if sel is not None else "counts"), counts, prov, sel,
                           list(prov.get("warnings", [])))


def _jsonable(x):
    if isinstance(x, (np.integer,)):
        return int(x)
    if isinstance(x, (np.floating,)):
        return float(x)
    if isinstance(x, (tuple, set)):
        return list(x)
    raise TypeError(f"not JSON-serialisable: {type(x)}")


def selections_frame(layer, token, segment, domain, phase, rank, expert, weight=None) -> pd.DataFrame:
    """The selections frame from equal-length columns (scalars broadcast)."""
    n = len(expert)
    full = lambda v, dt: np.full(n, v, dtype=dt) if np.ndim(v) == 0 else np.asarray(v, dtype=dt)  # noqa: E731
    return pd.DataFrame({"layer": full(layer, np.int32), "token": full(token, np.int64),
                         "segment": full(segment, object).astype(str), "domain": full(domain, object).astype(str),
                         "phase": full(phase, object).astype(str), "rank": full(rank, np.int16),
                         "expert": full(expert, np.int64),
                         "weight": full(math.nan if weight is None else weight, np.float32)})


def counts_from_selections(sel: pd.DataFrame) -> pd.DataFrame:
    """Per (layer, expert, domain, phase) counts and the tokens routed per (layer, domain, phase)."""
    c = sel.groupby(["layer", "expert", "domain", "phase"], as_index=False).size().rename(columns={"size": "count"})
    tok = sel[sel["rank"] == 0].groupby(["layer", "domain", "phase"], as_index=False).size() \
        .rename(columns={"size": "tokens"})
    return c.merge(tok, on=["layer", "domain", "phase"], how="left").astype({"count": np.int64, "tokens": np.int64})


def counts_frame(rows) -> pd.DataFrame:
    """Counts frame from (layer, expert, domain, phase, count, tokens) tuples (zero counts dropped)."""
    df = pd.DataFrame(list(rows), columns=list(COUNT_COLUMNS))
    df = df[df["count"] > 0].reset_index(drop=True)
    return df.astype({"layer": np.int32, "expert": np.int64, "count": np.int64, "tokens": np.int64})


__all__ = ["RoutingData", "RoutingGeometry", "selections_frame", "counts_from_selections", "counts_frame"]
