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
# # 07 · All paper figures from a results folder
#
# `make_all_figures` loads every result row below `results_dir` (from `npumoe-lab run`, `npumoe-lab sweep`,
# `make demo` or the notebooks' `out_dir`) and draws each figure the columns allow (baselines, ablation,
# accuracy, tiers, grouping, residency, one popularity heatmap per calibration profile found), as PDF + PNG.
# Same as `npumoe-lab figures RESULTS_DIR --out DIR`.

# %% tags=["parameters"]
results_dir = "../results/demo"   # a results folder (relative to this notebook, or absolute)
out_dir = None                    # where the figures go (None: the figures folder inside results_dir)

# %%
from pathlib import Path

from IPython.display import Image, display

from npumoe_lab.viz.plots import make_all_figures

figures_dir = Path(out_dir) if out_dir is not None else Path(results_dir) / "figures"
paths = make_all_figures(results_dir, figures_dir)
for p in sorted(p for p in paths if p.suffix == ".png"):
    print(p.name)
    display(Image(filename=str(p), width=700))
