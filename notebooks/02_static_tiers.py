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
# # 02 · Static capacity tiers: padding vs dropping vs accuracy
#
# A static NPU graph has a fixed token capacity per expert. One capacity for every expert either pads the
# cold experts heavily or drops the hot experts' overflow; **tiers** (PAPER.md §3.2) give hot and cold experts
# different static capacities. `tiers = 1` is "tiers off". The sweep runs the `npumoe-t` variant (tiers, one
# graph per expert, everything resident) for each number of tiers and records padding (share of static slots
# that hold no token), drop rate (routed assignments pruned by saliency) and the accuracy delta vs the
# dropless `reference`.

# %% tags=["parameters"]
model = "tiny"
workload = "ruler-multikey"
variants = "npumoe-t"           # the tiers ablation step (add npumoe-base for the uniform-capacity baseline)
tier_values = [1, 2, 3, 4]      # numbers of static capacity tiers to try (1: tiers off)
platforms = "m2-max"            # numerics are the same on every platform; add "cpu" for measured timings
prompt_len = 1024
chunk = 256
n_samples = 4
repeats = None                  # None: 3 on a measured platform (median + IQR), 1 on a modeled one
calib_workload = "mixed"
calib_tokens = 8192
seed = 0
out_dir = None

# %%
# %matplotlib inline
from npumoe_lab.experiments import notebook_helpers as nb
from npumoe_lab.viz.plots import plot_accuracy, plot_tiers

df = nb.knob_sweep(globals(), "tiers", tier_values)
nb.maybe_write(df, out_dir)
df[["variant", "platform", "n_tiers", "pad_rate", "drop_rate", "accuracy_delta", "accuracy_ci_low",
    "accuracy_ci_high", "top1_agree", "kl", "ttft_s", "timing_source"]]

# %% [markdown]
# ## Padding vs drop rate (one point per number of tiers)

# %%
plot_tiers(df)

# %% [markdown]
# ## Accuracy delta vs drop rate (error bars: bootstrap CI over samples)

# %%
plot_accuracy(df)
