"""A built plan's hash, taken from its layers' JSON pieces, equals sha256_json of its whole body (the hash every
stored plan and result row carries), over variants, residency rules, budgets, thresholds and platforms; the pieced
text is the whole encoding character for character; a built plan saved and loaded keeps its hash."""
import json

import pytest

from npumoe_lab.models.base import MoELayerSpec
from npumoe_lab.planning.plan import Plan, build_plan, variant_plan
from npumoe_lab.planning.plan_json import LayerPieces
from npumoe_lab.sim.geometries import load_geometry
from npumoe_lab.sim.run import _cached_source
from npumoe_lab.utils import canonical_json, sha256_json

from tests.planning.test_plan import SPECS, profile  # noqa: F401 - the module's fixture

KNOBS = [dict(), dict(residency="cost", group_size=8), dict(residency="all", group_size=4, tiers=2, percentile=80),
         dict(residency="threshold", hot_threshold=3.5), dict(residency="threshold"),
         dict(residency="all", npu_memory_budget_bytes=8 * 3 * 2048 * 768 * 2),
         dict(npu_program_budget=3), dict(npu_program_budget="off", tiers=1)]


def _held(plan):
    assert plan.hash == sha256_json(plan._body())
    again = Plan.from_dict(json.loads(plan.to_json()))        # the whole-body path checks and hashes it again
    assert again.hash == plan.hash


@pytest.mark.parametrize("knobs", KNOBS, ids=repr)
@pytest.mark.parametrize("platform", ["m2-max", "m4-max", None])
def test_pieced_hash_is_the_whole_bodys(profile, knobs, platform):  # noqa: F811
    if platform is None and knobs.get("residency") in ("cost", None):
        knobs = {**knobs, "residency": "threshold", "hot_threshold": 1.0}
    _held(build_plan(profile, SPECS, platform, **knobs))


@pytest.mark.parametrize("variant", ["npumoe", "npumoe-base", "npumoe-t", "npumoe-tg", "naive-npu", "npumoe-spill"])
def test_every_variant_of_a_simulated_geometry(variant):
    _, _, geo = load_geometry("phi-tiny-moe", hf_config=False)
    specs = list(geo.moe)
    prof = _cached_source("synthetic:gini=0.6", tuple(specs), 0).calibration_profile(specs, 256, 0)
    for knobs in (dict(group_size=4, tiers=3, percentile=90, residency="cost"), dict(group_size=16, tiers=1)):
        _held(variant_plan(prof, variant, specs, "m2-ultra", knobs))


def test_pieces_give_the_layers_own_text(profile):  # noqa: F811
    lp = build_plan(profile, SPECS, "m2-max", residency="cost", group_size=8).layers[1]
    pieces = LayerPieces(lp)
    for flags, thr in [([g["resident"] for g in lp["groups"]], None), ([True] * len(lp["groups"]), 2.25),
                       ([False] * len(lp["groups"]), 7)]:
        want = {**lp, "hot_threshold": thr, "groups": [{**g, "resident": f} for g, f in zip(lp["groups"], flags)]}
        assert pieces.text(flags, thr) == canonical_json(want)
    with pytest.raises(ValueError, match="keys"):
        LayerPieces({**lp, "extra": 1})


def test_plans_on_shared_parts_equal_plans_built_afresh(profile):  # noqa: F811
    """build_plan keeps what plans of one profile share (profile._plan_parts: per-layer tiers and groups, static
    layers per knobs). Every plan of a sequence over knobs and platforms, built on the parts the earlier ones left
    (layer specs given once as plain namespaces, once as MoELayerSpecs of the same shape), equals the same plan
    built with nothing kept."""
    typed = [MoELayerSpec(s.layer, s.n_experts, s.top_k, s.hidden, s.intermediate, "softmax_topk", True, 0, False,
                          "swiglu", "qwen3_moe") for s in SPECS]
    by_group_size = [dict(group_size=g, residency=r) for g in (1, 4, 16) for r in ("cost", "all")]   # same tiers
    cases = [(knobs, platform, specs) for knobs in KNOBS + by_group_size for platform in ("m2-max", "m4-max")
             for specs in (SPECS, typed)]
    shared = [build_plan(profile, specs, platform, **knobs).to_json() for knobs, platform, specs in cases]
    assert "_plan_parts" in profile.__dict__
    for (knobs, platform, specs), got in zip(cases, shared):
        profile.__dict__.pop("_plan_parts", None)           # nothing kept: every part computed for this plan
        assert got == build_plan(profile, specs, platform, **knobs).to_json(), (knobs, platform)
