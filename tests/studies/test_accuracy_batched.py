"""The accuracy curve with prompts prefilled in batches equals the one-at-a-time curve: every row (scores, exact
bounds, NLL, top-1 agreement, drop / pad counts, modeled TTFT and its interval) and every per-sample outcome."""
import pandas as pd
import pytest

from npumoe_lab.errors import NpuMoeError
from npumoe_lab.models import TINY_MODEL_DIR, load_model
from npumoe_lab.studies.accuracy_curve import accuracy_curve

pytestmark = pytest.mark.slow       # whole curves / grids twice: the slow lane


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    if not (TINY_MODEL_DIR / "config.json").is_file():
        pytest.skip("the bundled tiny model is not built")
    mp = pytest.MonkeyPatch()
    mp.setenv("NPUMOE_CACHE", str(tmp_path_factory.mktemp("cache")))
    yield load_model("tiny")
    mp.undo()


def test_batched_curve_equals_one_at_a_time(tiny, tmp_path):
    kw = dict(model=tiny, workloads=("ruler-vt", "fewshot-cls", "lm-next"), percentiles=(50,),
              saliency=("weight_x_norm", "random"), n=5, calib_tokens=2048, draws=20, ref_cache=tmp_path)
    rows1, samples1 = accuracy_curve(batch=1, **kw)
    rows4, samples4 = accuracy_curve(batch=4, **kw)           # a batch of 4 and one alone per task
    assert rows1.dropped.sum() > 0                            # plans that prune: the drops are compared too
    pd.testing.assert_frame_equal(samples1, samples4, check_exact=True)
    keep = [c for c in rows1.columns if c not in ("created", "ref_cached")]   # when, and from where
    pd.testing.assert_frame_equal(rows1[keep], rows4[keep], check_exact=True)


def test_batch_must_be_a_positive_integer(tiny):
    with pytest.raises(NpuMoeError, match="batch"):
        accuracy_curve(model=tiny, workloads=("lm-next",), percentiles=(50,), saliency=("random",), n=1, batch=0)
