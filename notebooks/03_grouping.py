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
# # 03 · Grouped expert execution: group size vs latency, energy and NPU calls
#
# Every NPU call pays dispatch + sync (PAPER.md §1, §3.3). Grouping same-tier experts into one static graph
# replaces G calls by one, at the cost of a larger graph. The sweep runs `npumoe-tg` (tiers + groups,
# everything resident) for each group size; group size 1 is `npumoe-t`.

# %% tags=["parameters"]
model = "tiny"
workload = "ruler-multikey"
variants = "npumoe-tg"
group_sizes = [1, 2, 4, 8, 16]
platforms = "cpu,m2-max"        # measured on this host + modeled on M2 Max
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
from npumoe_lab.viz.plots import plot_grouping

df = nb.knob_sweep(globals(), "group_size", group_sizes)
nb.maybe_write(df, out_dir)
df[["variant", "platform", "timing_source", "group_size", "ttft_s", "energy_per_token_mj", "n_npu_calls",
    "cpu_cycles", "drop_rate", "pad_rate"]]

# %%
plot_grouping(df)
