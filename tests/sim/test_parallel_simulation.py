"""A simulation grid over worker processes gives the sequential run's rows, in its order, value for value."""
import pandas as pd
import pytest

from npumoe_lab.errors import NpuMoeError
from npumoe_lab.sim.run import simulate

pytestmark = pytest.mark.slow       # whole curves / grids twice: the slow lane

GRID = dict(geometry="phi-tiny-moe,qwen3-30b-a3b", platforms="m2-max,m2-ultra", variants="npumoe,cpu-only,npumoe-t",
            prompt_len="1024,2048", chunk="256,512")


@pytest.mark.parametrize("draws", [0, 20])
def test_workers_give_the_sequential_rows(draws):
    one = simulate(**GRID, draws=draws, workers=1)
    two = simulate(**GRID, draws=draws, workers=2)
    assert len(one) == 2 * 2 * 2 * 3 * 2
    keep = [c for c in one.columns if c != "created"]         # when each row was made
    pd.testing.assert_frame_equal(one[keep], two[keep], check_exact=True)


def test_workers_must_be_a_positive_integer():
    with pytest.raises(NpuMoeError, match="workers"):
        simulate(**GRID, workers=0)
