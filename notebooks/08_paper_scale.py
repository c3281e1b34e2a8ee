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
operating_point = "default"     # or "paper": the tier percentile solved for npumoe's 10-22 % drop (rows say which)
decode_tokens = 8               # greedy decode steps after the prefill (the paper's e2e setting; 0: prefill only)
decode_policy = "pipeline"      # pipeline | cpu | npu-decode (docs/END_TO_END.md)
out_dir = None

# %%
# %matplotlib inline
from IPython.display import Markdown

import npumoe_lab as nl
from npumoe_lab.viz.plots import plot_ablation, plot_baselines
from npumoe_lab.sim.report import paper_scale_markdown

df = nl.simulate(geometries, routing, platforms, "all", prompt_len, chunk, seed=seed, out=out_dir,
                 operating_point=operating_point, decode_tokens=decode_tokens, decode_policy=decode_policy)
df[["model", "platform", "variant", "ttft_s", "energy_per_token_mj", "cpu_cycles", "n_npu_calls", "drop_rate",
    "pad_rate", "npu_programs", "feasible"] + (["tpot_s", "e2e_s"] if decode_tokens else [])]

# %%
Markdown(paper_scale_markdown(df))

# %%
plot_baselines(df)

# %%
plot_ablation(df)

# %% [markdown]
# ## End to end: prefill + decode
# Per variant, e2e stacked as prefill (TTFT) + `decode_tokens` greedy steps under `decode_policy` (each panel's
# title), all modeled; whiskers: the 90 % interval where `draws` were asked (the caption says what they are).

# %%
if decode_tokens:
    from npumoe_lab.viz.end_to_end import plot_e2e
    display(plot_e2e(df))  # noqa: F821 (IPython builtin)

# %% [markdown]
# ## TTFT against the drop rate
# npumoe over a sweep of the tier percentile (point labels) against the drop rate each plan gives, the paper's
# 10-22 % band shaded, each baseline a line (dotted: a plan a real ANE could not hold, `infeasible` in its rows).
# Every plan keeps under the platform's NPU program budget (docs/OPERATING_POINT.md), so on Qwen3-30B-A3B few
# groups stay resident and the drop the percentile can buy is capped.

# %%
from npumoe_lab.sim.operating_point import percentile_sweep
from npumoe_lab.viz.drop_curve import plot_ttft_vs_drop

plot_ttft_vs_drop(percentile_sweep(geometries, routing, platforms, prompt_len=prompt_len, chunk=chunk, seed=seed))
