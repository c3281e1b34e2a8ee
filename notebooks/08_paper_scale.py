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
# # 08 · Paper scale: NPUMoE on Qwen3-30B-A3B, Phi-3.5-MoE and Phi-tiny-MoE, simulated
#
# The paper's models cannot be loaded here, so this notebook **simulates** them: each model's geometry (its HF
# config facts, `data/geometries/`) and routing statistics (synthetic popularity of a stated Gini, or a calibration
# profile brought back from a Mac with `npumoe-lab calibrate --model DIR --out PROFILE`) are replayed on the same
# engine as a real run (`npumoe_lab.simulate`). **Every time, energy and cycle number here is modeled** (the device
# cost model of `npumoe_lab/devices/platforms/`), and no numerics run (no accuracy). The main figure: TTFT, energy
# per token and CPU cycles per variant, one row of panels per model x platform; then the ablation at paper scale,
# and where NPUMoE loses.

# %% tags=["parameters"]
geometries = "qwen3-30b-a3b,phi-3.5-moe,phi-tiny-moe"   # comma list: bundled names or config.json paths
routing = "synthetic:gini=0.6"                          # or profile:DIR, tiny
platforms = "m2-max,m2-ultra"
prompt_len = 1024
chunk = 512
seed = 0
out_dir = None

# %%
# %matplotlib inline
from IPython.display import Markdown

import npumoe_lab as nl
from npumoe_lab.viz.plots import plot_ablation, plot_baselines
from npumoe_lab.sim.report import paper_scale_markdown

df = nl.simulate(geometries, routing, platforms, "all", prompt_len, chunk, seed=seed, out=out_dir)
df[["model", "platform", "variant", "ttft_s", "energy_per_token_mj", "cpu_cycles", "n_npu_calls", "drop_rate",
    "pad_rate"]]

# %%
Markdown(paper_scale_markdown(df))

# %%
plot_baselines(df)

# %%
plot_ablation(df)
