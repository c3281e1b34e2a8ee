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
# # 10 · Plan explorer: move a knob, see the plan and its prefill
#
# Sliders and pickers for the plan knobs (capacity tiers, load percentile, group size, residency rule, hot
# threshold, platform, chunk); live panels: the current plan's TTFT / energy / CPU cycles / drop / padding against
# the baselines, the **modeled** prefill timeline, capacity against calibrated load per expert of a chosen layer
# (dropped and padded rows shaded), and which groups are resident on the NPU. Each update re-plans and replays the
# prompt's routing on the engine without a model forward (simulated timing); **run real numerics** prefills the
# prompt through the plan for real and compares it with the dropless reference. `model` may also be a bundled
# geometry (`qwen3-30b-a3b`, `phi-3.5-moe`, `phi-tiny-moe`): paper scale, routing from `routing`.

# %% tags=["parameters"]
model = "tiny"                      # "tiny", a local HF MoE checkpoint folder, or a bundled geometry name
prompt_len = 256                    # tokens of the prompt whose routing is replayed
chunk = 128                         # starting chunk (the calibration's chunk for a model)
workload = "lm-heldout"             # where the prompt comes from (`npumoe_lab.list_workloads()`)
calib_workload = "mixed"            # calibration text (a model)
calib_tokens = 2048                 # calibration tokens (a model)
routing = None                      # a geometry's routing source, as in npumoe-lab simulate (None: Gini 0.6)
residency = "threshold"             # starting rule: the paper's hot/cold split ("cost", npumoe's default, keeps
                                    # every group of the tiny model on the CPU, where the capacity knobs do nothing)
seed = 0
out_dir = None                      # set (e.g. by a sweep): the starting plan's and the baselines' rows are written

# %%
import pandas as pd

import npumoe_lab as nl
from npumoe_lab.experiments.notebook_helpers import maybe_write
from npumoe_lab.viz.explorer import Knobs, evaluation_rows, summary_rows

app = nl.explore(model, knobs=Knobs(chunk=chunk, residency=residency), prompt_len=prompt_len, chunk=chunk,
                 workload=workload, calib_workload=calib_workload, calib_tokens=calib_tokens,
                 routing=routing or "synthetic:gini=0.6", seed=seed)
app

# %% [markdown]
# The numbers behind the panels (modeled; `app.set(tiers=2, group_size=4)` moves knobs from code, and
# `app.evaluation` holds the latest plan, timeline and baselines):

# %%
pd.DataFrame(summary_rows(app.evaluation)).set_index("configuration")

# %%
maybe_write(evaluation_rows(app.evaluation, app.lab, workload), out_dir)
