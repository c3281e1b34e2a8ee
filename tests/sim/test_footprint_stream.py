"""What a plan did (execution/footprint.py) reads the same from an array op stream as from the per-op replay's
timeline: the per-op engine is the reference."""
import pytest

from npumoe_lab.sim.run import iter_simulation

COLUMNS = ("n_npu_groups", "n_cpu_groups", "npu_expert_flop_share", "npu_programs", "npu_compiles", "compile_s",
           "ane_limits")


@pytest.mark.parametrize("geometry", ["phi-tiny-moe"])
def test_plan_columns_from_the_stream_equal_the_timelines(geometry):
    kw = dict(geometry=geometry, routing="synthetic:gini=0.6", platforms="m2-max", variants="all",
              prompt_len=512, chunk=256)
    array = {r["variant"]: r for r, _ in iter_simulation(**kw, engine="array")}
    ops = {r["variant"]: r for r, _ in iter_simulation(**kw, engine="ops")}
    assert array.keys() == ops.keys()
    for v in ops:
        for c in COLUMNS:
            assert array[v][c] == pytest.approx(ops[v][c], rel=1e-9) if isinstance(ops[v][c], float) \
                else array[v][c] == ops[v][c], (v, c)
    assert any(r["npu_expert_flop_share"] > 0 for r in ops.values())     # the check covers NPU groups too
