"""A built plan's hash from JSON pieces encoded once, not from the whole plan encoded again.

A plan's hash is the SHA-256 of its canonical JSON (`utils.sha256_json`: sorted keys, no whitespace). A sweep
builds thousands of plans whose layers repeat the same capacities, tiers and groups and differ only in which
groups are resident; encoding each whole plan again was 8 % of a cold sweep's profile samples. `build_plan`
encodes a layer's shared part once (`LayerPieces`, kept with the plan parts it is made of) and joins the pieces;
the text is the one `utils.canonical_json` gives for the whole body, character for character
(tests/planning/test_plan_json.py holds the two equal on every variant, residency rule and budget), so stored
hashes keep their values. A plan made any other way (loaded, edited, made by hand) is hashed from its whole body.
"""
from __future__ import annotations

import hashlib

from npumoe_lab.utils import canonical_json as canonical

# a layer's keys in canonical (sorted) order; build_plan writes exactly these
LAYER_KEYS = ("capacity", "expected_drop_rate", "expected_padding", "groups", "hidden", "hot_threshold",
              "intermediate", "layer", "n_experts", "notes", "tier", "tier_capacities", "top_k")


_RESIDENT = ('"resident":false', '"resident":true')
_THRESHOLD = '"hot_threshold":'


class LayerPieces:
    """One layer's canonical JSON around its two per-plan parts (each group's resident flag, the hot threshold):
    the layer encoded once with every group cold and no threshold, cut where those values stand (a key's quotes
    are never escaped, so '"resident":' and '"hot_threshold":' stand only where those keys do)."""

    def __init__(self, lp: dict):
        """`lp`: a layer dict of build_plan (its groups' resident flags and hot_threshold are not read)."""
        if tuple(sorted(lp)) != LAYER_KEYS:
            raise ValueError(f"a plan layer has the keys {sorted(lp)}, not {LAYER_KEYS}")
        text = canonical({**lp, "hot_threshold": None, "groups": [{**g, "resident": False} for g in lp["groups"]]})
        before, *after = text.split(_THRESHOLD + "null")
        self.pieces = before.split(_RESIDENT[0])
        if len(after) != 1 or len(self.pieces) != len(lp["groups"]) + 1 or _RESIDENT[1] in text:
            raise ValueError("a plan layer's text does not cut at its groups' resident flags and hot threshold")
        self.after = after[0]

    def text(self, resident, hot_threshold) -> str:
        """The layer's canonical JSON with these resident flags (one per group, bools) and hot threshold."""
        pieces = self.pieces
        out = [pieces[0]]
        for r, piece in zip(resident, pieces[1:]):
            out += (_RESIDENT[1 if r else 0], piece)
        thr = "null" if hot_threshold is None else canonical(hot_threshold)
        return "".join(out) + _THRESHOLD + thr + self.after


def plan_digest(head: dict, layer_texts: list[str]) -> str:
    """sha256_json of a plan body: `head` its keys but "layers" (each a JSON value), `layer_texts` the layers'."""
    parts = []
    for key in sorted([*head, "layers"]):
        value = "[" + ",".join(layer_texts) + "]" if key == "layers" else canonical(head[key])
        parts.append(canonical(key) + ":" + value)
    return hashlib.sha256(("{" + ",".join(parts) + "}").encode()).hexdigest()


__all__ = ["LayerPieces", "plan_digest", "LAYER_KEYS"]
