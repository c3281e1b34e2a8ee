"""Every reader against an independent reader of the same fixture (tests/routing_data/fixtures, written in each
tool's documented format by make_fixtures.py): per-(layer, expert) counts recomputed straight from the source file
equal those of the imported schema (written by `npumoe-lab routing-import`, read back from parquet)."""
import base64
import csv
import json
import pickle
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from npumoe_lab.cli import main
from npumoe_lab.routing_data.schema import RoutingData

FIX = Path(__file__).parent / "fixtures"
TINY = "data/models/npumoe-tiny/config.json"        # 4 MoE layers, 32 experts, top-4


def _import(tmp_path, fmt, files, geometry=TINY, *extra):
    out = tmp_path / "imported"
    rc = main(["routing-import", "--format", fmt, *map(str, files), "--model-geometry", geometry, "--out", str(out),
               *extra])
    assert rc == 0
    return RoutingData.load(out)


def _schema_counts(data) -> Counter:
    c = data.counts.groupby(["layer", "expert"])["count"].sum()
    return Counter({(int(a), int(b)): int(v) for (a, b), v in c.items() if v})


def _csv_rows(name):
    with open(FIX / name, newline="") as f:
        return list(csv.reader(f))


def _from_array(arr, layers=range(4)) -> Counter:
    arr = np.asarray(arr)
    return Counter({(layer, int(e)): int(n) for j, layer in enumerate(layers)
                    for e, n in zip(*np.unique(arr[:, j], return_counts=True))})


def test_llama_headerless(tmp_path):
    want = Counter((int(a), int(b)) for a, b in _csv_rows("llama_moe_trace.csv"))
    data = _import(tmp_path, "llama-moe-trace", [FIX / "llama_moe_trace.csv"])
    assert data.kind == "counts" and _schema_counts(data) == want
    assert set(data.counts["tokens"]) == {48}


def test_llama_phase_form(tmp_path):
    rows = _csv_rows("llama_moe_trace_phase.csv")[1:]
    want = Counter((int(r[2]), int(r[4])) for r in rows)
    data = _import(tmp_path, "llama-moe-trace", [FIX / "llama_moe_trace_phase.csv"])
    assert data.kind == "trace" and _schema_counts(data) == want
    assert (data.selections["phase"] == "prefill").sum() == sum(r[0] == "prefill" for r in rows)


def test_llama_pos_form(tmp_path):
    rows = _csv_rows("llama_moe_trace_pos.csv")[1:]
    want = Counter((int(r[1]), int(e)) for r in rows for e in r[2:])
    data = _import(tmp_path, "llama-moe-trace", [FIX / "llama_moe_trace_pos.csv"])
    assert _schema_counts(data) == want
    sel = data.selections
    assert set(sel.loc[sel["phase"] == "prefill", "token"]) == set(range(32))


def test_vllm_npy_and_json(tmp_path):
    arr = np.load(FIX / "vllm_routed_experts.npy")
    assert _schema_counts(_import(tmp_path / "a", "vllm-routed-experts", [FIX / "vllm_routed_experts.npy"])) == \
        _from_array(arr)
    doc = json.loads((FIX / "vllm_routed_experts.json").read_text())
    want = sum((_from_array(d["routed_experts"]) for d in doc), Counter())
    data = _import(tmp_path / "b", "vllm-routed-experts", [FIX / "vllm_routed_experts.json"])
    assert _schema_counts(data) == want
    assert (data.selections.query("rank == 0 and layer == 0")["phase"] == "prefill").sum() == 30 + 12


def test_sglang_base64(tmp_path):
    meta = json.loads((FIX / "sglang_response.json").read_text())["meta_info"]
    arr = np.frombuffer(base64.b64decode(meta["routed_experts"]), dtype="<i4").reshape(-1, 4, 4)
    data = _import(tmp_path, "sglang-routed-experts", [FIX / "sglang_response.json"])
    assert _schema_counts(data) == _from_array(arr)


def test_sglang_eplb(tmp_path):
    import torch
    lc = torch.load(FIX / "sglang_eplb.pt", weights_only=True)["logical_count"].numpy()
    want = Counter({(j, e): int(lc[j, e]) for j in range(4) for e in range(32) if lc[j, e]})
    assert _schema_counts(_import(tmp_path, "sglang-eplb", [FIX / "sglang_eplb.pt"])) == want


def test_trtllm(tmp_path):
    from safetensors.numpy import load_file
    want = Counter()
    for f in sorted((FIX / "trtllm").glob("rank*.safetensors")):
        for key, t in load_file(f).items():
            for e, n in enumerate(t):
                want[(int(key.split("_")[1]), e)] += int(n)
    want = Counter({k: v for k, v in want.items() if v})
    assert _schema_counts(_import(tmp_path, "trtllm-expert-stats", [FIX / "trtllm"])) == want


def test_hf_router_logits(tmp_path):
    import torch
    from safetensors.torch import load_file
    want = Counter()
    for key, lg in load_file(FIX / "hf_router_logits.safetensors").items():
        top = torch.topk(torch.softmax(lg, -1), 4, dim=-1).indices
        want.update((int(key.split(".")[-1]), int(e)) for e in top.reshape(-1))
    data = _import(tmp_path, "hf-router-logits", [FIX / "hf_router_logits.safetensors"])
    assert _schema_counts(data) == want
    w = data.selections.groupby(["layer", "token"])["weight"].sum()
    np.testing.assert_allclose(w, 1.0, rtol=1e-5)          # norm_topk_prob: renormalised


def test_olmoe_pickle(tmp_path):
    want = Counter()
    for name in ("olmoe_arxiv.pkl", "olmoe_github.pkl"):
        with open(FIX / name, "rb") as f:
            for layer, c in zip((0, 7, 15), pickle.load(f)):      # a trusted fixture: plain pickle as reference
                want.update({(layer, int(e)): int(n) for e, n in c.items()})
    data = _import(tmp_path, "olmoe-expert-counts", [FIX / "olmoe_arxiv.pkl", FIX / "olmoe_github.pkl"],
                   "olmoe-1b-7b")
    assert _schema_counts(data) == want and data.domains == ["olmoe_arxiv", "olmoe_github"]
    assert data.provenance["layers"] == [0, 7, 15] and "3 of 16 MoE layers" in data.provenance["notes"][0]


def test_mbolt(tmp_path):
    doc = json.loads((FIX / "mbolt_coactivation.json").read_text())
    want = Counter({(x["layer"], e): n for x in doc["layers"] for e, n in enumerate(x["heat"]) if n})
    data = _import(tmp_path, "mbolt-coactivation", [FIX / "mbolt_coactivation.json"])
    assert _schema_counts(data) == want and set(data.counts["phase"]) == {"decode"}


def test_speculative_moe(tmp_path):
    rows = [json.loads(x) for x in (FIX / "speculative_moe.jsonl").read_text().splitlines()]
    want = Counter((r["layer"], e) for r in rows for e in r["experts"])
    data = _import(tmp_path, "speculative-moe-jsonl", [FIX / "speculative_moe.jsonl"])
    assert _schema_counts(data) == want
    sel = data.selections.query("rank == 0 and layer == 0")
    assert (sel["phase"] == "prefill").sum() == 30 and (sel["phase"] == "decode").sum() == 18


def test_vllm_moe_logger_warmup_removed(tmp_path, capsys):
    rows = [json.loads(x) for x in (FIX / "vllm_moe_logger_layer2.jsonl").read_text().splitlines()][1 + 150:]
    want = Counter((r["layer"], e) for r in rows for e in r["topk_ids"])
    data = _import(tmp_path, "vllm-moe-logger-jsonl", [FIX / "vllm_moe_logger_layer2.jsonl"])
    assert _schema_counts(data) == want
    assert "removed the first 150 rows" in capsys.readouterr().out
    assert any("removed the first 150 rows" in w for w in data.warnings)


def test_npumoe_profile(tmp_path):
    import pandas as pd
    from npumoe_lab.planning.profile import CalibrationProfile
    rng = np.random.default_rng(0)       # a small profile, saved as `npumoe-lab calibrate` saves one
    rows = [(layer, e, c, int(rng.integers(0, 9))) for layer in range(4) for e in range(32) for c in range(3)]
    counts = pd.DataFrame(rows, columns=["layer", "expert", "chunk_id", "count"])
    stats = counts.groupby(["layer", "expert"], as_index=False)["count"].sum().assign(
        weight_sum=0.0, weight_sq_sum=0.0, norm_sum=0.0)
    prof = CalibrationProfile(counts, stats, {"chunk": 8, "model_fingerprint": "x", "workload": "code"})
    prof.save(tmp_path / "prof")
    want = Counter({(int(a), int(b)): int(v) for (a, b), v in
                    prof.counts.groupby(["layer", "expert"])["count"].sum().items() if v})
    data = _import(tmp_path, "npumoe", [tmp_path / "prof"])
    assert _schema_counts(data) == want and data.domains == ["code"]


@pytest.mark.parametrize("fmt,name,defect", [
    ("llama-moe-trace", "bad_truncated.csv", "not integers"),
    ("llama-moe-trace", "bad_ids.csv", "outside 0..31"),
    ("llama-moe-trace", "bad_missing_layer.csv", "MoE layer(s) missing"),
    ("vllm-routed-experts", "bad_shape.json", "without 'routed_experts'"),
    ("olmoe-expert-counts", "bad_evil.pkl", "refused pickle"),
    ("llama-moe-trace", "bad_constant.csv", "same experts"),
])
def test_bad_input_one_line_exit_2_nothing_written(tmp_path, capsys, fmt, name, defect):
    out = tmp_path / "new" / "out"
    geometry = "olmoe-1b-7b" if name.endswith(".pkl") else TINY
    rc = main(["routing-import", "--format", fmt, str(FIX / name), "--model-geometry", geometry, "--out", str(out)])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and len(err.splitlines()) == 1, err
    assert name in err and defect in err, err
    assert not (tmp_path / "new").exists()


def test_topk_of_another_geometry_refused(tmp_path, capsys):
    rc = main(["routing-import", "--format", "vllm-routed-experts", str(FIX / "vllm_routed_experts.npy"),
               "--model-geometry", "olmoe-1b-7b", "--out", str(tmp_path / "o")])
    err = capsys.readouterr().err
    assert rc == 2 and "layers" in err and not (tmp_path / "o").exists()


def test_restricted_unpickler_reads_counters_only(tmp_path):
    from npumoe_lab.routing_data.safe_pickle import load_restricted
    ok = load_restricted(FIX / "olmoe_arxiv.pkl")
    assert isinstance(ok[0], Counter)
    (tmp_path / "x.pkl").write_bytes(pickle.dumps({"a": np.zeros(3)}))     # an ndarray: not allowed either
    with pytest.raises(Exception, match="refused pickle"):
        load_restricted(tmp_path / "x.pkl")
