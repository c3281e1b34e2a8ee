"""Variants that are another variant in disguise: an `npumoe` plan whose residency leaves no expert group on the NPU
runs exactly `anemll`'s experts ("npumoe = anemll here"), and an ablation step whose TTFT equals an earlier step's
adds nothing of its own. Reports (sim/report.py, the demo's SUMMARY, paper-check) and figures name them instead of
reporting a speedup."""
from __future__ import annotations

import math

import pandas as pd

from npumoe_lab.planning.variants import ABLATION

SETTING = ["model", "platform", "prompt_len", "chunk"]
REL = 1e-9


def _keys(df: pd.DataFrame) -> list[str]:
    return [k for k in SETTING if k in df.columns]


def no_npu(df: pd.DataFrame, variant: str = "npumoe") -> pd.DataFrame:
    """The settings (model, platform, prompt, chunk) where `variant`'s plan put no expert group on the NPU."""
    if "n_npu_groups" not in df.columns:
        return pd.DataFrame(columns=_keys(df))
    sub = df[(df.variant == variant) & (df.n_npu_groups.fillna(1) == 0)]
    return sub[_keys(df)].drop_duplicates()


def equal_to(df: pd.DataFrame, steps=(*ABLATION, "anemll")) -> dict:
    """{(setting..., variant): the earlier step (or anemll) it equals}: identical median TTFT (relative 1e-9), or for
    npumoe a plan with no NPU expert group (= anemll)."""
    out, keys = {}, _keys(df)
    order = [v for v in ("anemll", *ABLATION) if v in steps]
    for setting, g in df[df.variant.isin(order)].groupby(keys):
        setting = setting if isinstance(setting, tuple) else (setting,)
        t = g.groupby("variant").ttft_s.median()
        idle = g[g.variant == "npumoe"].get("n_npu_groups")
        for i, v in enumerate(order):
            if v not in t or v == "anemll":
                continue
            if v == "npumoe" and idle is not None and len(idle) and (idle.fillna(1) == 0).all():
                out[(*setting, v)] = "anemll"
                continue
            for prev in reversed(order[:i]):
                if prev in t and math.isclose(t[prev], t[v], rel_tol=REL):
                    out[(*setting, v)] = prev
                    break
    return out


def settings_text(rows: pd.DataFrame) -> str:
    return ", ".join(f"{r.model} on {r.platform} P={int(r.prompt_len)}/C={int(r.chunk)}" if "model" in rows
                     else f"{r.platform} P={int(r.prompt_len)}/C={int(r.chunk)}" for r in rows.itertuples())


def npu_idle_note(df: pd.DataFrame) -> list[str]:
    """A markdown paragraph naming every setting where npumoe = anemll, or nothing."""
    rows = no_npu(df)
    if rows.empty:
        return []
    n = df[df.variant == "npumoe"][_keys(df)].drop_duplicates().shape[0]
    return [f"**npumoe = anemll here** (its residency leaves no expert group on the NPU, so it runs anemll's "
            f"experts; its rows are anemll's, not a speedup of NPUMoE's) in {len(rows)} of {n} settings: "
            + settings_text(rows) + "."]


__all__ = ["no_npu", "equal_to", "npu_idle_note", "settings_text"]
