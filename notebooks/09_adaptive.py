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
# # 09 · Adaptive plans: routing drift, recalibration, and a tuner for a budget
#
# The paper's plans come from offline calibration; when live routing drifts from it, capacities and the hot/cold
# split degrade (PAPER.md section 6). Here a plan calibrated on one domain prefills held-out text of another with a
# **drift monitor** (`npumoe_lab.execution.drift`): per chunk and MoE layer, the Jensen-Shannon distance of the load to the
# calibrated popularity, the hot-set overlap, and drop/padding against the plan's expectation. With
# `recalibrate="rebuild"` the plan is rebuilt from the live window when drift persists. Drop rates are
# **measured** (real numerics on this CPU); TTFT and energy are **modeled** on the platform. Then
# `npumoe_lab.studies.tune` searches the plan knobs for two budgets and draws each Pareto front.

# %% tags=["parameters"]
model = "tiny"                      # the bundled model (or a local HF MoE checkpoint folder)
calib_domain = "scripture"          # the plan's calibration text
run_domain = "code"                 # the held-out text it prefills (lm-heldout)
prompt_len = 2048
chunk = 128
calib_tokens = 4096
platform = "m2-max"
budgets = [{"budget_drop": 0.05}, {"budget_ttft_ms": 16.0}]   # one tuner run each
tune_candidates = 40
out_dir = None                      # set (e.g. by a sweep): tables and tuner outputs are written there

# %%
# %matplotlib inline
from pathlib import Path

import pandas as pd

import npumoe_lab as nl
from npumoe_lab.studies.adaptive import drift_run
from npumoe_lab.viz.adaptive import drift_figure, fronts_figure
from npumoe_lab.studies.tune import tune

m, tok = nl.load_model(model)
report = drift_run(m, tok, calib_domain, run_domain, prompt_len=prompt_len, chunk=chunk, calib_tokens=calib_tokens,
                   platform=platform)
print(report.text())
display(drift_figure(report))  # noqa: F821 (IPython builtin)

# %% [markdown]
# Per chunk: the drop rate of the static plan, of the recalibrated one and of a plan calibrated on the run's domain
# (measured), and the layers flagged. The monitor's records (one per chunk and layer) are in `report.drift`.

# %%
report.per_chunk

# %% [markdown]
# The tuner for two budgets: candidates scored by replaying recorded calibration routing on the engine (modeled
# TTFT/energy, replayed drop), the best confirmed with real numerics on held-out text (measured drop).

# %%
fronts, rows = {}, []
for b in budgets:
    label = ", ".join(f"{k}={v}" for k, v in b.items())
    sub = None if out_dir is None else Path(out_dir) / ("tune-" + "-".join(f"{k}{v}" for k, v in b.items()))
    rep = tune(model=(m, tok), platform=platform, chunk=chunk, n_candidates=tune_candidates, out=sub, **b)
    fronts[label] = rep["front"]
    rows.append({"budget": label, "met": rep["met"], "knobs": rep["chosen_knobs"], **rep["chosen"]})
display(fronts_figure(fronts))  # noqa: F821 (IPython builtin)

# %%
chosen = pd.DataFrame(rows).set_index("budget")
if out_dir is not None:
    Path(out_dir).mkdir(parents=True, exist_ok=True)
    report.per_chunk.to_csv(Path(out_dir) / "drift_per_chunk.csv", index=False)
    report.drift.to_csv(Path(out_dir) / "drift_records.csv", index=False)
    chosen.to_csv(Path(out_dir) / "tune_chosen.csv")
chosen
