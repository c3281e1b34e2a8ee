"""Defect checks of imported routing, each a one-line refusal naming the file and the defect, or a warning saying
exactly what was removed (when the defect can be removed exactly)."""
from __future__ import annotations

import numpy as np
import pandas as pd

from npumoe_lab.errors import NpuMoeError
from npumoe_lab.routing_data.schema import RoutingGeometry

REPEAT_MIN = 100            # a record repeated this many times in a row at a file's start is a warm-up artefact


def refuse(where, defect: str):
    raise NpuMoeError(f"{where}: {defect}")


def check_topk(where, topk: np.ndarray, geo: RoutingGeometry, layer=None) -> None:
    """topk [T, K] integer expert ids of one layer: ids in range, K = the geometry's, K distinct per token."""
    at = f" at layer {layer}" if layer is not None else ""
    if topk.ndim != 2:
        refuse(where, f"expected [tokens, top_k] expert ids{at}, got shape {topk.shape}")
    if topk.shape[1] != geo.top_k:
        refuse(where, f"top-k is {topk.shape[1]}{at} but {geo.name} routes top-{geo.top_k}; pass the geometry of "
                      "the model that made the trace")
    if topk.size and (topk.min() < 0 or topk.max() >= geo.n_experts):
        bad = int(topk.max()) if topk.max() >= geo.n_experts else int(topk.min())
        refuse(where, f"expert id {bad}{at} is outside 0..{geo.n_experts - 1} ({geo.name} has {geo.n_experts} "
                      "experts per layer)")
    s = np.sort(topk, axis=1)
    if topk.shape[1] > 1 and (s[:, 1:] == s[:, :-1]).any():
        refuse(where, f"a token routes to the same expert twice{at}; top-k experts must be distinct")


def check_layers(where, layers, geo: RoutingGeometry, partial: bool) -> None:
    """The data's layers are MoE layers of the geometry; all of them unless the source is known to be partial."""
    layers = sorted(set(int(x) for x in layers))
    alien = [x for x in layers if x not in geo.moe_layers]
    if alien:
        refuse(where, f"layer(s) {alien[:5]} are not MoE layers of {geo.name} (its MoE layers: "
                      f"{list(geo.moe_layers)[:3]}..{list(geo.moe_layers)[-1]})")
    missing = [x for x in geo.moe_layers if x not in layers]
    if missing and not partial:
        refuse(where, f"{len(missing)} MoE layer(s) missing (e.g. {missing[:5]}): the trace is incomplete "
                      "(truncated, or captured on part of the model)")


def check_not_constant(where, sel: pd.DataFrame) -> None:
    """Refuse a trace in which every token of every layer routes to the same experts (a capture bug)."""
    tokens = sel.groupby(["segment", "token", "layer"])["expert"].apply(lambda e: tuple(sorted(e)))
    if len(tokens) > 1 and tokens.groupby(level="layer").nunique().max() == 1:
        refuse(where, f"every row routes to the same experts {tokens.iloc[0]} ({len(tokens)} token-layers): "
                      "not a routing trace (a warm-up or capture bug)")


def check_counts(where, counts: pd.DataFrame, geo: RoutingGeometry, partial: bool) -> None:
    if counts.empty:
        refuse(where, "no routed tokens")
    if (counts["count"] < 0).any():
        refuse(where, "negative expert counts")
    e = counts["expert"]
    if e.min() < 0 or e.max() >= geo.n_experts:
        refuse(where, f"expert id {int(e.max() if e.max() >= geo.n_experts else e.min())} is outside "
                      f"0..{geo.n_experts - 1} ({geo.name} has {geo.n_experts} experts per layer)")
    check_layers(where, counts["layer"], geo, partial)
    per_layer = counts[counts["count"] > 0].groupby("layer")["expert"].nunique()
    if len(per_layer) > 1 and (per_layer <= geo.top_k).all():
        refuse(where, f"every layer routes all tokens to the same {geo.top_k} experts: not a routing trace")


def drop_leading_repeats(where, records: list, key) -> tuple[list, list]:
    """Remove a run of >= REPEAT_MIN identical records at the start (warm-up records repeated by a logger);
    (kept records, warnings)."""
    if len(records) < REPEAT_MIN:
        return records, []
    first, n = key(records[0]), 1
    while n < len(records) and key(records[n]) == first:
        n += 1
    if n < REPEAT_MIN:
        return records, []
    if n == len(records):
        refuse(where, f"all {n} records repeat one expert selection: nothing but warm-up")
    return records[n:], [f"{where}: removed the first {n} rows, one warm-up expert selection {first} repeated {n} "
                          "times"]


__all__ = ["refuse", "check_topk", "check_layers", "check_not_constant", "check_counts", "drop_leading_repeats"]
