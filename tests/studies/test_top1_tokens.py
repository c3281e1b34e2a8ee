"""top1_tokens (the accuracy curve's per-position argmax, on fp32) against torch's own argmax in the logits' dtype:
the same indices, ties and NaN / inf included (widening bf16 / fp16 to fp32 is exact)."""
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from npumoe_lab.studies.accuracy_scoring import top1_tokens

SPECIALS = (float("nan"), float("inf"), float("-inf"))


@settings(max_examples=200, deadline=None)
@given(dtype=st.sampled_from([torch.bfloat16, torch.float16, torch.float32]), T=st.integers(1, 12),
       V=st.integers(1, 257), seed=st.integers(0, 2**31 - 1), special=st.sampled_from((None,) + SPECIALS))
def test_top1_tokens_equals_argmax_in_the_logits_dtype(dtype, T, V, seed, special):
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(-3, 4, (T, V), generator=g).to(dtype)        # few distinct values: ties in most rows
    if special is not None:
        x[torch.rand(T, V, generator=g) < 0.1] = special
    assert torch.equal(top1_tokens(x), x.argmax(-1))
