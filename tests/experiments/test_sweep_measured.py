"""Measured cells of a multi-worker sweep run one at a time: a cell timing this host's `cpu`
platform never overlaps another cell, and one stderr line says so before the sweep starts."""
import json

import pytest

from npumoe_lab.experiments.sweep import run_sweep
from npumoe_lab.experiments.sweep_measured import measured_platforms, platform_kind

NOTEBOOK = '''# %% tags=["parameters"]
platforms = "m2-max"
x = 0
out_dir = None

# %%
import json, pathlib, time
t0 = time.time()
time.sleep(1.5)
pathlib.Path(out_dir, "span.json").write_text(json.dumps([t0, time.time()]))
'''


def test_which_platforms_are_measured():
    assert platform_kind("cpu") == "measured" and platform_kind("m2-max") == "modeled"
    assert platform_kind("m2-max[npu_dispatch_s=4e-4]") == "modeled" and platform_kind("nope") is None
    assert measured_platforms({"platforms": "cpu,m2-max"}, {}) == ["cpu"]
    assert measured_platforms({}, {"platforms": "cpu"}) == ["cpu"]          # the notebook's default
    assert measured_platforms({"platform": "m2-ultra"}, {"platforms": "cpu"}) == []


@pytest.mark.slow
def test_measured_cells_run_alone_and_the_sweep_says_so_up_front(tmp_path, capfd):
    (tmp_path / "nb.py").write_text(NOTEBOOK)
    spec = tmp_path / "s.yaml"
    spec.write_text("notebook: nb.py\ngrid:\n  platforms: [cpu, m2-max]\n  x: [1, 2]\n")
    report = run_sweep(spec, tmp_path / "out", workers=2)
    assert report.ok and len(report.done) == 4, report.summary()
    err = capfd.readouterr().err
    notice = "2 of 4 cells time the measured platform cpu on this host: they run one at a time"
    assert notice in err and err.index(notice) < err.index("started")
    spans = {c.key: (c.params["platforms"], json.loads((c.dir / "span.json").read_text())) for c in report.done}
    for key, (plat, (a0, a1)) in spans.items():
        if plat != "cpu":
            continue
        for other, (_, (b0, b1)) in spans.items():
            assert other == key or a1 <= b0 or b1 <= a0, "a measured cell overlapped another cell"
