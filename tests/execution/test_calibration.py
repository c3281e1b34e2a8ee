"""Calibration: chunked prefill with a carried KV cache must count exactly what one full forward routes; reports
against plain-Python formulas; save/load; bad input."""
import itertools
import random
import json

import numpy as np
import pandas as pd
import pytest
import torch

try:
    from tests.model_zoo import tiny_model
except ImportError:   # tests/ run as a plain directory
    from model_zoo import tiny_model
from npumoe_lab.execution.calibrate import CalibrationProfile, calibrate
from npumoe_lab.errors import NpuMoeError
from npumoe_lab.execution.routing import capture_routing



class CharTokenizer:
    """ids 3..127 from characters; bos = 1 (the tiny test models have vocab 128)."""
    bos_token_id, eos_token_id, model_max_length = 1, 2, 10**30

    def encode(self, text, add_special_tokens=False):
        return [3 + ord(c) % 125 for c in text]


TEXT = "".join(chr(97 + (i * 7 + i // 5) % 26) + (" " if i % 6 == 5 else "") for i in range(400))


def reference_counts(model, docs, chunk):
    """Counts per (layer, expert, chunk) from ONE full forward per document (no chunking, no cache)."""
    out = {}
    cid = 0
    for doc in docs:
        recs = capture_routing(model, torch.tensor([doc]))
        for c in range(len(doc) // chunk):
            for r in recs:
                idx = r.topk_idx[c * chunk:(c + 1) * chunk].reshape(-1).tolist()
                for e in idx:
                    out[(r.layer, e, cid)] = out.get((r.layer, e, cid), 0) + 1
            cid += 1
    return out, recs


@pytest.fixture(scope="module")
def model():
    return tiny_model("qwen3_moe", max_position_embeddings=64)


def test_chunked_counts_match_full_forward(model):
    tok = CharTokenizer()
    prof = calibrate(model, tok, chunk=16, tokens=128, text=TEXT[:126], seed=0)
    # context 64 -> documents of 64 tokens ([bos] + 63 text tokens), 2 of them, 4 chunks each, in seeded order
    assert prof.meta["n_chunks"] == 8 and prof.meta["n_documents"] == 2 and prof.meta["n_tokens"] == 128
    docs = [[1] + tok.encode(TEXT)[i * 63:(i + 1) * 63] for i in range(2)]
    random.Random(0).shuffle(docs)
    ref, _ = reference_counts(model, docs, 16)
    got = {(int(r.layer), int(r.expert), int(r.chunk_id)): int(r.count) for r in prof.counts.itertuples() if r.count}
    assert got == ref
    # every chunk routes chunk * top_k assignments per layer
    assert (prof.counts.groupby(["layer", "chunk_id"])["count"].sum() == 32).all()
    assert prof.count_matrix(prof.layers[0]).shape == (8, 8)


def test_saliency_stats_and_coactivation(model):
    tok = CharTokenizer()
    doc = [1] + tok.encode(TEXT)[:63]
    prof = calibrate(model, tok, chunk=32, tokens=64, text={"only": TEXT[:63]})
    recs = capture_routing(model, torch.tensor([doc]))
    for r in recs:
        st = prof.stats[prof.stats["layer"] == r.layer].set_index("expert")
        for e in range(8):
            sel = r.topk_idx == e
            assert st.loc[e, "count"] == int(sel.sum())
            assert st.loc[e, "weight_sum"] == pytest.approx(float(r.topk_weight[sel].sum()), rel=1e-4, abs=1e-6)
            assert st.loc[e, "weight_sq_sum"] == pytest.approx(float((r.topk_weight[sel] ** 2).sum()), rel=1e-4,
                                                               abs=1e-6)
            rows = sel.any(dim=1)
            assert st.loc[e, "norm_sum"] == pytest.approx(float(r.hidden_norm[rows].sum()), rel=1e-4)
        co = prof.coactivation_matrix(r.layer)
        pairs = [tuple(sorted(row)) for row in r.topk_idx.tolist()]
        for a, b in itertools.combinations(range(8), 2):
            assert co[a, b] == co[b, a] == pairs.count((a, b))


def test_bundled_domain_text_and_roundtrip(model, tmp_path):
    prof = calibrate(model, CharTokenizer(), workload="drama", chunk=32, tokens=64, out=tmp_path / "p")
    assert prof.meta["workload"] == "drama" and prof.meta["n_tokens"] == 64
    meta = json.loads((tmp_path / "p" / "profile.json").read_text())
    assert {"model_fingerprint", "chunk", "n_tokens", "n_chunks", "versions", "created", "layers"} <= set(meta)
    back = CalibrationProfile.load(tmp_path / "p")
    pd.testing.assert_frame_equal(back.counts, prof.counts)
    assert back.meta == json.loads(json.dumps(prof.meta, default=str))
    np.testing.assert_array_equal(back.coactivation_matrix(1), prof.coactivation_matrix(1))


def test_bad_input(model, tmp_path):
    tok = CharTokenizer()
    with pytest.raises(NpuMoeError, match="calibration text is empty"):
        calibrate(model, tok, chunk=16, tokens=64, text="")
    with pytest.raises(NpuMoeError, match="chunk 128 is larger than the model context of 64"):
        calibrate(model, tok, chunk=128, tokens=256, text=TEXT)
    with pytest.raises(NpuMoeError, match="tokens 8 is less than one chunk of 16"):
        calibrate(model, tok, chunk=16, tokens=8, text=TEXT)
    with pytest.raises(NpuMoeError, match="not a calibration profile"):
        CalibrationProfile.load(tmp_path)


def synthetic(totals_by_layer, n_chunks=2):
    rows = []
    for layer, totals in totals_by_layer.items():
        for e, t in enumerate(totals):
            for c in range(n_chunks):   # split each total over the chunks
                rows.append((layer, e, c, t // n_chunks + (t % n_chunks if c == 0 else 0)))
    counts = pd.DataFrame(rows, columns=["layer", "expert", "chunk_id", "count"])
    stats = counts.groupby(["layer", "expert"], as_index=False)["count"].sum().assign(
        weight_sum=0.0, weight_sq_sum=0.0, norm_sum=0.0)
    return CalibrationProfile(counts, stats, {"chunk": 512, "model_fingerprint": "x"})


def test_reports_against_plain_formulas():
    totals = [50, 20, 10, 10, 5, 5, 0, 0]
    p = synthetic({0: totals, 1: [10] * 8})
    n, mean = len(totals), sum(totals) / len(totals)
    gini_ref = sum(abs(a - b) for a in totals for b in totals) / (2 * n * n * mean)
    assert p.gini(0) == pytest.approx(gini_ref) and p.gini(1) == pytest.approx(0.0)
    np.testing.assert_allclose(p.load_share(0), np.array(totals) / 100)
    assert p.experts_covering(0, 0.5) == 1          # 50 %
    assert p.experts_covering(0, 0.8) == 3          # 50 + 20 + 10
    assert p.experts_covering(1, 0.5) == 4
    s = p.summary()
    assert s.loc[0, "experts_80"] == 3 and s.loc[0, "top1_share"] == pytest.approx(0.5)
    q = synthetic({0: [0, 20, 50, 10, 5, 5, 0, 10], 1: [10] * 8})
    j = p.hot_set_jaccard(q, 2)
    # top-2 layer 0: {0, 1} vs {2, 1} -> 1/3; layer 1 all tied -> lowest ids {0, 1} both -> 1
    assert j.loc[0] == pytest.approx(1 / 3) and j.loc[1] == 1.0
    assert p.count_matrix(0)[0].tolist() == [25, 25]


def test_documents_round_robin_over_sources():
    from npumoe_lab.execution.calibrate import calibration_documents
    tok = CharTokenizer()
    docs = calibration_documents(tok, "mixed", 16, 32, 10**6, text={"a": "a" * 100, "b": "b" * 60})
    # a: [bos]+31 chars x3 (the 7-char tail is under one chunk: dropped); b: [bos]+31, then [bos]+29 cut to 16
    srcs = ["a" if d[1] == tok.encode("a")[0] else "b" for d in docs]
    assert srcs == ["a", "b", "a", "b", "a"] and sorted(map(len, docs)) == [16, 32, 32, 32, 32]
    assert all(len(d) % 16 == 0 and d[0] == 1 for d in docs)
    with pytest.raises(NpuMoeError, match="unknown calibration workload 'novels'; use 'mixed'"):
        calibration_documents(tok, "novels", 16, 32, 64)
