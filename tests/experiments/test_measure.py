"""`npumoe-lab measure`: its rows parse under the measurement schema, say what op they time at what cost, and carry
the host load; bad flags are one line and exit 2 with nothing written."""
import sys

import pytest
import torch

from npumoe_lab.cli import main as cli
from npumoe_lab.devices.cost import expert_ffn_cost
from npumoe_lab.devices.measurements import load_measurements
from npumoe_lab.experiments import measure
from tests.model_zoo import tiny_model


@pytest.fixture(scope="module")
def rows():
    model = tiny_model("qwen3_moe")            # hidden 64, 8 experts top-2, expert FFN 32
    out = measure.group_rows(model, "zoo", 8, (1, 4), 3, "cpu", None, "fp32")
    out += measure.prefill_rows(model, "zoo", "static", 2, 16, 32, 3, "cpu", None, "fp32")
    out += measure.prefill_rows(model, "zoo", "hf", 2, 16, 32, 3, "cpu", None, "fp32")
    out += measure.prefill_rows(model, "zoo", "mixed", 2, 16, 32, 3, "cpu", None, "fp32")
    return out


def test_rows_parse_under_the_schema(rows, tmp_path):
    path = measure.write_measurements(rows, tmp_path, "cpu")
    df = load_measurements(path)
    assert len(df) == len(rows) and df["id"].is_unique
    assert set(df["role"]) == {"fit"} and set(df["chip"]) == {measure.host_chip()}
    assert df["chip"].iloc[0].startswith("host-") and set(df["path"]) == {"torch"}
    assert (df["measured_s"] > 0).all()
    assert {"gemm", "attention", "router", "gather_scatter", "call_floor"} <= set(df["kind"])


def test_group_rows_carry_the_engine_cost_of_their_shape(rows):
    groups = [r for r in rows if "-group-" in r["id"]]
    assert [r["work"]["gemms"][0][3] for r in groups] == [1, 4]       # G experts per group, in order
    for r in groups:
        G, C, H, I = r["work"]["cost"]["shape"]
        assert (C, H, I) == (8, 64, 32)
        assert r["work"]["cost"]["flops"] == pytest.approx(6.0 * G * C * H * I)      # by hand
        assert r["work"]["cost"]["bytes"] == pytest.approx(expert_ffn_cost(G, C, H, I).bytes)
        assert r["work"]["gemms"] == [[C, 2 * I, H, G], [C, H, I, G]]


def test_prefill_rows_cover_every_op_of_each_chunk_with_its_context(rows):
    static = [r for r in rows if "-static-" in r["id"]]
    per_chunk = {}
    for r in static:
        per_chunk.setdefault(r["work"]["context"], set()).add(r["work"]["op"])
    assert sorted(per_chunk) == [0, 16]                 # 32 tokens in chunks of 16: contexts 0 and 16
    for ops in per_chunk.values():
        assert {"attention", "router", "dispatch", "pack", "expert_group", "scatter", "other"} <= ops
    rest = next(r for r in static if r["work"]["op"] == "other")
    # chunk, layers, hidden, vocab, LM-head rows (the first of two chunks projects none)
    assert rest["work"]["cost"]["shape"] == [16, 2, 64, 128, 0]
    assert any(r["work"]["op"] == "experts_hf" for r in rows if "-hf-" in r["id"])


def test_rows_record_host_load(rows):
    for r in rows:
        assert isinstance(r["host_busy"], bool) and r["repeats"] == 3
        assert r["confidence"] == ("L" if r["host_busy"] else "H")
        assert r["host_busy"] == bool(r["host_busy_reason"])


@pytest.mark.parametrize("args,message", [
    (["--device", "tpu"], "unknown --device 'tpu'"),
    (["--device", "cpu", "--repeats", "1"], "--repeats must be an integer >= 3"),
    (["--device", "cpu", "--geometry", "nope"], "unknown geometry"),
])
def test_bad_flags_are_one_line_and_exit_2(args, message, tmp_path, capsys):
    out = tmp_path / "m"
    assert cli(["measure", *args, "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1
    assert not out.exists() or not any(out.iterdir())


@pytest.mark.skipif(sys.platform == "darwin", reason="off macOS only")
def test_coreml_off_macos_is_one_clear_error(tmp_path, capsys):
    assert cli(["measure", "--device", "coreml", "--out", str(tmp_path / "m")]) == 2
    err = capsys.readouterr().err.strip()
    assert "macOS" in err and len(err.splitlines()) == 1
    assert not (tmp_path / "m").exists()


def test_onnxruntime_groups_are_timed_through_the_runtime():
    pytest.importorskip("onnxruntime")
    model = tiny_model("qwen3_moe")
    rows = measure.group_rows(model, "zoo", 8, (1, 2), 3, "onnxruntime", "onnxruntime", "fp32")
    assert [r["path"] for r in rows] == ["onnxruntime"] * 2 and all(r["measured_s"] > 0 for r in rows)
    assert [r["work"]["gemms"][0][3] for r in rows] == [1, 2]


def test_mixed_prefills_time_cold_experts_and_scatter_with_parts(rows):
    mixed = [r for r in rows if "-mixed-" in r["id"]]
    names = {r["id"].rsplit("-", 1)[1] for r in mixed}
    assert {"cold", "scatter", "dispatch"} <= names and any(r["work"]["op"] == "expert_group" for r in mixed)


def test_rows_carry_the_stream_context_the_host_model_prices(rows):
    """Each scatter row says its layer's packed rows (the pack row of the same chunk and layer), its dynamic parts
    (the cold/spill rows there) and the chunk's tokens; each chunk rest says how many ops its chunk recorded."""
    for mode in ("static", "mixed"):
        prefill = [r for r in rows if f"-{mode}-" in r["id"]]
        for sc in (r for r in prefill if r["work"]["op"] == "scatter"):
            where = sc["id"].rsplit("-", 1)[0]                       # ...-k<chunk>-l<layer>
            same = [r for r in prefill if r["id"].rsplit("-", 1)[0] == where]
            pack = next(r for r in same if r["work"]["op"] == "pack")
            n_dyn = sum(r["work"]["op"] == "experts_dynamic" for r in same)
            assert sc["work"]["cost"]["context"] == {"static_rows": pack["work"]["cost"]["shape"][0],
                                                     "parts": n_dyn, "tokens": 16}
        for rest in (r for r in prefill if r["work"]["op"] == "other"):
            chunk = rest["id"].split("-k")[1].split("-")[0]
            n = sum(r["id"].split("-k")[1].split("-")[0] == chunk and r["work"]["op"] != "other" for r in prefill)
            assert rest["work"]["cost"]["context"] == {"chunk_ops": n}
    assert any(r["work"]["cost"]["context"]["parts"] for r in rows if "-mixed-" in r["id"]
               and r["work"]["op"] == "scatter")
