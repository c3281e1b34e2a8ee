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
# # 00 · Quickstart: from a MoE checkpoint to a static NPU plan
#
# The whole NPUMoE pipeline on the bundled tiny Qwen3-MoE, in the order of the paper (PAPER.md §2-3):
# capture the router's decisions, check that the workbench's dropless experts path reproduces HF exactly,
# calibrate expert popularity offline, build a static plan (capacity tiers, expert groups, residency), and
# prefill one prompt through the plan, **modeled** on an Apple platform and **measured** on this host.
# Every time/energy number says which it is (`timing_source`).

# %% tags=["parameters"]
model = "tiny"                  # "tiny" (bundled) or a local HF MoE checkpoint folder
workload = "ruler-multikey"     # where the prompt comes from (`npumoe_lab.list_workloads()`)
prompt_len = 512                # tokens in the prefilled prompt
chunk = 256                     # static prefill chunk (tokens per NPU graph call)
calib_workload = "mixed"        # calibration text
calib_tokens = 4096             # calibration tokens
tiers = 3                       # static capacity tiers
group_size = 8                  # experts per grouped NPU graph
platform = "m2-max"             # modeled platform (`npumoe-lab platforms`)
seed = 0
out_dir = None                  # set (e.g. by a sweep): result rows are written there

# %%
# %matplotlib inline
import pandas as pd
import torch

import npumoe_lab as nl
from npumoe_lab.experiments import notebook_helpers as nb
from npumoe_lab.viz.plots import plot_popularity_heatmap, timeline

torch.manual_seed(seed)
m, tok = nb.load(model)
pd.DataFrame([vars(s) for s in nl.describe(m)])

# %% [markdown]
# ## 1. A prompt, and where the router sends its tokens

# %%
sample = nl.get_workload(workload).samples(tok, prompt_len, 1, seed)[0]
ids = torch.tensor([sample.input_ids])
records = nl.capture_routing(m, ids)
nb.routing_counts(records)    # assignments per expert and layer, this prompt

# %% [markdown]
# ## 2. The workbench's dropless experts path equals HF's own experts

# %%
parity = nb.dropless_parity(m, ids)
assert parity["allclose"] and parity["top1_agree"] == 1.0, parity
parity

# %% [markdown]
# ## 3. Offline calibration and the static plan

# %%
profile = nl.calibrate(m, tok, workload=calib_workload, chunk=chunk, tokens=calib_tokens, seed=seed)
profile.summary()

# %%
plan = nl.build_plan(profile, m, tiers=tiers, group_size=group_size, platform=platform)
print(plan.summary())

# %% [markdown]
# ## 4. Prefill through the plan: modeled on the Apple platform, measured on this host

# %%
nl.attach(m, plan)
results = {platform: nl.prefill(m, ids, chunk=chunk, platform=platform),
           "cpu": nl.prefill(m, ids, chunk=chunk, platform="cpu")}
nl.detach(m)
rows = nb.prefill_rows(results, model=nb.model_label(model), workload=workload, variant="npumoe",
                         prompt_len=prompt_len, chunk=chunk, plan=plan)
nb.maybe_write(rows, out_dir)
rows[["platform", "timing_source", "ttft_s", "energy_per_token_mj", "cpu_cycles", "n_npu_calls", "drop_rate",
      "pad_rate"]]

# %% [markdown]
# The modeled prefill op by op (one lane per role, NPU dispatch + sync hatched, the critical path underlined); the
# table above compares the two platforms' totals.

# %%
timeline(results[platform].events, title=f"one prefill through the plan: {platform}, modeled", platform=platform)

# %%
plot_popularity_heatmap(profile)
