"""measure --device coreml's record -> rows, on a MADE-UP fixture of the record format (tests/fixtures/
coreml_measure_record.json says so): parsing, fallback flagging and the schema, not the numbers."""
import copy
import json
from pathlib import Path

import pytest

from npumoe_lab.devices.measurements import load_measurements
from npumoe_lab.errors import NpuMoeError
from npumoe_lab.experiments.measure import write_measurements
from npumoe_lab.experiments.measure_coreml import chip_of, rows_from_record

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "coreml_measure_record.json"


@pytest.fixture
def record():
    rec = json.loads(FIXTURE.read_text())
    assert "NOT A MEASUREMENT" in rec["_fixture"]
    return rec


def test_graphs_off_the_ane_are_flagged_and_never_rows(record):
    rows, fallbacks = rows_from_record(record)
    assert [f["id"] for f in fallbacks] == ["qwen3-30b-a3b-G8-C8"]
    assert fallbacks[0]["off_ane"] == ["silu on CPU", "mul on CPU"]
    assert all("G8-C8" not in r["id"] for r in rows) and len(rows) == 3


def test_rows_follow_the_schema(record, tmp_path):
    rows, fallbacks = rows_from_record(record)
    df = load_measurements(write_measurements(rows, tmp_path, "coreml", fallbacks, record))
    assert set(df["chip"]) == {"m2-max"} and set(df["path"]) == {"coreml"} and set(df["device"]) == {"npu"}
    assert set(df["role"]) == {"fit"}
    assert dict(zip(df["id"], df["kind"])) == {"coreml-m2-max-tiny-G1-C1": "call_floor",
                                               "coreml-m2-max-tiny-G4-C64": "gemm",
                                               "coreml-m2-max-qwen3-30b-a3b-G8-C512": "gemm"}
    g = df.set_index("id").loc["coreml-m2-max-qwen3-30b-a3b-G8-C512"]
    assert g["work"]["gemms"] == [[512, 1536, 2048, 8], [512, 2048, 768, 8]]
    assert g["measured_s"] == pytest.approx(0.0061)          # the median of the record's five times
    assert df.set_index("id")["power_w"].isna().tolist() == [True, False, False]
    assert (tmp_path / "coreml-record.json").is_file()


@pytest.mark.parametrize("brand,chip", [("Apple M2 Max", "m2-max"), ("Apple M4", "m4"), ("Apple M1 Ultra", "m1-ultra")])
def test_chip_names(brand, chip):
    assert chip_of(brand) == chip


def test_malformed_records_are_named(record):
    with pytest.raises(NpuMoeError, match="not an Apple"):
        rows_from_record({**record, "chip_brand": "Intel(R) Xeon(R)"})
    bad = copy.deepcopy(record)
    bad["graphs"][1]["times_s"] = [0.1]
    with pytest.raises(NpuMoeError, match="'tiny-G4-C64' needs >= 3"):
        rows_from_record(bad)
    bad = copy.deepcopy(record)
    del bad["graphs"][0]["placement"]
    with pytest.raises(NpuMoeError, match="graph 0 lacks"):
        rows_from_record(bad)
