# ---
# jupyter:
#   jupytext:
#     formats: ipynb,py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
#       format_version: '1.3'
#       jupytext_version: 1.19.6
#   kernelspec:
#     display_name: Python 3 (ipykernel)
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 06 · Accuracy: drop rate vs accuracy delta
#
# Static capacities prune overflow assignments (by saliency); NPUMoE's claim is that accuracy barely moves
# (PAPER.md §3.7, §5.4). Capacities are set at a percentile of the calibrated per-chunk loads: a lower
# percentile drops more. For each percentile the sweep runs the full `npumoe` variant and `npumoe-spill`
# (overflow computed on the CPU instead of dropped: drop rate 0) and scores both against the dropless
# `reference` on the same samples; error bars are bootstrap CIs over samples.

# %% tags=["parameters"]
model = "tiny"
workload = "ruler-multikey"
variants = "npumoe,npumoe-spill"
percentiles = [50.0, 75.0, 90.0, 99.0]
platforms = "m2-max"            # accuracy does not depend on the timing platform
prompt_len = 1024
chunk = 256
n_samples = 8
repeats = None                  # None: 3 on a measured platform (median + IQR), 1 on a modeled one
calib_workload = "mixed"
calib_tokens = 8192
seed = 0
out_dir = None

# %%
# %matplotlib inline
from npumoe_lab.experiments import notebook_helpers as nb
from npumoe_lab.viz.plots import plot_accuracy

df = nb.knob_sweep(globals(), "percentile", percentiles)
nb.maybe_write(df, out_dir)
df[["variant", "percentile", "drop_rate", "score", "ref_score", "accuracy_delta", "accuracy_ci_low",
    "accuracy_ci_high", "top1_agree", "kl"]]

# %%
plot_accuracy(df)
