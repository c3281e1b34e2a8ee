"""Parameters resolved once at the edge: one platform coercion, one chunk check, PrefillConfig travels whole into
each chunk's context, one result column name for the number of tiers."""
import pytest

from npumoe_lab.devices import as_platform, get_platform
from npumoe_lab.errors import NpuMoeError
from npumoe_lab.execution.calibrate import calibrate
from npumoe_lab.execution.clock import NullClock
from npumoe_lab.execution.runtime import PrefillConfig, check_chunk, chunked_prefill
from npumoe_lab.results.store import knob_columns


def test_as_platform_resolves_names_and_passes_objects_through():
    plat = get_platform("m2-max")
    assert as_platform(plat) is plat and as_platform(None) is None
    assert as_platform("m2-max").hash == plat.hash
    int8 = as_platform("m2-max", npu_weight_bytes="int8")
    assert int8.npu.weight_bytes == 1 and int8.hash != plat.hash
    assert PrefillConfig("m2-max", 64).platform.hash == plat.hash


@pytest.mark.parametrize("bad", [0, -4, 2.5, True, "64"])
def test_one_chunk_check_one_wording(bad):
    message = f"chunk must be an integer >= 1; got {bad!r}"
    for call in (lambda: check_chunk(bad), lambda: PrefillConfig("m2-max", bad), lambda: PrefillConfig.untimed(bad),
                 lambda: chunked_prefill(None, None, bad), lambda: calibrate(None, None, chunk=bad)):
        with pytest.raises(NpuMoeError) as info:
            call()
        assert str(info.value) == message


def test_chunk_context_comes_from_the_config_whole():
    config = PrefillConfig(get_platform("m2-max", npu_weight_bytes="int8"), 128, attention="cpu", dtype_bytes=4)
    clock = NullClock()
    ctx = config.chunk_context(3, 100, clock, numerics=False)
    assert (ctx.index, ctx.past, ctx.n_real, ctx.length, ctx.numerics) == (3, 384, 100, 128, False)
    assert (ctx.dtype_bytes, ctx.npu_weight_bytes, ctx.clock) == (4, 1, clock)
    assert ctx.weight_bytes("npu") == 1 and ctx.weight_bytes("cpu") == 4
    untimed = PrefillConfig.untimed(32, pad_token_id=5)
    assert (untimed.platform, untimed.measured, untimed.pad_token_id, untimed.npu_weight_bytes) == (None, False, 5,
                                                                                                   None)


def test_tiers_is_stored_as_the_n_tiers_column_only():
    assert knob_columns({"tiers": 2, "group_size": 4, "hot_threshold": None}) == \
        {"n_tiers": 2, "group_size": 4, "hot_threshold": None}
