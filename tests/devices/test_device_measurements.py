"""Measurement rows as data: the schema's errors name file, row and what is wrong; the shipped rows obey the
fit/validate rule; a row's work becomes the OpCost its numbers say."""
import pytest
import yaml

from npumoe_lab.devices.measurements import KINDS, WHOLE_KINDS, load_measurements
from npumoe_lab.devices.workload import row_op
from npumoe_lab.errors import NpuMoeError
from npumoe_lab.utils import REPO_ROOT

GOOD = {"id": "r1", "chip": "m2-max", "device": "npu", "path": "coreml", "kind": "gemm",
        "work": {"gemms": [[64, 128, 256, 2]], "weight_format": "fp16", "calls": 3}, "measured_s": 1e-3,
        "source": {"ref": "somewhere/repo:file.md", "read": "table row 3"}, "confidence": "M", "role": "fit"}


def _write(tmp_path, rows, name="m.yaml", defaults=None):
    path = tmp_path / name
    path.write_text(yaml.safe_dump({"description": "t", "defaults": defaults or {}, "rows": rows}))
    return path


def test_good_row_loads(tmp_path):
    df = load_measurements(_write(tmp_path, [GOOD]))
    assert list(df.id) == ["r1"] and df.measured_s[0] == 1e-3 and df.file[0].endswith("m.yaml")


@pytest.mark.parametrize("change, msg", [
    ({"measured_s": "drop"}, "missing field.*measured_s"),
    ({"source": "drop"}, "missing field.*source"),
    ({"kind": "matmul"}, "unknown kind 'matmul'"),
    ({"chip": "m9-max"}, "unknown chip 'm9-max'"),
    ({"path": "metal"}, "unknown path 'metal'"),
    ({"role": "train"}, "unknown role"),
    ({"confidence": "X"}, "unknown confidence"),
    ({"work": {"gemms": [[64, 128, 256, 2]], "weight_format": "int3"}}, "weight_format 'int3' is unknown"),
    ({"work": {"gemms": [[64, 128, 0, 1]], "weight_format": "fp16"}}, r"\[M, N, K, count\]"),
    ({"work": {"weight_format": "fp16"}}, "work needs gemms"),
    ({"measured_s": -1.0}, "measured_s must be a positive"),
    ({"measured_s": None}, "only a power row"),
    ({"source": {"ref": "x"}}, "source must be"),
    ({"extra": 1}, "unknown field"),
    ({"kind": "model_forward", "work": {"geometry": "qwen3-30b-a3b", "rows": 64, "weight_format": "fp16"}},
     "only be role validate"),
    ({"kind": "model_forward", "role": "validate"}, "whole forward"),
    ({"kind": "model_forward", "role": "validate", "work": {"geometry": "qwen3-30b-a3b", "rows": 6, "streams": 4,
                                                          "weight_format": "fp16"}}, "multiple of work.streams"),
    ({"kind": "model_forward", "role": "validate", "work": {"geometry": "qwen3-30b-a3b", "rows": 4,
                                                          "weight_passes": 0, "weight_format": "fp16"}},
     "weight_passes must be"),
])
def test_bad_row_is_one_error_naming_file_and_row(tmp_path, change, msg):
    row = {k: v for k, v in {**GOOD, **change}.items() if v != "drop"}
    path = _write(tmp_path, [row])
    with pytest.raises(NpuMoeError, match=msg) as err:
        load_measurements(path)
    assert str(path) in str(err.value) and "'r1'" in str(err.value)
    assert "\n" not in str(err.value)


def test_duplicate_ids_across_files_and_defaults(tmp_path):
    _write(tmp_path, [GOOD], "a.yaml")
    _write(tmp_path, [{k: v for k, v in GOOD.items() if k not in ("chip", "path")}], "b.yaml",
           defaults={"chip": "m4-max", "path": "direct"})
    with pytest.raises(NpuMoeError, match="b.yaml row 'r1': id already used in .*a.yaml"):
        load_measurements(tmp_path)
    (tmp_path / "a.yaml").unlink()
    df = load_measurements(tmp_path)
    assert (df.chip[0], df.path[0]) == ("m4-max", "direct")      # defaults fill what the row leaves out
    with pytest.raises(NpuMoeError, match="do not exist"):
        load_measurements(tmp_path / "nothing")


def test_gemm_row_work_as_opcost():
    """[64, 128, 256] x 2 per call, 3 calls, fp16: numbers by hand."""
    op = row_op({"id": "r1", "work": GOOD["work"]})
    assert op.flops == 3 * 2 * (2 * 64 * 128 * 256)
    assert op.weight_bytes == 3 * 2 * 128 * 256 * 2
    assert op.bytes == op.weight_bytes + 3 * (64 * 256 + 64 * 128) * 2     # activations once per distinct shape
    assert (op.calls, op.rows, op.gemm, op.lut_params) == (3, 64, (64, 128, 256), 0.0)
    lut = row_op({"id": "r2", "work": {"gemms": [[1, 100, 200, 1]], "weight_format": "lut4"}})
    assert lut.weight_bytes == 100 * 200 * 0.5 and lut.lut_params == 100 * 200


def test_forward_row_work_as_opcost():
    """A 2-layer dense SwiGLU forward: FLOPs and stored weights by hand."""
    g = {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
         "intermediate_size": 128, "vocab_size": 1000}
    op = row_op({"id": "f", "work": {"geometry": g, "rows": 8, "context": 24, "calls": 2, "weight_format": "int8"}})
    hd, kv = 16, 2 * 16
    attn_w = 64 * 64 + 2 * 64 * kv + 64 * 64
    mlp_w = 3 * 64 * 128
    assert op.weight_bytes == 2 * (attn_w + mlp_w) + 64 * 1000                # int8: 1 byte per weight
    keys = 24 + 8
    assert op.attn_flops == 2 * 2 * (2.0 * 4 * 8 * keys * hd)
    assert op.flops == 2 * 8 * (2 * (attn_w + mlp_w) + 64 * 1000) + op.attn_flops
    assert (op.calls, op.rows) == (2, 8)


def test_shipped_measurements_obey_the_rule():
    df = load_measurements(REPO_ROOT / "data/measurements")
    assert df.id.is_unique and set(df.kind) <= set(KINDS)
    assert not ((df.role == "fit") & df.kind.isin(WHOLE_KINDS)).any()       # whole models: validate only
    assert (df.role == "fit").sum() >= 30 and (df.role == "validate").sum() >= 10
    assert df[df.role == "fit"].chip.nunique() >= 3
    for r in df.itertuples():
        row_op(r)                                   # every row prices


def test_forward_streams_and_weight_passes_by_hand():
    """A batched decode step of B streams reads B KV caches (each `context` + 1 keys) and scores each token against
    its own cache; weight_passes moves the weights that many times. Hand-computed for one layer, no LM head."""
    g = {"hidden_size": 64, "num_hidden_layers": 1, "num_attention_heads": 4, "intermediate_size": 128,
         "vocab_size": 10}
    work = {"geometry": g, "rows": 8, "context": 24, "weight_format": "fp16", "lm_head": False}
    one = row_op({"id": "a", "work": work})
    many = row_op({"id": "b", "work": {**work, "streams": 8, "weight_passes": 3}})
    hd, kv = 16, 64
    assert one.attn_flops == 2 * 2.0 * 4 * 8 * (24 + 8) * hd          # one sequence: keys = past + chunk
    assert many.attn_flops == 2 * 2.0 * 4 * 8 * (24 + 1) * hd         # 8 streams of 1 token: keys = past + 1
    weights = (4 * 64 * 64 + 3 * 64 * 128) * 2.0
    kv_read_one, kv_read_many = 2 * 32 * kv * 2.0, 8 * 2 * 25 * kv * 2.0
    assert one.weight_bytes == many.weight_bytes == weights             # stored weights: the same
    assert many.bytes - one.bytes == pytest.approx(2 * weights + kv_read_many - kv_read_one)
    assert (many.flops - many.attn_flops) == (one.flops - one.attn_flops)   # projections and MLP: all rows
