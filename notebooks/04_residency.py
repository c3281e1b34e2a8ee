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
# # 04 · Load-aware residency: the hot threshold
#
# Cold experts receive few tokens per chunk: running them as padded static NPU graphs wastes dispatches and
# slots, so NPUMoE keeps only hot groups resident on the NPU and runs cold experts on the CPU (PAPER.md §3.4).
# `hot_threshold` = expected kept tokens per chunk a group needs to stay resident: 0 puts every group on the
# NPU, a huge value every expert on the CPU. The sweep runs the full `npumoe` variant per threshold.

# %% tags=["parameters"]
model = "tiny"
workload = "ruler-multikey"
variants = "npumoe"
hot_thresholds = [0.0, 16.0, 64.0, 256.0, 1e9]   # expected tokens per chunk of a group
platforms = "cpu,m2-max"
prompt_len = 1024
chunk = 256
n_samples = 2
repeats = None                  # None: 3 on a measured platform (median + IQR), 1 on a modeled one
calib_workload = "mixed"
calib_tokens = 8192
seed = 0
out_dir = None

# %%
# %matplotlib inline
from npumoe_lab.experiments import notebook_helpers as nb
from npumoe_lab.viz.plots import plot_residency

df = nb.knob_sweep(globals(), "hot_threshold", hot_thresholds)
nb.maybe_write(df, out_dir)
df[["variant", "platform", "timing_source", "hot_threshold", "ttft_s", "energy_per_token_mj", "n_npu_calls",
    "cpu_cycles", "drop_rate"]]

# %%
plot_residency(df)
