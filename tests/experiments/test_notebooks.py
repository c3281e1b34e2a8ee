"""Every notebook runs top to bottom under papermill on the bundled tiny model with tiny parameters, and does what
it says: rows in its `out_dir` (the sweep contract), figures rendered, the expected trends of its knob.

Each notebook's parameters here are the smallest that still exercise every cell (prompt 256, chunk 128, one
sample, 1024 calibration tokens, two knob values). Kernels share one calibration cache (NPUMOE_CACHE) so a
profile is computed once per session.
"""
from __future__ import annotations

import base64
import json
import os
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")
papermill = pytest.importorskip("papermill")
jupytext = pytest.importorskip("jupytext")

from npumoe_lab.results.store import load_results  # noqa: E402
from npumoe_lab.experiments.sweep import KERNEL_ARGS  # noqa: E402
from npumoe_lab.experiments.sweep_spec import notebook_parameters  # noqa: E402
from npumoe_lab.utils import REPO_ROOT  # noqa: E402

NB_DIR = REPO_ROOT / "notebooks"
NOTEBOOKS = ("00_quickstart", "01_calibration", "02_static_tiers", "03_grouping", "04_residency", "05_baselines",
             "06_accuracy", "07_figures", "08_paper_scale", "09_adaptive", "10_explorer")
MODEL = os.environ.get("NPUMOE_NOTEBOOK_TEST_MODEL", "tiny")   # another checkpoint folder: test against it
SMALL = dict(model=MODEL, prompt_len=256, chunk=128, calib_tokens=1024, n_samples=1)


def _bundled_model_or_skip():
    from npumoe_lab.models import TINY_MODEL_DIR
    if MODEL == "tiny" and not (TINY_MODEL_DIR / "config.json").is_file():
        pytest.skip(f"the bundled tiny model is not built yet ({TINY_MODEL_DIR}); `npumoe-lab train-tiny` makes it")


@pytest.fixture(scope="module")
def kernel_env(tmp_path_factory):
    """Environment of the papermill kernels (restored after this module): this checkout first on the path, quiet
    progress bars, one calibration cache for the module."""
    from npumoe_lab.utils import kernel_env as set_path
    saved = dict(os.environ)
    set_path()
    os.environ["NPUMOE_NO_PROGRESS"] = "1"
    os.environ["NPUMOE_CACHE"] = str(tmp_path_factory.mktemp("npumoe-cache"))
    yield
    os.environ.clear()
    os.environ.update(saved)


def execute(name: str, out: Path, **params) -> nbformat.NotebookNode:
    """Run notebooks/<name>.ipynb with papermill (cwd = notebooks/, like a sweep); returns the executed notebook."""
    _bundled_model_or_skip()
    out.mkdir(parents=True, exist_ok=True)
    executed = out / f"{name}.executed.ipynb"
    audit = out / f"{name}.figure-audit.jsonl"      # every figure the kernel builds is audited (figcheck)
    os.environ["NPUMOE_FIGURE_AUDIT"] = str(audit)
    try:
        papermill.execute_notebook(str(NB_DIR / f"{name}.ipynb"), str(executed), parameters=params,
                                   kernel_name="python3", cwd=str(NB_DIR), progress_bar=False,
                                   extra_arguments=KERNEL_ARGS)
    finally:
        del os.environ["NPUMOE_FIGURE_AUDIT"]
    nb = nbformat.read(executed, as_version=4)
    records = [json.loads(line) for line in audit.read_text().splitlines()] if audit.exists() else []
    assert len(records) >= bool(images(nb)), "figures drawn outside npumoe_lab.viz.plots escape the audit"
    assert [r for r in records if r["problems"]] == [], "illegible figure(s)"
    assert noise(nb) == [], "the notebook printed warnings the user did not cause"
    return nb


def noise(nb) -> list[str]:
    """stderr lines with a warning, except the host-load warning (real information about the measurement)."""
    lines = [line for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])
             if o.get("output_type") == "stream" and o.get("name") == "stderr" for line in o["text"].splitlines()]
    return [x for x in lines if "warn" in x.lower() and "HostBusyWarning" not in x and "host_busy" not in x]


def images(nb) -> list[bytes]:
    return [base64.b64decode(o["data"]["image/png"]) for c in nb.cells if c.cell_type == "code"
            for o in c.get("outputs", []) if "image/png" in o.get("data", {})]


def errors(nb) -> list[str]:
    return [f"{o['ename']}: {o['evalue']}" for c in nb.cells for o in c.get("outputs", [])
            if o.get("output_type") == "error"]


def run_knob_notebook(name: str, tmp_path: Path, knob_column: str, **params):
    """Execute a one-knob sweep notebook (02-04, 06) writing rows; returns (notebook, rows indexed by the knob)."""
    out = tmp_path / "rows"
    nb = execute(name, tmp_path, **SMALL, **params, out_dir=str(out))
    assert not errors(nb)
    return nb, load_results(out).set_index(knob_column)


def assert_png(blob: bytes):
    assert blob[:8] == b"\x89PNG\r\n\x1a\n" and len(blob) > 2000  # a real, non-empty figure


# -- structure: cheap, no kernel --------------------------------------------------------------------------------
@pytest.mark.parametrize("name", NOTEBOOKS)
def test_notebook_is_paired_and_parameterised(name):
    py, ipynb = NB_DIR / f"{name}.py", NB_DIR / f"{name}.ipynb"
    assert py.is_file() and ipynb.is_file(), "each notebook is a jupytext .py + its paired .ipynb"
    from_py, nb = jupytext.read(py), nbformat.read(ipynb, as_version=4)
    # the .ipynb is generated from the .py: same cells, same sources (run `make notebooks` after editing the .py)
    assert [(c.cell_type, c.source) for c in from_py.cells] == [(c.cell_type, c.source) for c in nb.cells]
    assert nb.metadata["kernelspec"]["name"] == "python3"
    names = notebook_parameters(nb, ipynb)
    assert "out_dir" in names  # the sweep contract
    tagged = [c for c in nb.cells if "parameters" in c.metadata.get("tags", [])]
    assert len(tagged) == 1 and "out_dir = None" in tagged[0].source
    assert not any(c.get("outputs") for c in nb.cells if c.cell_type == "code"), "commit notebooks without outputs"


# -- execution ----------------------------------------------------------------------------------------------------
@pytest.mark.slow
def test_00_quickstart(kernel_env, tmp_path):
    out = tmp_path / "rows"
    nb = execute("00_quickstart", tmp_path, **{k: v for k, v in SMALL.items() if k != "n_samples"},
                 out_dir=str(out))
    assert not errors(nb)
    df = load_results(out)
    sources = dict(zip(df.platform, df.timing_source))
    assert sources == {"cpu": "measured", "m2-max": "modeled"}
    assert (df.ttft_s > 0).all() and (df.prompt_len == 256).all() and df.plan_hash.notna().all()
    imgs = images(nb)
    assert len(imgs) == 2   # the prefill bars + the popularity heatmap
    for blob in imgs:
        assert_png(blob)


@pytest.mark.slow
def test_01_calibration(kernel_env, tmp_path):
    out = tmp_path / "out"
    nb = execute("01_calibration", tmp_path, model=MODEL, sources=["mixed", "code"], chunk=128, calib_tokens=1024,
                 hot_k=4, out_dir=str(out))
    assert not errors(nb)
    assert sorted(p.name for p in (out / "profiles").iterdir()) == ["code", "mixed"]
    assert all((out / "profiles" / s / "profile.json").is_file() for s in ("code", "mixed"))
    import pandas as pd
    skew = pd.read_csv(out / "skew.csv")
    assert set(skew.calibration) == {"mixed", "code"} and skew.gini.between(0, 1).all()
    assert (skew.experts_50 <= skew.experts_80).all()
    stab = pd.read_csv(out / "hot_set_stability.csv")
    assert set(zip(stab.a, stab.b)) == {("mixed", "code")} and stab.jaccard_top4.between(0, 1).all()
    assert len(images(nb)) == 1   # one heatmap panel per calibration source, on one colour scale


@pytest.mark.slow
def test_02_static_tiers(kernel_env, tmp_path):
    nb, df = run_knob_notebook("02_static_tiers", tmp_path, "n_tiers", tier_values=[1, 3])
    assert sorted(df.index) == [1, 3] and (df.variant == "npumoe-t").all()
    # the point of tiers: one uniform capacity pads the cold experts more than three tiers do
    assert df.loc[1, "pad_rate"] > df.loc[3, "pad_rate"]
    assert df.accuracy_delta.notna().all()
    assert len(images(nb)) == 2


@pytest.mark.slow
def test_03_grouping(kernel_env, tmp_path):
    nb, df = run_knob_notebook("03_grouping", tmp_path, "group_size", group_sizes=[1, 8], platforms="m2-max")
    assert (df.timing_source == "modeled").all()
    assert df.loc[8, "n_npu_calls"] < df.loc[1, "n_npu_calls"]   # one graph per group instead of per expert
    assert len(images(nb)) == 1


@pytest.mark.slow
def test_04_residency(kernel_env, tmp_path):
    nb, df = run_knob_notebook("04_residency", tmp_path, "hot_threshold", hot_thresholds=[0.0, 4096.0],
                               platforms="m2-max")
    # threshold 0 keeps every group on the NPU; above any group's load every expert runs on the CPU
    assert df.loc[0.0, "n_npu_calls"] > df.loc[4096.0, "n_npu_calls"]
    assert len(images(nb)) == 1


@pytest.fixture(scope="module")
def baselines(kernel_env, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("nb05")
    nb = execute("05_baselines", tmp, **SMALL, variants="reference,npumoe-base,npumoe", out_dir=str(tmp / "rows"))
    return nb, tmp / "rows"


@pytest.mark.slow
def test_05_baselines(baselines):
    nb, out = baselines
    assert not errors(nb)
    df = load_results(out)
    assert set(zip(df.variant, df.platform)) == {(v, p) for v in ("reference", "npumoe-base", "npumoe")
                                                 for p in ("cpu", "m2-max")}
    assert set(zip(df.platform, df.timing_source)) == {("cpu", "measured"), ("m2-max", "modeled")}
    assert (df[df.variant == "reference"].drop_rate == 0).all()
    text = "".join(o.get("text", "") for c in nb.cells for o in c.get("outputs", []))
    assert "paper 2.89x" in text   # the ablation report next to the paper's numbers
    assert len(images(nb)) == 4    # baselines + ablation + e2e stacked + TTFT against drop rate
    assert df.e2e_s.notna().all() and (df.decode_tokens == 8).all()


@pytest.mark.slow
def test_06_accuracy(kernel_env, tmp_path):
    out = tmp_path / "curve"
    nb = execute("06_accuracy", tmp_path, model=MODEL, workloads=["lm-next"], prompt_len=256, percentiles=[50.0, 100.0],
                 n=3, calib_tokens=1024, out_dir=str(out))
    assert not errors(nb)
    import pandas as pd
    rows = pd.read_csv(out / "curve.csv")
    assert len(rows) == 4 and set(rows.saliency) == {"weight_x_norm", "random"} and (rows.n_samples == 3).all()
    for _, g in rows.groupby("saliency"):      # a lower capacity percentile drops more
        assert g.set_index("percentile").drop_rate[50.0] > g.set_index("percentile").drop_rate[100.0]
    assert (rows.accuracy_exact_low <= rows.accuracy_exact_high).all() and (rows.timing_source == "modeled").all()
    assert (out / "ACCURACY.md").is_file() and (out / "accuracy_curve.png").is_file()
    assert len(images(nb)) == 1


@pytest.mark.slow
def test_07_figures(baselines, tmp_path):
    _, rows = baselines
    nb = execute("07_figures", tmp_path, results_dir=str(rows), out_dir=str(tmp_path / "figs"))
    assert not errors(nb)
    made = {p.name for p in (tmp_path / "figs").iterdir()}
    assert {"baselines.png", "baselines.pdf", "ablation.png", "ablation.pdf"} <= made
    assert len(images(nb)) == len([m for m in made if m.endswith(".png")])


def test_08_paper_scale(kernel_env, tmp_path):
    nb = execute("08_paper_scale", tmp_path, geometries="phi-tiny-moe", platforms="m2-max", prompt_len=512,
                 chunk=256, decode_policy="npu-decode", out_dir=str(tmp_path / "rows"))
    assert not errors(nb)
    rows = load_results(tmp_path / "rows")
    assert len(rows) == 9 and set(rows.numerics_source) == {"none"} and set(rows.timing_source) == {"modeled"}
    assert len(images(nb)) == 4                 # main figure + ablation + e2e stacked + TTFT against drop rate
    assert (rows.decode_policy == "npu-decode").all() and rows.e2e_s.notna().all()
    text = "".join(o.get("data", {}).get("text/markdown", "") for c in nb.cells for o in c.get("outputs", []))
    assert "Where NPUMoE loses" in text and "phi-tiny-moe" in text


@pytest.mark.slow
def test_10_explorer(kernel_env, tmp_path):
    out = tmp_path / "rows"
    nb = execute("10_explorer", tmp_path, model=MODEL, prompt_len=256, chunk=128, calib_tokens=1024, out_dir=str(out))
    assert not errors(nb)
    df = load_results(out)
    assert set(df.configuration) == {"this plan", "cpu-only", "anemll", "naive-npu", "npumoe-base",
                                     "npumoe (default knobs)"}
    assert (df.timing_source == "modeled").all() and (df.ttft_s > 0).all()
    mine = df[df.configuration == "this plan"].iloc[0]
    assert mine.n_tiers == 3 and mine.group_size == 8 and mine.plan_hash
    # the app's own view rendered (papermill keeps the widget's text/plain repr)
    text = "".join(str(o.get("data", {}).get("text/plain", "")) for c in nb.cells for o in c.get("outputs", []))
    assert "Explorer(" in text or "VBox(" in text


def test_sweep_yaml_names_notebook_parameters():
    """sweeps/demo.yaml (+ base.yaml) validates against 05_baselines' parameters cell."""
    from npumoe_lab.experiments.sweep_spec import load_spec
    spec = load_spec(REPO_ROOT / "sweeps" / "demo.yaml")
    assert spec.notebook.name.startswith("05_baselines")
    cells = spec.cells()
    assert cells and all(c["variants"] == "all" and c["platforms"] == "cpu,m2-max" for c in cells)
    assert json.dumps(cells)  # plain values only (they go to papermill)


# -- the helpers the notebooks call (npumoe_lab/experiments/notebook_helpers.py) -----------------------------------
def test_notebook_helpers_reject_bad_input():
    from npumoe_lab.errors import NpuMoeError
    from npumoe_lab.experiments import notebook_helpers as nb
    with pytest.raises(NpuMoeError, match="not a plan knob"):
        nb.run_knob_sweep(("model", "tokenizer"), "bogus_knob", [1])
    with pytest.raises(NpuMoeError, match="no values"):
        nb.run_knob_sweep(("model", "tokenizer"), "tiers", [])
    with pytest.raises(NpuMoeError, match="at least two"):
        nb.hot_set_stability({"mixed": object()}, k=4)
    assert nb.maybe_write([{"model": "m"}], None) is None   # interactive run: nothing written


def test_summary_markdown_ablation_ratios():
    import pandas as pd

    from npumoe_lab.experiments.demo import summary_markdown
    rows = [dict(variant=v, platform=p, timing_source=src, prompt_len=256, chunk=128, ttft_s=t, energy_per_token_mj=1.0,
                 cpu_cycles=1e9, n_npu_calls=8, drop_rate=0.01, score=0.5)
            for p, src, scale in (("cpu", "measured", 100.0), ("m2-max", "modeled", 1.0))
            for v, t in (("reference", 0.5), ("npumoe-base", 2.0), ("npumoe-t", 1.0), ("npumoe", 0.5))
            for t in [t * scale]]
    matched = [dict(r, percentile=100.0, drop_rate=0.0, ttft_s=r["ttft_s"] * (2 if r["variant"] == "npumoe-t" else 1))
               for r in rows if r["platform"] == "m2-max" and r["variant"] != "reference"]
    md = summary_markdown(pd.DataFrame(rows + matched), {"model": "`tiny`"})
    assert ("| m2-max | modeled | 1.00x at 1.0% drop (paper 1.00x) | 2.00x at 1.0% drop (paper 1.48x) | - | "
            "4.00x at 1.0% drop (paper 2.89x) |") in md
    assert "matched drop rate (each calibrated on the workload's own text, capacities at load percentile 100)" in md
    # at the matched drop rate npumoe-t's TTFT equals npumoe-base's: marked, not reported as a speedup of its own
    assert ("| m2-max | modeled | 1.00x at 0.0% drop (paper 1.00x) | = npumoe-base (no speedup of its own) (paper "
            "1.48x) | - | 4.00x at 0.0% drop (paper 2.89x) |") in md
    assert "| cpu | measured |" in md and "| npumoe | m2-max | modeled | 0.5 |" in md
    # a plan with no NPU expert group: npumoe = anemll, named, and its ablation cell says so
    idle = [dict(r, n_npu_groups=0 if r["variant"] == "npumoe" else 4, n_cpu_groups=8, npu_expert_flop_share=0.0)
            for r in rows if r["platform"] == "m2-max"]
    md = summary_markdown(pd.DataFrame(idle + [dict(idle[-1], variant="anemll", n_npu_groups=0)]), {"model": "`t`"})
    assert "**npumoe = anemll here**" in md and "in 1 of 1 settings: tiny on m2-max P=256/C=128" in md
    assert "| = anemll (no speedup of its own) (paper 2.89x) |" in md and "| 0 of 8 (0%) |" in md


@pytest.mark.slow
def test_09_adaptive(kernel_env, tmp_path):
    out = tmp_path / "out"
    nb = execute("09_adaptive", tmp_path, model=MODEL, prompt_len=768, chunk=128, calib_tokens=1024,
                 budgets=[{"budget_drop": 0.05}, {"budget_ttft_ms": 30.0}], tune_candidates=8, out_dir=str(out))
    assert not errors(nb)
    import pandas as pd
    per = pd.read_csv(out / "drift_per_chunk.csv")
    assert len(per) == 6 and per[["drop_static", "drop_adaptive", "drop_direct"]].notna().all().all()
    assert set(pd.read_csv(out / "drift_records.csv").layer) and (out / "tune_chosen.csv").is_file()
    assert all((out / d / "front.csv").is_file() for d in ("tune-budget_drop0.05", "tune-budget_ttft_ms30.0"))
    imgs = images(nb)
    assert len(imgs) == 2      # drift per chunk + the two fronts
    for blob in imgs:
        assert_png(blob)
