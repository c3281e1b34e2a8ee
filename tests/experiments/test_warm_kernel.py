"""Warm sweep workers (experiments/warm_kernel.py): the cells of a local sweep run in one kernel, each with a clean
namespace and its own executed notebook; a kernel that dies is replaced. Reference: the same sweep with a fresh
kernel per cell."""
import textwrap
from pathlib import Path

import torch

from npumoe_lab.experiments import model_cache
from npumoe_lab.results.store import load_results
from npumoe_lab.experiments.sweep import prewarm, run_sweep
from npumoe_lab.experiments.warm_kernel import shutdown

FIX = Path(__file__).resolve().parents[1] / "fixtures"


def test_cells_share_one_kernel_with_a_clean_namespace_and_fresh_kernels_do_not(tmp_path):
    warm = run_sweep(FIX / "warm.yaml", tmp_path / "warm")
    shutdown()
    fresh = run_sweep(FIX / "warm.yaml", tmp_path / "fresh", warm=False)
    assert warm.ok and fresh.ok and len(warm.done) == len(fresh.done) == 3
    w, f = load_results(tmp_path / "warm"), load_results(tmp_path / "fresh")
    assert w.variant.nunique() == 1 and sorted(w.score) == [1.0, 2.0, 3.0]    # one process, modules kept
    assert f.variant.nunique() == 3 and set(f.score) == {1.0}                  # a process per cell
    assert (w.nll == 0).all() and (f.nll == 0).all()                           # no name of a previous cell
    assert all((c.dir / "executed.ipynb").exists() for c in warm.done)         # each cell's record
    assert set(w.model) == set(f.model) == {"fixture-in-sweep-1"}             # kernels know they run a sweep cell


def test_prewarm_runs_its_code_in_the_kernel_the_cells_then_use(tmp_path):
    """`make demo` starts its sweep's kernel early (imports + model load beside its calibration): the cells must
    run in that kernel, after the code, with none of its names left in their namespace."""
    code = ("import sys\nc = sys.modules.setdefault('_warm_fixture_counter', type(sys)('_warm_fixture_counter'))\n"
            "c.n = 10\nleft_by_previous_cell = True")
    thread = prewarm(FIX / "warm.yaml", tmp_path / "out", code)
    thread.join()
    report = run_sweep(FIX / "warm.yaml", tmp_path / "out")
    shutdown()
    rows = load_results(tmp_path / "out")
    assert report.ok and sorted(rows.score) == [11.0, 12.0, 13.0]                # after the code, in its process
    assert rows.variant.nunique() == 1 and (rows.nll == 0).all()                 # one kernel, clean namespaces
    assert prewarm(FIX / "warm.yaml", tmp_path / "out", code) is None            # nothing left to run: no kernel


def test_a_dead_kernel_fails_its_cell_and_the_next_cell_gets_a_new_one(tmp_path):
    spec = tmp_path / "die.yaml"
    spec.write_text(textwrap.dedent(f"""\
        name: fixture-die
        notebook: {FIX / 'warm_nb.py'}
        grid:
          x: [1, 99, 3]
        """))
    report = run_sweep(spec, tmp_path / "out")
    shutdown()
    assert [c.params["x"] for c in report.failed] == [99] and len(report.done) == 2
    assert load_results(tmp_path / "out").variant.nunique() == 2                 # x=3 ran in a new kernel


def test_model_cache_reloads_after_the_weights_change():
    from npumoe_lab.models import TINY_MODEL_DIR
    if not (TINY_MODEL_DIR / "model.safetensors").exists():
        import pytest
        pytest.skip("bundled tiny model not present")
    model_cache.clear()
    m1, _ = model_cache.cached_load("tiny", "fp32")
    assert model_cache.cached_load("tiny", "fp32")[0] is m1
    assert model_cache.cached_load("tiny", "bf16")[0].dtype == torch.bfloat16
    with torch.no_grad():
        next(m1.parameters()).add_(1.0)                                           # changed in memory: reload
    m2, _ = model_cache.cached_load("tiny", "fp32")
    assert m2 is not m1 and not torch.equal(next(m2.parameters()), next(m1.parameters()))
    model_cache.clear()
