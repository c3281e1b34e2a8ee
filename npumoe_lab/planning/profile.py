"""CalibrationProfile: per (layer, expert, chunk) routing counts, per-expert saliency statistics and the
co-routing matrix of a calibration run (execution/calibrate.py makes one); what planning reads."""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from npumoe_lab.errors import NpuMoeError

COUNT_COLUMNS = ("layer", "expert", "chunk_id", "count")
STAT_COLUMNS = ("layer", "expert", "count", "weight_sum", "weight_sq_sum", "norm_sum")
COACT_COLUMNS = ("layer", "expert_a", "expert_b", "count")   # a < b, tokens routed to both




@dataclass
class CalibrationProfile:
    counts: pd.DataFrame            # every (layer, expert, chunk_id), zeros included
    stats: pd.DataFrame
    meta: dict
    coactivation: pd.DataFrame | None = None

    def __post_init__(self):
        self._matrices: dict[int, np.ndarray] = {}     # count_matrix cache (reports call it repeatedly)
        for name, cols in (("counts", COUNT_COLUMNS), ("stats", STAT_COLUMNS)):
            missing = set(cols) - set(getattr(self, name).columns)
            if missing:
                raise NpuMoeError(f"calibration {name} lacks columns {sorted(missing)}; recreate the profile with "
                                  "`npumoe-lab calibrate`")
        if (self.counts["count"] < 0).any():
            raise NpuMoeError("calibration counts must be >= 0; the profile is corrupt, recreate it")
        for key in ("chunk", "model_fingerprint"):
            if key not in self.meta:
                raise NpuMoeError(f"calibration meta lacks {key!r}; recreate the profile with `npumoe-lab calibrate`")

    # -- shape -------------------------------------------------------------------------------------------
    @property
    def layers(self) -> list[int]:
        if "_layers" not in self.__dict__:     # read per MoE layer by planning: the column's unique values once
            self.__dict__["_layers"] = sorted(int(x) for x in self.counts["layer"].unique())
        return list(self.__dict__["_layers"])

    @property
    def chunk(self) -> int:
        return int(self.meta["chunk"])

    @property
    def n_chunks(self) -> int:
        return int(self.counts["chunk_id"].nunique())

    def _layer(self, df: pd.DataFrame, layer: int) -> pd.DataFrame:
        sub = df[df["layer"] == layer]
        if sub.empty:
            raise NpuMoeError(f"layer {layer} is not in the calibration profile; its layers are {self.layers}")
        return sub

    def n_experts(self, layer: int) -> int:
        return int(self._layer(self.counts, layer)["expert"].max()) + 1

    def count_matrix(self, layer: int) -> np.ndarray:
        """Per-chunk routed counts [E, n_chunks] (chunks in id order)."""
        if layer in self._matrices:
            return self._matrices[layer].copy()
        sub = self._layer(self.counts, layer)
        m = sub.pivot_table(index="expert", columns="chunk_id", values="count", aggfunc="sum", fill_value=0)
        m = m.reindex(index=range(self.n_experts(layer)), columns=sorted(self.counts["chunk_id"].unique()),
                      fill_value=0)
        self._matrices[layer] = m.to_numpy(dtype=np.int64)
        return self._matrices[layer].copy()

    def coactivation_matrix(self, layer: int) -> np.ndarray | None:
        """Tokens routed to both e and f [E, E] (symmetric, zero diagonal); None if not recorded."""
        if self.coactivation is None:
            return None
        E = self.n_experts(layer)
        m = np.zeros((E, E), dtype=np.int64)
        sub = self.coactivation[self.coactivation["layer"] == layer]
        m[sub["expert_a"].to_numpy(), sub["expert_b"].to_numpy()] = sub["count"].to_numpy()
        return m + m.T

    # -- reports -----------------------------------------------------------------------------------------
    def load_share(self, layer: int) -> np.ndarray:
        """Share of the layer's routed assignments that went to each expert [E]."""
        tot = self.count_matrix(layer).sum(axis=1).astype(float)
        return tot / tot.sum() if tot.sum() else tot

    def gini(self, layer: int) -> float:
        """Gini coefficient of the experts' total loads (0 = balanced, -> 1 = one expert takes all)."""
        x = np.sort(self.count_matrix(layer).sum(axis=1).astype(float))
        n = len(x)
        if x.sum() == 0:
            return 0.0
        return float(((2 * np.arange(1, n + 1) - n - 1) * x).sum() / (n * x.sum()))

    def experts_covering(self, layer: int, frac: float) -> int:
        """Fewest experts (hottest first) that receive at least `frac` of the layer's assignments."""
        if not 0 < frac <= 1:
            raise NpuMoeError(f"frac must be in (0, 1], got {frac}")
        share = np.sort(self.load_share(layer))[::-1]
        return int(np.searchsorted(np.cumsum(share), frac - 1e-12) + 1)

    def hot_experts(self, layer: int, k: int) -> set[int]:
        tot = self.count_matrix(layer).sum(axis=1)
        return set(sorted(range(len(tot)), key=lambda e: (-tot[e], e))[:k])

    def hot_set_jaccard(self, other: "CalibrationProfile", k: int) -> pd.Series:
        """Per common layer: Jaccard similarity of the top-k hottest experts here and in `other`."""
        if not isinstance(k, int) or k < 1:
            raise NpuMoeError(f"k must be an int >= 1 (the number of hot experts to compare), got {k!r}")
        common = sorted(set(self.layers) & set(other.layers))
        if not common:
            raise NpuMoeError("the two profiles share no layer; compare profiles of the same model")
        out = {}
        for layer in common:
            a, b = self.hot_experts(layer, k), other.hot_experts(layer, k)
            out[layer] = len(a & b) / len(a | b)
        return pd.Series(out, name=f"jaccard_top{k}").rename_axis("layer")

    def summary(self) -> pd.DataFrame:
        rows = []
        for layer in self.layers:
            m = self.count_matrix(layer)
            rows.append({"layer": layer, "n_experts": m.shape[0], "routed": int(m.sum()),
                         "top1_share": float(self.load_share(layer).max()), "gini": self.gini(layer),
                         "experts_50": self.experts_covering(layer, 0.5),
                         "experts_80": self.experts_covering(layer, 0.8),
                         "p90_chunk_load_max": float(np.percentile(m, 90, axis=1).max()),
                         "max_chunk_load": int(m.max())})
        return pd.DataFrame(rows)

    # -- files -------------------------------------------------------------------------------------------
    def save(self, directory) -> Path:
        d = Path(directory)
        d.mkdir(parents=True, exist_ok=True)
        self.counts.to_parquet(d / "counts.parquet", index=False)
        self.stats.to_parquet(d / "stats.parquet", index=False)
        if self.coactivation is not None:
            self.coactivation.to_parquet(d / "coactivation.parquet", index=False)
        tmp = d / "profile.json.tmp"
        tmp.write_text(json.dumps(self.meta, indent=2, sort_keys=True, default=str))
        tmp.replace(d / "profile.json")   # profile.json last: its presence marks a complete profile
        return d

    @classmethod
    def load(cls, directory) -> "CalibrationProfile":
        d = Path(directory)
        if not (d / "profile.json").is_file():
            raise NpuMoeError(f"{d} is not a calibration profile (no profile.json); create one with "
                              "`npumoe-lab calibrate --out DIR`")
        coact = d / "coactivation.parquet"
        return cls(pd.read_parquet(d / "counts.parquet"), pd.read_parquet(d / "stats.parquet"),
                   json.loads((d / "profile.json").read_text()), pd.read_parquet(coact) if coact.exists() else None)
