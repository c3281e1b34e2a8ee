"""The plan IR: the engine places the layout's typed groups as they are; each invariant is checked in one place;
knobs enter a plan as one PlanKnobs; a platform object travels into the plan unchanged."""
import json

import pytest
import torch

from npumoe_lab.devices import get_platform
from npumoe_lab.errors import NpuMoeError
from npumoe_lab.execution.engine import PlanExecutor
from npumoe_lab.planning.knobs import PlanKnobs
from npumoe_lab.planning.layout import ExecutionLayout, GroupLayout, LayerLayout
from npumoe_lab.planning.plan import Plan, build_plan, variant_plan
from tests.planning.test_plan import SPECS, profile  # noqa: F401  (the module's profile fixture)

# experts 0..4: group 0 resident (2, 0) at 8, group 1 cold (1, 3) at 4, group 2 resident (4,) at 16
LAYER = LayerLayout(0, 5, 2, 16, 8, (GroupLayout(0, (2, 0), 8, "npu", 0), GroupLayout(1, (1, 3), 4, "cpu", 1),
                                     GroupLayout(2, (4,), 16, "npu", None)))
LAYOUT = ExecutionLayout((LAYER,), "position", False, 64, None)


def test_dynamic_cold_experts_get_no_static_slot_and_no_gap_group():
    layout, cold = PlanExecutor(LAYOUT, [], cold="dynamic").static_layout(0)
    assert [(g.id, g.experts, g.capacity, g.start) for g in layout.groups] == [(0, (2, 0), 8, 0), (2, (4,), 16, 16)]
    assert layout.capacity.tolist() == [8, 0, 8, 0, 16] and layout.total_rows == 32   # hand-computed
    assert layout.offset[[2, 0, 4]].tolist() == [0, 8, 16]
    assert cold.tolist() == [False, True, False, True, False]


def test_static_cold_groups_are_placed_in_layout_order():
    layout, _ = PlanExecutor(LAYOUT, [], cold="static").static_layout(0)
    assert [g.id for g in layout.groups] == [0, 1, 2] and [g.resident for g in layout.groups] == [True, False, True]
    assert layout.capacity.tolist() == [8, 4, 8, 4, 16] and layout.total_rows == 16 + 8 + 16
    assert layout.offset[[2, 0, 1, 3, 4]].tolist() == [0, 8, 16, 20, 24]


def test_every_expert_once_is_the_layouts_check_for_plans_too(profile):  # noqa: F811
    with pytest.raises(NpuMoeError, match="groups must hold each of its 5 experts exactly once"):
        LayerLayout(0, 5, 2, 16, 8, LAYER.groups[:2])
    d = json.loads(build_plan(profile, SPECS, group_size=4).to_json())
    g = d["layers"][0]["groups"][0]
    g["experts"] = g["experts"][1:]                       # an expert in no group: a plan file edited by hand
    d.pop("hash")
    with pytest.raises(NpuMoeError, match="groups must hold each of its 64 experts exactly once"):
        Plan.from_dict(d)


def test_plan_and_layout_say_the_same_about_another_model(profile):  # noqa: F811
    plan = build_plan(profile, SPECS)
    messages = []
    for check in (plan.check_model, plan.compile().check_model):
        with pytest.raises(NpuMoeError) as info:
            check("a" * 64)
        messages.append(str(info.value))
    assert messages[0] == messages[1] and "f" * 12 in messages[0] and "a" * 12 in messages[0]


def test_compiled_groups_carry_the_plans_tiers(profile):  # noqa: F811
    plan = build_plan(profile, SPECS, group_size=4)
    lay = plan.compile().layer(0)
    assert [g.tier for g in lay.groups] == [g["tier"] for g in plan.layers[0]["groups"]]
    assert [g.resident for g in lay.groups] == [g["resident"] for g in plan.layers[0]["groups"]]


def test_knobs_enter_as_one_plan_knobs_object(profile):  # noqa: F811
    by_kwargs = build_plan(profile, SPECS, tiers=2, group_size=4)
    assert build_plan(profile, SPECS, knobs=PlanKnobs(tiers=2, group_size=4)).hash == by_kwargs.hash
    assert build_plan(profile, SPECS, knobs={"tiers": 2}, group_size=4).hash == by_kwargs.hash
    assert build_plan(profile, SPECS, knobs=by_kwargs.knobs).hash == by_kwargs.hash   # a plan's own knobs rebuild it
    assert PlanKnobs.of(PlanKnobs(tiers=2), group_size=4) == PlanKnobs(tiers=2, group_size=4)
    assert PlanKnobs.of({"tiers": 2}, tiers=3).tiers == 3                               # overrides win
    assert PlanKnobs.given({"tiers": None, "group_size": 4}) == {"group_size": 4}
    with pytest.raises(NpuMoeError, match="unknown plan knob"):
        PlanKnobs.of(PlanKnobs(), n_tiers=2)
    with pytest.raises(NpuMoeError, match="group_size=0 must be a number >= 1"):
        PlanKnobs.of(PlanKnobs(), group_size=0)


def test_a_variants_forced_knobs_win_over_the_given_ones(profile):  # noqa: F811
    naive = variant_plan(profile, "naive-npu", SPECS, "m2-max", PlanKnobs(group_size=4), tiers=2)
    assert naive.knobs["group_size"] == 1 and naive.knobs["capacity_rule"] == "max_observed"
    assert naive.knobs["tiers"] == 2


def test_a_platform_object_travels_into_the_plan_unchanged(profile):  # noqa: F811
    # a graph limit of two experts' weights (3 * 2048 * 768 * 2 bytes each): an override a name would lose
    small = get_platform("m2-max", npu_graph_limit_bytes=2 * 3 * 2048 * 768 * 2)
    by_name = build_plan(profile, SPECS, "m2-max", group_size=8, residency="all")
    by_object = build_plan(profile, SPECS, small, group_size=8, residency="all")
    assert by_object.platform == by_name.platform == "m2-max"
    assert max(len(g["experts"]) for lp in by_name.layers for g in lp["groups"]) == 8
    assert max(len(g["experts"]) for lp in by_object.layers for g in lp["groups"]) == 2


def test_packing_layout_takes_the_typed_groups_only():
    from npumoe_lab.core.packing import Layout, plan_dispatch
    layout = Layout.from_groups(3, [GroupLayout(7, (2,), 1, "npu")])
    d, _ = plan_dispatch(torch.tensor([[0], [2], [2]]), torch.ones(3, 1), layout)
    assert d.slot.tolist() == [-1, 0, -1]          # expert 0 has no slot; expert 2 one, first come
    assert layout.groups[0].id == 7
