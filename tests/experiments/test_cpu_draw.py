"""The CPU loop's pre-registered held-out draw (experiments/cpu_draw.py): deterministic per seed, inside the declared
grid, and sized to a budget as a prefix of the seed's stream (so the budget never picks which settings)."""
import math

import pytest

from npumoe_lab.errors import NpuMoeError
from npumoe_lab.experiments import cpu_draw as cd
from npumoe_lab.planning.variants import VARIANTS
from npumoe_lab.workloads import list_workloads


def test_the_draw_is_deterministic_per_seed_and_differs_across_seeds():
    assert cd.draw(7, n=30) == cd.draw(7, n=30)
    assert cd.draw(7, budget_s=200) == cd.draw(7, budget_s=200)
    assert cd.draw(7, n=30) != cd.draw(8, n=30)


def test_every_drawn_setting_respects_the_grid():
    settings = cd.draw(123, n=400)
    for s in settings:
        assert s.model in cd.MODELS and s.dtype in cd.DTYPES and s.variant in cd.VARIANTS
        assert s.workload in cd.OFFLINE_WORKLOADS and s.workload in list_workloads()
        assert 128 <= s.prompt_len <= 2048
        assert s.chunk in (32, 64, 128, 256, 512) and s.chunk <= s.prompt_len
        assert s.chunk & (s.chunk - 1) == 0                       # a power of two
    # over 400 draws every value of the grid occurs (a grid value the draw cannot reach would be a defect)
    assert {s.variant for s in settings} == set(VARIANTS) == set(cd.VARIANTS)
    assert {s.workload for s in settings} == set(cd.OFFLINE_WORKLOADS)
    assert {s.chunk for s in settings} == set(cd.CHUNKS)
    assert {s.model for s in settings} == set(cd.MODELS) and {s.dtype for s in settings} == set(cd.DTYPES)
    assert min(s.prompt_len for s in settings) < 160 and max(s.prompt_len for s in settings) > 1700


def test_the_budget_takes_a_prefix_of_the_seeds_stream():
    full = cd.draw(5, n=200)
    for budget in (30.0, 120.0, 400.0):
        got = cd.draw(5, budget_s=budget)
        assert got == full[:len(got)]
        assert sum(map(cd.estimated_s, got)) <= budget or len(got) == 1
        assert sum(map(cd.estimated_s, full[:len(got) + 1])) > budget


def test_a_priori_cost_by_hand():
    s = cd.Setting("tiny", "ruler-vt", "reference", 512, 64, "auto")
    assert cd.prefill_s(s) == pytest.approx(8 * 0.02 + 512 * 1e-4)              # 8 chunks, 512 tokens
    assert cd.repeats_of(s) == 5
    assert cd.estimated_s(s) == pytest.approx(6 * cd.prefill_s(s) + 0.5)        # no calibration for reference
    q = cd.Setting(cd.MODELS[1], "lm-next", "npumoe-base", 2048, 512, "fp32")
    assert cd.prefill_s(q) == pytest.approx((4 * 0.3 + 2048 * 1.5e-3) * 2.3 * 1.5)
    assert cd.repeats_of(q) == 3


def test_describe_prints_the_seed_and_every_setting():
    settings = cd.draw(cd.DEV_SEED, n=4)
    text = cd.describe(cd.DEV_SEED, settings)
    assert f"seed {cd.DEV_SEED}, 4 runs" in text
    assert all(s.label() in text for s in settings)


@pytest.mark.parametrize("kw", [{}, {"n": 3, "budget_s": 10}, {"n": 0}, {"budget_s": -1}])
def test_bad_draw_arguments_are_one_error(kw):
    with pytest.raises(NpuMoeError):
        cd.draw(1, **kw)


def test_prompts_are_log_uniform():
    prompts = [s.prompt_len for s in cd.draw(11, n=400)]
    below = sum(p < math.sqrt(128 * 2048) for p in prompts) / len(prompts)     # the geometric middle: 512
    assert 0.4 < below < 0.6


def test_the_measure_grid_spans_the_declared_held_out_grid():
    """Fit rows at every drawn chunk and up to the longest drawn context: a held-out run is never priced by
    extrapolating the fit beyond its rows."""
    from npumoe_lab.experiments.measure import grid
    for geom in ("tiny", "qwen3-30b-a3b"):
        prefills = grid(geom)["prefills"]
        assert {c for _, _, c, _ in prefills} >= ({32, 512} if geom != "tiny" else set(cd.CHUNKS))
        assert max(p for _, _, _, p in prefills) >= cd.PROMPT_RANGE[1]


def test_every_drawn_prompt_is_one_its_workload_can_build():
    from npumoe_lab.experiments.cpu_draw import draw, min_prompt_len
    for seed in (5372108, 20261203, 7):
        assert all(s.prompt_len >= min_prompt_len(s.workload) for s in draw(seed, n=60))
