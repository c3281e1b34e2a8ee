"""atomic_open: all or nothing, with or without the fsyncs (caches skip them)."""
import os

import pytest

from npumoe_lab.results.atomic import atomic_open


@pytest.mark.parametrize("durable", [True, False])
def test_content_replaces_the_file_whole(tmp_path, durable):
    path = tmp_path / "x.bin"
    path.write_bytes(b"old")
    with atomic_open(path, "wb", durable=durable) as fh:
        fh.write(b"new content")
    assert path.read_bytes() == b"new content"
    assert [p.name for p in tmp_path.iterdir()] == ["x.bin"]        # no temp file left


def test_an_error_leaves_the_old_file(tmp_path):
    path = tmp_path / "x.bin"
    path.write_bytes(b"old")
    with pytest.raises(RuntimeError):
        with atomic_open(path, "wb", durable=False) as fh:
            fh.write(b"half")
            raise RuntimeError("stop")
    assert path.read_bytes() == b"old"
    assert [p.name for p in tmp_path.iterdir()] == ["x.bin"]


def test_not_durable_never_fsyncs(tmp_path, monkeypatch):
    calls = []
    monkeypatch.setattr(os, "fsync", lambda fd: calls.append(fd))
    with atomic_open(tmp_path / "a", "wb", durable=False) as fh:
        fh.write(b"a")
    assert calls == []
    with atomic_open(tmp_path / "b", "wb") as fh:
        fh.write(b"b")
    assert len(calls) == 2                                             # the file and its folder
