"""Difficulty knobs of the workloads and their calibrated defaults, against plain re-parsing of the
prompts and the held-out text."""
from __future__ import annotations

import random
import re

import pytest
import torch

from npumoe_lab.errors import NpuMoeError
from npumoe_lab.train import corpora
from npumoe_lab.train.tokenizer import train_tokenizer
from npumoe_lab.workloads import get_workload, workload_options
from npumoe_lab.workloads.base import DOMAINS, eval_haystack
from npumoe_lab.workloads.difficulty import TINY_DIFFICULTY, difficulty_for
from npumoe_lab.workloads.ruler import synthetic_text


@pytest.fixture(scope="module")
def tok():
    texts = [corpora.bundled_text(d, "calib") for d in DOMAINS] + [synthetic_text(random.Random(0), 200)]
    return train_tokenizer(None, model_max_length=2304, vocab_size=1024, texts=texts)


def test_key_nouns_makes_keys_share_their_last_word(tok):
    for s in get_workload("ruler-multikey", n_needles=12, key_nouns=1).samples(tok, 512, 4, seed=0):
        keys = re.findall(r"special magic numbers for ([a-z]+-[a-z]+) is: \d+\.", tok.decode(s.input_ids))
        assert len(keys) == len(set(keys)) == 12
        assert len({k.split("-")[1] for k in keys}) == 1 and s.meta["key"] in keys
    free = get_workload("ruler-multikey", n_needles=12).samples(tok, 512, 4, seed=0)
    nouns = [{k.split("-")[1] for k in re.findall(r"numbers for ([a-z]+-[a-z]+) is:", tok.decode(s.input_ids))}
             for s in free]
    assert max(map(len, nouns)) > 1


def test_fewshot_query_len_and_shot_caps(tok):
    for s in get_workload("fewshot-cls", query_len=6).samples(tok, 512, 4, seed=0):
        assert len(s.input_ids) == 512
        tail = s.input_ids[-40:]
        p_ids, s_ids = tok.encode("Passage: ", add_special_tokens=False), tok.encode("\nSource:", add_special_tokens=False)
        body = s.input_ids[:-len(s_ids)]
        start = max(i for i in range(len(body) - len(p_ids) + 1) if body[i:i + len(p_ids)] == p_ids) + len(p_ids)
        assert len(body) - start == 6, tail
    two = get_workload("fewshot-cls", max_shots=2).samples(tok, 512, 3, seed=0)
    assert all(s.meta["n_shots"] == 2 and tok.decode(s.input_ids).count("\nSource:") == 3 for s in two)
    short = get_workload("fewshot-cls", snippet=12).samples(tok, 512, 2, seed=0)
    assert short[0].meta["n_shots"] > get_workload("fewshot-cls").samples(tok, 512, 1, seed=0)[0].meta["n_shots"]


def test_lm_next_target_is_the_token_after_the_window(tok):
    w = get_workload("lm-next", top_k=2)
    hay = eval_haystack(tok)
    for s in w.samples(tok, 256, 8, seed=3):
        toks = list(hay.tokens[s.meta["domain"]])
        st = s.meta["start"]
        assert s.input_ids == [tok.bos_token_id] + toks[st:st + 255] and s.meta["target"] == toks[st + 255]
        logits = torch.zeros(len(tok))
        logits[s.meta["target"]], logits[(s.meta["target"] + 1) % len(tok)] = 1.0, 2.0
        assert w.score_next(s, logits) == 1.0                        # second most likely, top_k = 2
        assert get_workload("lm-next", top_k=1).score_next(s, logits) == 0.0
    assert [x.meta["domain"] for x in w.samples(tok, 256, 4)] == list(DOMAINS)


@pytest.mark.parametrize("name,opts,needle", [
    ("ruler-multikey", {"n_needles": 0}, "n_needles must be an int >= 1"),
    ("ruler-multikey", {"n_needles": 50, "key_nouns": 1}, "distinct keys"),
    ("ruler-vt", {"n_chains": 2.5}, "n_chains must be an int >= 1"),
    ("fewshot-cls", {"snippet": 0}, "snippet must be an int >= 1"),
    ("fewshot-cls", {"query_len": -1}, "query_len must be"),
    ("lm-next", {"top_k": 0}, "top_k must be an int >= 1"),
    ("ruler-vt", {"n_hops": 3}, "has no option 'n_hops'; its options: n_vars, n_chains"),
])
def test_bad_knob_values(name, opts, needle):
    with pytest.raises(NpuMoeError, match=re.escape(needle)):
        get_workload(name, **opts)


def test_settings_the_prompt_cannot_hold(tok):
    with pytest.raises(NpuMoeError, match="too short"):
        get_workload("ruler-multikey", n_needles=40).samples(tok, 512, 1)
    with pytest.raises(NpuMoeError, match="too short"):
        get_workload("ruler-vt", n_vars=4, n_chains=10).samples(tok, 512, 1)


def test_calibrated_defaults_and_overrides():
    assert set(TINY_DIFFICULTY) == {"ruler-multikey", "ruler-vt", "fewshot-cls", "lm-next"}
    for name, d in TINY_DIFFICULTY.items():
        assert set(d.options) <= set(workload_options(name))
        assert d.ref_score is None or 0.4 <= d.ref_score <= 0.9     # the informative range
        assert difficulty_for(name) == d
    moved = difficulty_for("ruler-multikey", 1024)
    assert moved.prompt_len == 1024 and moved.ref_score is None     # not calibrated there: no score claimed


def test_recorded_reference_scores_are_the_n300_scan():
    """TINY_DIFFICULTY's ref_score / ref_n are the rows of the recorded reference scan (bench/accuracy_curve.py
    --reference-only, docs/figures/accuracy-reference-scan-tiny-n300.csv), rounded to 3 decimals, same settings."""
    from pathlib import Path

    import pandas as pd
    scan = pd.read_csv(Path(__file__).resolve().parents[2] / "docs/figures/accuracy-reference-scan-tiny-n300.csv")
    assert set(scan.workload) == set(TINY_DIFFICULTY)
    for r in scan.itertuples():
        d = TINY_DIFFICULTY[r.workload]
        assert (d.ref_n, d.label()) == (r.n, r.difficulty)
        assert d.ref_score == pytest.approx(round(r.ref_score, 3), abs=1e-12) and r.in_range
