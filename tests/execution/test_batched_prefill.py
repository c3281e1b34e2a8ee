"""A batch of B prompts prefilled together equals each prompt prefilled alone: logits, KV cache, drop / pad counts
and the op stream (so the modeled TTFT), under pruning plans whose capacities bind (the reference is run_prefill)."""
import pytest
import torch

import npumoe_lab.execution.engine as engine
from npumoe_lab.devices import get_platform
from npumoe_lab.errors import NpuMoeError
from npumoe_lab.execution.batched import batched_prefill
from npumoe_lab.execution.calibrate import calibration_profile
from npumoe_lab.execution.experts import attach, detach
from npumoe_lab.execution.runtime import PrefillConfig, run_prefill
from npumoe_lab.models import TINY_MODEL_DIR, load_model
from npumoe_lab.planning.plan import variant_plan


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    if not (TINY_MODEL_DIR / "config.json").is_file():
        pytest.skip("the bundled tiny model is not built")
    mp = pytest.MonkeyPatch()
    mp.setenv("NPUMOE_CACHE", str(tmp_path_factory.mktemp("cache")))
    yield load_model("tiny")
    mp.undo()


def _prompts(tok, B, T, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(5, tok.vocab_size if hasattr(tok, "vocab_size") else 4000, (B, T), generator=g)


@pytest.mark.parametrize("variant,saliency,percentile,T", [("npumoe-tg", "random", 50, 400),
                                                            ("npumoe-tg", "weight_x_norm", 70, 512),
                                                            ("npumoe", "weight_x_norm", 50, 300)])
def test_batch_equals_each_sequence_alone(tiny, variant, saliency, percentile, T, monkeypatch):
    model, tok = tiny
    splits = []                             # groups run expert by expert on their filled rows (engine.py)
    for name in ("emulated_split_ffn", "_run_split"):   # fp16 emulated here; a native fp16 GEMM elsewhere
        monkeypatch.setattr(engine, name, lambda *a, f=getattr(engine, name): splits.append(1) or f(*a))
    monkeypatch.setattr(engine, "SPLIT_CAST_GROUPS", True)     # split native fp16 groups too (off by default)
    plat = get_platform("m2-max")
    profile = calibration_profile(model, tok, "mixed", 256, 2048)
    plan = variant_plan(profile, variant, model, platform=plat, percentile=percentile, saliency=saliency)
    config = PrefillConfig(plat, 256, pad_token_id=tok.pad_token_id or 0)
    ids = _prompts(tok, 3, T, seed=T)
    attach(model, plan, npu_dtype=config.npu_dtype)
    try:
        together = batched_prefill(model, ids, config)
        alone = [run_prefill(model, ids[b:b + 1], config) for b in range(3)]
    finally:
        detach(model)
    dropped = 0
    for got, want in zip(together, alone):
        assert torch.equal(got.logits, want.logits)
        for lg, lw in zip(got.past_key_values.layers, want.past_key_values.layers):
            assert torch.equal(lg.keys, lw.keys) and torch.equal(lg.values, lw.values)
        assert [(c, l, vars(s)) for c, l, s in got.stats] == [(c, l, vars(s)) for c, l, s in want.stats]
        assert [(o, d) for o, d, _ in got.ops] == [(o, d) for o, d, _ in want.ops]
        assert got.summary["ttft_s"] == want.summary["ttft_s"]
        assert got.summary["drop_rate"] == want.summary["drop_rate"]
        dropped += sum(s.dropped for *_, s in got.stats)
    assert dropped > 0                      # the plans really prune: equality covers the drops
    assert splits                           # and the split groups
    # the three sequences' own counts differ: nothing was pooled across them
    assert len({sum(s.dropped for *_, s in r.stats) for r in alone}) > 1


def test_batch_needs_a_plan_and_a_modeled_platform(tiny):
    model, tok = tiny
    ids = _prompts(tok, 2, 64, seed=0)
    with pytest.raises(NpuMoeError, match="plan executor"):
        batched_prefill(model, ids, PrefillConfig(get_platform("m2-max"), 64))
    with pytest.raises(NpuMoeError, match="measured"):
        batched_prefill(model, ids, PrefillConfig(get_platform("cpu"), 64))
