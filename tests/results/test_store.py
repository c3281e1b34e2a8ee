"""Results store: atomic parquet rows, recursive loading, stable dtypes, provenance kept, clear errors."""
from __future__ import annotations

import threading
from dataclasses import dataclass

import pandas as pd
import pyarrow.parquet as pq
import pytest

from npumoe_lab.errors import NpuMoeError
from npumoe_lab.results import store
from npumoe_lab.results.store import load_results, load_timelines, write_rows, write_timeline


def _row(**kw):
    row = dict(model="tiny", workload="ruler-vt", variant="npumoe", platform="m4-ane", prompt_len=256, chunk=64,
               repeat=0, ttft_s=0.5, energy_j=1.25, timing_source="modeled", plan_hash="p1", platform_hash="h1",
               model_fingerprint="f1")
    row.update(kw)
    return row


def test_round_trip_keeps_values_provenance_and_dtypes(tmp_path):
    path = write_rows([_row(), _row(repeat=1, ttft_s=0.75)], tmp_path / "run")
    assert path.parent == tmp_path / "run" and path.name.startswith("rows-") and path.suffix == ".parquet"
    df = load_results(tmp_path)
    assert df["ttft_s"].tolist() == [0.5, 0.75] and df["repeat"].tolist() == [0, 1]
    assert list(df.columns[:7]) == list(store.KEY_COLUMNS)
    for col in ("plan_hash", "platform_hash", "model_fingerprint", "git_commit", "versions", "host", "created",
                "timing_source"):
        assert df[col].notna().all(), col
    assert df["plan_hash"].tolist() == ["p1", "p1"]
    assert str(df["prompt_len"].dtype) == "Int64" and df["ttft_s"].dtype == "float64"
    assert str(df["created"].dtype) == "datetime64[us, UTC]" and df["model"].dtype == "str"


def test_untimed_rows_need_no_source_and_given_provenance_is_kept(tmp_path):
    rows = [_row(ttft_s=None, energy_j=None, timing_source=None, host="lab-mac", git_commit=None),
            _row(repeat=1, host=None, git_commit="abc123")]
    write_rows(rows, tmp_path)
    df = load_results(tmp_path)
    assert df["timing_source"].isna().tolist() == [True, False]
    assert df["host"].tolist() == ["lab-mac", store.provenance()["host"]]            # only the missing one filled
    assert df["git_commit"].tolist() == [store.provenance()["git_commit"], "abc123"]


def test_many_files_recursive_union_of_columns_stable_dtypes(tmp_path):
    write_rows([_row(platform=None, chunk=None, timing_source="measured")], tmp_path / "a")
    write_rows(pd.DataFrame([_row(variant="reference", group_size=4)]), tmp_path / "b" / "deep")
    df = load_results(tmp_path).sort_values("variant").reset_index(drop=True)
    assert df["variant"].tolist() == ["npumoe", "reference"]
    assert df["platform"].isna().tolist() == [True, False] and df["chunk"].isna().tolist() == [True, False]
    assert str(df["chunk"].dtype) == "Int64" and str(df["group_size"].dtype) == "Int64"
    assert df["group_size"].isna().tolist() == [True, False]


def test_default_names_never_collide_between_concurrent_writers(tmp_path):
    threads = [threading.Thread(target=write_rows, args=([_row(repeat=i)], tmp_path)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(list(tmp_path.glob("rows-*.parquet"))) == 8
    assert sorted(load_results(tmp_path)["repeat"]) == list(range(8))
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")], "temp files left behind"


def test_crash_mid_write_leaves_old_file_and_no_partial(tmp_path, monkeypatch):
    good = write_rows([_row()], tmp_path, name="rows-fixed")

    def broken(table, where, **kw):
        where.write(b"PAR1 partial")
        raise OSError("disk full")

    monkeypatch.setattr(pq, "write_table", broken)
    with pytest.raises(OSError):
        write_rows([_row(ttft_s=9.0)], tmp_path, name="rows-fixed")
    assert [p.name for p in tmp_path.iterdir()] == [good.name]
    assert load_results(tmp_path)["ttft_s"].tolist() == [0.5]


def test_loader_skips_temp_archived_and_timeline_files(tmp_path):
    write_rows([_row()], tmp_path)
    (tmp_path / ".rows-x.parquet.123.tmp").write_bytes(b"garbage from a killed writer")
    write_rows([_row(repeat=5)], tmp_path / "cells" / "k" / "_attempts" / "001")

    @dataclass
    class Event:
        name: str
        device: str
        start: float
        duration: float
        deps: list

    write_timeline([Event("l0.experts", "npu", 0.0, 0.1, []), Event("l0.attn", "cpu", 0.1, 0.2, ["l0.experts"])],
                   tmp_path)
    assert load_results(tmp_path)["repeat"].tolist() == [0]
    tl = load_timelines(tmp_path)
    assert tl["device"].tolist() == ["npu", "cpu"] and tl["deps"].tolist() == ["[]", '["l0.experts"]']


def test_untagged_parquet_with_key_columns_is_loaded(tmp_path):
    pd.DataFrame([_row()]).to_parquet(tmp_path / "external.parquet")
    pd.DataFrame({"layer": [0], "expert": [1], "count": [3]}).to_parquet(tmp_path / "counts.parquet")
    assert len(load_results(tmp_path)) == 1


@pytest.mark.parametrize("rows, match", [
    ([{"model": "tiny", "variant": "npumoe"}], "lack key column.*workload.*platform"),
    ([_row(timing_source=None)], "timing_source"),
    ([_row(timing_source="guessed")], "measured or modeled"),
    # only the second row has a time (energy alone), and it has no source: the first row's source does not cover it
    ([_row(ttft_s=None, energy_j=None), _row(ttft_s=None, timing_source=None)], "energy_j.*measured or modeled"),
    ([_row(prompt_len="long")], "prompt_len.*numbers"),
    ([], "at least one row"),
    (_row(), "wrap it"),
])
def test_bad_rows_raise_one_clear_error(tmp_path, rows, match):
    with pytest.raises(NpuMoeError, match=match):
        write_rows(rows, tmp_path)
    assert not list(tmp_path.iterdir())


def test_load_errors_name_the_problem(tmp_path):
    with pytest.raises(NpuMoeError, match="does not exist"):
        load_results(tmp_path / "nope")
    with pytest.raises(NpuMoeError, match="no result rows"):
        load_results(tmp_path)
    (tmp_path / "rows-broken.parquet").write_bytes(b"not parquet at all")
    with pytest.raises(NpuMoeError, match="rows-broken.parquet.*move it"):
        load_results(tmp_path)
    with pytest.raises(NpuMoeError, match="out_dir is None"):
        write_rows([_row()], None)


def test_content_name_is_the_rows_own(tmp_path):
    # the same rows (created included) write one file; one value changed writes another
    df = pd.DataFrame([_row(created="2026-12-05T00:00:00+00:00"), _row(repeat=1, created="2026-12-05T00:00:00+00:00")])
    a, b = write_rows(df, tmp_path), write_rows(df.copy(), tmp_path)
    c = write_rows(df.assign(ttft_s=[0.5, 0.7500000001]), tmp_path)
    assert a == b and a != c and len(list(tmp_path.glob("rows-*.parquet"))) == 2
    assert load_results(tmp_path).shape[0] == 4


def test_normalize_of_typed_and_untyped_columns_agree():
    # a frame already in the fixed dtypes (as a sweep writes it) and the same values as plain objects
    raw = pd.DataFrame([_row(chunk="64", ttft_s="0.5", prompt_len=256.0, extra={"b": [1, 2]}),
                        _row(repeat=1, chunk=None, model=None, extra=[3])], dtype=object)
    once = store.normalize(raw)
    twice = store.normalize(once)
    pd.testing.assert_frame_equal(once, twice, check_exact=True)
    assert str(once["chunk"].dtype) == "Int64" and once["chunk"].tolist()[0] == 64 and pd.isna(once["chunk"][1])
    assert once["extra"].tolist() == ['{"b": [1, 2]}', "[3]"] and once["model"].dtype == "str"
    assert once["ttft_s"].dtype == "float64" and once["ttft_s"].tolist() == [0.5, 0.5]      # "0.5" parsed
    assert str(once["prompt_len"].dtype) == "Int64" and once["prompt_len"].tolist() == [256, 256]
    assert list(once.columns[:7]) == list(store.KEY_COLUMNS)
    assert list(once.columns[-3:]) == ["platform_hash", "model_fingerprint", "plan_hash"]     # provenance last, in order
