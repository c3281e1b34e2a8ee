# ---
# jupyter:
#   jupytext:
#     formats: ipynb,py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
#   kernelspec:
#     display_name: Python 3 (ipykernel)
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 01 · Calibration: expert popularity, skew and hot-set stability
#
# NPUMoE's static shapes rest on one observation (PAPER.md §3.1): expert popularity is **skewed** (a few
# experts take most assignments in each layer) and **stable** (the hot set found offline on calibration text
# stays hot on other inputs). This notebook calibrates the model on the mixed calibration text and on each
# domain separately, draws the popularity heatmaps, quantifies skew (Gini; how many experts cover 50% / 80%
# of the assignments) and measures hot-set stability (Jaccard of the top-k hottest experts between sources).

# %% tags=["parameters"]
model = "tiny"                  # "tiny" (bundled) or a local HF MoE checkpoint folder
sources = ["mixed", "scripture", "drama", "pydocs", "code"]   # calibration text: "mixed", a domain or a workload
chunk = 256                     # prefill chunk the counts are taken in
calib_tokens = 8192             # tokens per calibration source
hot_k = 8                       # size of the hot set compared across sources
seed = 0
out_dir = None                  # set: profiles (-> heatmaps in 07_figures) and the tables are written there

# %%
# %matplotlib inline
from pathlib import Path

import pandas as pd

from npumoe_lab.experiments import notebook_helpers as nb
from npumoe_lab.viz.plots import plot_popularity_heatmaps

m, tok = nb.load(model)
profiles = nb.calibrate_workloads(m, tok, sources, chunk=chunk, tokens=calib_tokens, seed=seed)

# %% [markdown]
# ## Popularity heatmaps (load share per expert and layer), one panel per calibration source
# All panels share one colour scale, so a colour means the same load share in every panel.

# %%
plot_popularity_heatmaps(profiles)

# %% [markdown]
# ## Skew: Gini of the experts' loads and the experts covering 50% / 80% of the assignments

# %%
skew = nb.skew_table(profiles)
skew.pivot(index="layer", columns="calibration", values=["gini", "experts_50", "experts_80"]).round(3)

# %% [markdown]
# ## Hot-set stability: Jaccard similarity of the top-`hot_k` experts between calibration sources
# 1.0 = the same hot set; the expected value for random sets of that size is much lower.

# %%
stability = nb.hot_set_stability(profiles, hot_k)
stability.pivot_table(index=["a", "b"], columns="layer", values=f"jaccard_top{hot_k}").round(2)

# %%
if out_dir is not None:
    for name, profile in profiles.items():
        profile.save(Path(out_dir) / "profiles" / name)
    skew.to_csv(Path(out_dir) / "skew.csv", index=False)
    stability.to_csv(Path(out_dir) / "hot_set_stability.csv", index=False)
