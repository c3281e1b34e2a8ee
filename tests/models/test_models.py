"""Registry, describe, fingerprint and load_model over every supported family (one shared runner per check,
parametrised by family), with layer geometry checked against the weight tensors themselves."""
import json

import pytest
import torch
from tests.model_zoo import FAMILY_NAMES, tiny_config, tiny_model, token_batch

from npumoe_lab.errors import NpuMoeError
from npumoe_lab.models import FAMILIES, describe, find_moe_blocks, get_family, load_model, loading, model_fingerprint

EXPECTED = {  # family -> (MoE layers, routing, n_shared_experts, has_bias, act, norm_topk_prob)
    "qwen3_moe": ([0, 1], "softmax_topk", 0, False, "swiglu", True),
    "qwen2_moe": ([0, 1], "softmax_topk", 1, False, "swiglu", False),
    "olmoe": ([0, 1], "softmax_topk", 0, False, "swiglu", False),
    "mixtral": ([0, 1], "softmax_topk", 0, False, "swiglu", True),
    "phimoe": ([0, 1], "sparsemixer", 0, False, "swiglu", False),
    "gpt_oss": ([0, 1], "topk_softmax", 0, True, "gpt_oss", True),
    "deepseek_v3": ([1, 2], "sigmoid_group_topk", 1, False, "swiglu", True),
    "granitemoe": ([0, 1], "topk_softmax", 0, False, "swiglu", True),
}


def test_registry_has_every_required_family():
    assert set(FAMILIES) == set(FAMILY_NAMES) == set(EXPECTED)


@pytest.mark.parametrize("family", FAMILY_NAMES)
def test_describe_matches_weights(family):
    model = tiny_model(family)
    layers, routing, n_shared, has_bias, act, norm = EXPECTED[family]
    specs, refs = describe(model), find_moe_blocks(model)
    assert [s.layer for s in specs] == [r.layer for r in refs] == layers == get_family(model).moe_layers(model.config)
    for spec, ref in zip(specs, refs):
        assert (spec.routing, spec.n_shared_experts, spec.has_bias, spec.act, spec.norm_topk_prob, spec.family) == \
            (routing, n_shared, has_bias, act, norm, family)
        assert (spec.n_experts, spec.top_k, spec.hidden, spec.intermediate) == (8, 2, 64, 32)
        layer = model.model.layers[spec.layer]
        assert ref.block is getattr(layer, get_family(family).block_attr)
        assert ref.router is getattr(ref.block, get_family(family).router_attr)
        # geometry read back from the fused weights: [E, 2I, H] / [E, H, I] (transposed for gpt_oss)
        e, a, b = ref.experts.gate_up_proj.shape
        assert e == spec.n_experts and {a, b} == {spec.hidden, 2 * spec.intermediate}
        assert ref.experts.down_proj.numel() == spec.n_experts * spec.hidden * spec.intermediate
        shared = get_family(family).shared_attr
        assert (shared is not None and hasattr(ref.block, shared)) == (spec.n_shared_experts > 0)


def test_dense_layers_follow_the_config():
    model = tiny_model("qwen3_moe", num_hidden_layers=4, decoder_sparse_step=2, mlp_only_layers=[3])
    assert [s.layer for s in describe(model)] == [1]
    assert get_family(model).moe_layers(model.config) == [1]


def test_get_family_rejects_unsupported_model_types():
    with pytest.raises(NpuMoeError, match=r"'llama' is not supported; supported MoE families: deepseek_v3"):
        get_family("llama")
    assert get_family(tiny_config("olmoe")) is FAMILIES["olmoe"]


def test_fingerprint_is_stable_cached_and_sensitive():
    a, b = tiny_model("mixtral"), tiny_model("mixtral")
    fa = model_fingerprint(a)
    assert len(fa) == 64 and fa == model_fingerprint(b)
    assert a._npumoe_fingerprint == fa
    b.config._name_or_path = "/somewhere/else"  # where a checkpoint lives is not what it computes
    b.config._experts_implementation = "grouped_mm"
    assert model_fingerprint(b, refresh=True) == fa
    with torch.no_grad():
        b.model.layers[1].mlp.experts.down_proj[3, 0, 0] += 1e-3
    assert model_fingerprint(b) == fa  # cached until refreshed
    assert model_fingerprint(b, refresh=True) != fa
    # the same weights in the dtype a run computes in: one fingerprint (a plan calibrated in fp32 runs in bf16)
    assert model_fingerprint(tiny_model("mixtral", dtype=torch.bfloat16)) == fa
    assert model_fingerprint(tiny_model("mixtral", rms_norm_eps=1e-3)) != fa


def test_fingerprint_hashes_in_slices_what_one_whole_copy_hashes():
    """Weights are hashed slice by slice (no whole-size bf16 copy of a 1.6 GB expert stack): the digest is the one
    of the whole tensor's bf16 bytes, at any slice size, for float and integer tensors."""
    import hashlib
    from npumoe_lab.models.registry import _hash_bf16
    g = torch.Generator().manual_seed(0)
    for t in (torch.randn(3, 5, 7, generator=g), torch.randn(11, generator=g).to(torch.float16),
              torch.arange(13, dtype=torch.int64), torch.randn(4, 6, generator=g).t()):   # the last not contiguous
        whole = t.to(torch.bfloat16) if t.is_floating_point() else t
        want = hashlib.sha256(whole.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()).hexdigest()
        for block in (1, 6, 10, 1 << 26):
            h = hashlib.sha256()
            _hash_bf16(h, t, block_bytes=block)
            assert h.hexdigest() == want, (t.dtype, block)


@pytest.mark.parametrize("family", FAMILY_NAMES)
def test_load_model_round_trip(family, tmp_path):
    source = tiny_model(family)
    source.save_pretrained(tmp_path)
    model, tokenizer = load_model(tmp_path)
    assert tokenizer is None and not model.training
    assert model.config._attn_implementation == "eager" and model.dtype == torch.float32
    ids, mask = token_batch(20, batch=2, pad=5)
    source.set_experts_implementation(model.config._experts_implementation)
    with torch.no_grad():
        expected = source(input_ids=ids, attention_mask=mask).logits
        got = model(input_ids=ids, attention_mask=mask).logits
    assert torch.equal(expected, got)
    assert model_fingerprint(model) == model_fingerprint(source)


def test_load_model_upcasts_half_checkpoints_and_honours_dtype(tmp_path):
    source = tiny_model("qwen2_moe", dtype=torch.bfloat16)
    source.save_pretrained(tmp_path)
    model, _ = load_model(str(tmp_path))
    assert model.dtype == torch.float32
    assert torch.equal(model.lm_head.weight, source.lm_head.weight.float())
    assert load_model(tmp_path, dtype="bf16")[0].dtype == torch.bfloat16
    with pytest.raises(NpuMoeError, match="dtype 'int8' is not supported"):
        load_model(tmp_path, dtype="int8")


def test_load_model_errors(tmp_path, monkeypatch):
    with pytest.raises(NpuMoeError, match="is not a model directory \\(no config.json there\\)"):
        load_model(tmp_path)
    from transformers import AutoConfig
    AutoConfig.for_model("llama", hidden_size=64, num_hidden_layers=1).save_pretrained(tmp_path / "llama")
    with pytest.raises(NpuMoeError, match="'llama' is not supported; supported MoE families"):
        load_model(tmp_path / "llama")
    tiny_config("qwen3_moe", mlp_only_layers=[0, 1]).save_pretrained(tmp_path / "dense")
    with pytest.raises(NpuMoeError, match="has no MoE layers"):
        load_model(tmp_path / "dense")
    tiny_config("olmoe").save_pretrained(tmp_path / "noweights")
    with pytest.raises(NpuMoeError, match="could not load the weights"):
        load_model(tmp_path / "noweights")
    monkeypatch.setattr(loading, "TINY_MODEL_DIR", tmp_path / "npumoe-tiny")
    with pytest.raises(NpuMoeError, match="bundled tiny model is missing .* `npumoe-lab train-tiny`"):
        load_model("tiny")


def test_load_model_returns_the_saved_tokenizer_and_resolves_tiny(tmp_path, monkeypatch):
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast
    vocab = {w: i for i, w in enumerate(["<pad>", "<s>", "</s>", "hello", "world"])}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="<pad>"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    PreTrainedTokenizerFast(tokenizer_object=backend, pad_token="<pad>").save_pretrained(tmp_path)
    tiny_model("olmoe").save_pretrained(tmp_path)
    monkeypatch.setattr(loading, "TINY_MODEL_DIR", tmp_path)
    model, tokenizer = load_model("tiny")
    assert tokenizer("hello world")["input_ids"] == [3, 4]
    assert [s.layer for s in describe(model)] == [0, 1]


@pytest.mark.skipif(not (loading.TINY_MODEL_DIR / "config.json").is_file(), reason="tiny model not trained yet")
def test_load_bundled_tiny_model():
    model, tokenizer = load_model("tiny")
    assert describe(model) and tokenizer is not None
    config = json.loads((loading.TINY_MODEL_DIR / "config.json").read_text())
    assert get_family(model).model_type == config["model_type"]
