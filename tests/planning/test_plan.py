"""Plan: built from a profile, validated, hashed, saved/loaded against the model; variants; CLI; bad input."""
import hashlib
import json
from pathlib import Path
from types import SimpleNamespace

import pandas as pd
import pytest

from npumoe_lab import cli
from npumoe_lab.planning.profile import CalibrationProfile
from npumoe_lab.errors import NpuMoeError
from npumoe_lab.planning.plan import Plan, build_plan, variant_plan
from npumoe_lab.planning.tiers import assign_tiers

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "skewed_counts.parquet"
SPECS = [SimpleNamespace(layer=l, n_experts=64, top_k=2, hidden=2048, intermediate=768) for l in (0, 1)]


@pytest.fixture(scope="module")
def profile():
    c = pd.read_parquet(FIXTURE)
    counts = pd.concat([c.assign(layer=0), c.assign(layer=1, count=c["count"][::-1].to_numpy())],
                       ignore_index=True)[["layer", "expert", "chunk_id", "count"]]
    stats = counts.groupby(["layer", "expert"], as_index=False)["count"].sum().assign(
        weight_sum=0.0, weight_sq_sum=0.0, norm_sum=0.0)
    meta = {"chunk": 512, "model_fingerprint": "f" * 64, "workload": "synthetic", "n_tokens": 64 * 512,
            "layers": [vars(s) for s in SPECS]}
    return CalibrationProfile(counts, stats, meta)


def test_residency_default_is_makespan_and_threshold_is_the_knob(profile):
    assert build_plan(profile, SPECS).knobs["residency"] == "makespan"
    assert build_plan(profile, SPECS, hot_threshold=4.0).knobs["residency"] == "threshold"
    with pytest.raises(NpuMoeError, match="residency 'threshold' only"):
        build_plan(profile, SPECS, residency="cost", hot_threshold=4.0)
    assert build_plan(profile, SPECS, platform=None).knobs["residency"] == "threshold"   # no cost model
    with pytest.raises(NpuMoeError, match="needs a platform"):
        build_plan(profile, SPECS, platform=None, residency="cost")
    with pytest.raises(NpuMoeError, match="needs a platform"):
        build_plan(profile, SPECS, platform=None, residency="makespan")


def test_default_plan_structure(profile):
    plan = build_plan(profile, SPECS, platform="m2-max", residency="threshold")
    assert [lp["layer"] for lp in plan.layers] == [0, 1]
    for lp in plan.layers:
        ref = assign_tiers(profile.count_matrix(lp["layer"]), 512, 2, 64)
        assert lp["capacity"] == ref.capacity.tolist() and lp["tier_capacities"] == list(ref.tier_capacities)
        sizes = [len(g["experts"]) for g in lp["groups"]]
        assert max(sizes) <= 8 and sorted(e for g in lp["groups"] for e in g["experts"]) == list(range(64))
        # threshold default: one balanced expert's load 512 * 2 / 64 = 16 tokens per chunk
        assert lp["hot_threshold"] == 16
        assert all(g["resident"] == (g["expected_tokens"] >= 16) for g in lp["groups"])
        assert 0 < lp["expected_padding"] < 1 and 0 <= lp["expected_drop_rate"] < 0.05
    # the hash is sha256 of the canonical JSON without the hash
    body = {k: v for k, v in json.loads(plan.to_json()).items() if k != "hash"}
    assert plan.hash == hashlib.sha256(json.dumps(body, sort_keys=True, separators=(",", ":")).encode()).hexdigest()
    assert plan.resident_mask(0).sum() == sum(len(g["experts"]) for g in plan.layers[0]["groups"] if g["resident"])


def test_save_load_and_tamper(profile, tmp_path):
    plan = build_plan(profile, None, group_size=4)       # specs from the profile's meta
    p = plan.save(tmp_path / "plan.json")
    back = Plan.load(p)
    assert back.to_dict() == plan.to_dict()
    d = json.loads(p.read_text())
    d["layers"][0]["capacity"][0] += 8          # no longer its tier's capacity
    (tmp_path / "bad.json").write_text(json.dumps(d))
    with pytest.raises(NpuMoeError, match="differs from its tier's capacity"):
        Plan.load(tmp_path / "bad.json")
    d = json.loads(p.read_text())
    d["knobs"]["group_size"] = 5
    (tmp_path / "edited.json").write_text(json.dumps(d))
    with pytest.raises(NpuMoeError, match="does not match its content"):
        Plan.load(tmp_path / "edited.json")
    with pytest.raises(NpuMoeError, match=f"built for model {'f' * 12} but this model is {'a' * 12}"):
        plan.check_model("a" * 64)


def test_variants(profile):
    kw = build_plan(profile, SPECS).build_kwargs()
    base = variant_plan(profile, "npumoe-base", SPECS, **kw)
    lp = base.layers[0]
    assert len(lp["tier_capacities"]) == 1                # one capacity for every expert (uniform)
    assert all(len(g["experts"]) == 1 and g["resident"] for g in lp["groups"])
    naive = variant_plan(profile, "naive-npu", SPECS, **kw).layers[0]
    assert naive["capacity"] == [max(8, -(-int(m) // 8) * 8) for m in profile.count_matrix(0).max(axis=1)]
    assert naive["expected_drop_rate"] == 0
    t = variant_plan(profile, "npumoe-t", SPECS, **kw).layers[0]
    tg = variant_plan(profile, "npumoe-tg", SPECS, **kw).layers[0]
    full = variant_plan(profile, "npumoe", SPECS, **kw).layers[0]
    assert t["capacity"] == tg["capacity"] == full["capacity"]
    assert len(t["groups"]) == 64 and len(tg["groups"]) < 64 and all(g["resident"] for g in tg["groups"])
    assert 0 < sum(g["resident"] for g in full["groups"]) < len(full["groups"])
    with pytest.raises(NpuMoeError, match="without a plan"):
        variant_plan(profile, "anemll", SPECS)


def test_uniform_rule(profile):
    lp = build_plan(profile, SPECS, capacity_rule="uniform", uniform_slack=16).layers[0]
    assert lp["tier_capacities"] == [32]                  # prototype rule 512 * 2 / 64 + 16, aligned to 8


def test_cost_residency_and_budget(profile):
    cost = build_plan(profile, SPECS, residency="cost", group_size=8)
    assert any(g["resident"] for lp in cost.layers for g in lp["groups"])
    one_group = 8 * 3 * 2048 * 768 * 2
    small = build_plan(profile, SPECS, residency="all", npu_memory_budget_bytes=one_group)
    res = [g for lp in small.layers for g in lp["groups"] if g["resident"]]
    assert sum(g["weight_bytes"] for g in res) <= one_group and res


def test_summary_reports_caps(profile):
    plan = build_plan(profile, SPECS, group_size=64, tiers=3)
    s = plan.summary()
    assert "tier capacities" in s and "capped to the tier's" in s and "pad" in s
    print("\n" + s)


def test_bad_input(profile):
    with pytest.raises(NpuMoeError, match="saliency='gate' is not one of weight_x_norm"):
        build_plan(profile, SPECS, saliency="gate")
    with pytest.raises(NpuMoeError, match="min_capacity"):
        build_plan(profile, SPECS, min_capacity=0)
    with pytest.raises(NpuMoeError, match="capacity 0"):
        build_plan(profile, SPECS, multipliers=(4, 0, 1))
    with pytest.raises(NpuMoeError, match="larger than the"):
        build_plan(profile, SPECS, group_size=64, strict=True)
    with pytest.raises(NpuMoeError, match="group_size=0 must be a number >= 1"):
        build_plan(profile, SPECS, group_size=0)


def test_real_model_profile_and_fingerprints(tmp_path):
    try:
        from tests.model_zoo import tiny_model
        from tests.execution.test_calibration import TEXT, CharTokenizer
    except ImportError:   # tests/ run as a plain directory
        from model_zoo import tiny_model
        from test_calibration import TEXT, CharTokenizer
    from npumoe_lab.execution.calibrate import calibrate
    model, other = tiny_model("qwen3_moe", max_position_embeddings=64), tiny_model("qwen3_moe", seed=1,
                                                                                  max_position_embeddings=64)
    prof = calibrate(model, CharTokenizer(), chunk=16, tokens=64, text=TEXT)
    plan = build_plan(prof, model, group_size=2, min_capacity=1, align=1)
    assert len(plan.layers) == 2 and plan.layers[0]["n_experts"] == 8
    path = plan.save(tmp_path / "p.json")
    Plan.load(path, model)
    with pytest.raises(NpuMoeError, match="built for model .* but this model is"):
        Plan.load(path, other)
    with pytest.raises(NpuMoeError, match="calibration profile is of model .* but this model is"):
        build_plan(prof, other)


def test_cli(profile, tmp_path, capsys):
    profile.save(tmp_path / "prof")
    out = tmp_path / "plan.json"
    rc = cli.main(["plan", "--profile", str(tmp_path / "prof"), "--tiers", "3", "--group-size", "4",
                   "--hot-threshold", "20", "--saliency", "router_weight", "--platform", "m2-max", "--out", str(out)])
    assert rc == 0
    plan = Plan.load(out)
    assert plan.saliency == "router_weight" and plan.knobs["group_size"] == 4 and plan.knobs["hot_threshold"] == 20
    capsys.readouterr()
    assert cli.main(["plan", "--show", str(out)]) == 0
    assert plan.hash[:12] in capsys.readouterr().out
    assert cli.main(["plan", "--show", str(tmp_path / "missing.json")]) == 2
    args = cli.build_parser(["calibrate"]).parse_args(
        ["calibrate", "--model", "tiny", "--workload", "mixed", "--chunk", "512", "--tokens", "4096", "--out", "d"])
    assert (args.chunk, args.tokens, args.workload) == (512, 4096, "mixed")


def test_cli_end_to_end(tmp_path, capsys):
    """calibrate -> plan -> plan --show through the console script, on a saved tiny model with a word tokenizer."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast
    try:
        from tests.model_zoo import tiny_model
    except ImportError:
        from model_zoo import tiny_model
    from npumoe_lab.train.corpora import bundled_text
    words = pd.Series(bundled_text("drama", "calib").split()).value_counts().index[:124]
    vocab = {"<pad>": 0, "<s>": 1, "</s>": 2, "<unk>": 3, **{w: i + 4 for i, w in enumerate(words)}}
    core = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    model_dir = tmp_path / "model"
    PreTrainedTokenizerFast(tokenizer_object=core, bos_token="<s>", eos_token="</s>", unk_token="<unk>",
                            pad_token="<pad>", model_max_length=64).save_pretrained(model_dir)
    tiny_model("qwen3_moe", max_position_embeddings=64).save_pretrained(model_dir)
    prof, plan = tmp_path / "prof", tmp_path / "plan.json"
    assert cli.main(["calibrate", "--model", str(model_dir), "--workload", "drama", "--chunk", "16", "--tokens",
                     "64", "--out", str(prof)]) == 0
    assert CalibrationProfile.load(prof).meta["n_chunks"] == 4
    assert cli.main(["plan", "--profile", str(prof), "--model", str(model_dir), "--tiers", "2", "--group-size", "2",
                     "--align", "1", "--min-capacity", "1", "--platform", "none", "--out", str(plan)]) == 0
    capsys.readouterr()
    assert cli.main(["plan", "--show", str(plan)]) == 0
    assert Plan.load(plan).hash[:12] in capsys.readouterr().out
    assert cli.main(["calibrate", "--model", str(model_dir), "--chunk", "128", "--tokens", "256",
                     "--out", str(tmp_path / "x")]) == 2
    assert "chunk 128 is larger than the model context of 64" in capsys.readouterr().err
