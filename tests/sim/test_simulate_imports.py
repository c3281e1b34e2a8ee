"""The simulate path needs no weights, so it must not pay torch's and transformers' import ( 4 s of a
15.8 s command line). References: the modules a fresh interpreter holds after the command ran (sys.modules), the
geometry transformers' own config builds, and a fresh routing draw."""
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from npumoe_lab.sim.geometries import list_geometries, load_geometry
from npumoe_lab.sim.routing import parse_routing

ROOT = Path(__file__).resolve().parents[2]

# runs the real entry point (python -m npumoe_lab simulate ...) in this interpreter, then reports what it imported
PROBE = """
import json, runpy, sys
sys.argv = ["npumoe_lab"] + json.loads(sys.argv[1])
try:
    runpy.run_module("npumoe_lab", run_name="__main__")
except SystemExit as exc:
    code = exc.code
print("LOADED " + json.dumps(sorted(m for m in sys.modules if m.split(".")[0] in ("torch", "transformers"))))
print("EXIT " + str(code))
"""


def test_simulate_command_imports_neither_torch_nor_transformers(tmp_path):
    args = ["simulate", "--geometry", "phi-tiny-moe,qwen3-30b-a3b", "--platforms", "m2-max,m2-ultra",
            "--variants", "npumoe,reference,cpu-only", "--prompt-len", "512", "--chunk", "256", "--draws", "5",
            "--out", str(tmp_path / "rows")]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "NPUMOE_NO_PROGRESS": "1"}
    out = subprocess.run([sys.executable, "-c", PROBE, json.dumps(args)], cwd=ROOT, env=env, capture_output=True,
                         text=True, timeout=300)
    assert "EXIT 0" in out.stdout, out.stdout[-2000:] + out.stderr[-2000:]
    loaded = json.loads(next(line for line in out.stdout.splitlines() if line.startswith("LOADED "))[7:])
    assert loaded == [], f"the simulate command imported {loaded[:5]}"
    assert any((tmp_path / "rows").rglob("*.parquet")) or any((tmp_path / "rows").iterdir())   # rows written


def test_the_probe_sees_torch_where_a_command_needs_it(tmp_path):
    """The check above can fail: the per-op engine (--engine ops) loads torch, and the probe reports it."""
    args = ["simulate", "--geometry", "phi-tiny-moe", "--variants", "npumoe", "--prompt-len", "256", "--chunk",
            "256", "--draws", "0", "--engine", "ops", "--out", str(tmp_path / "rows")]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "NPUMOE_NO_PROGRESS": "1"}
    out = subprocess.run([sys.executable, "-c", PROBE, json.dumps(args)], cwd=ROOT, env=env, capture_output=True,
                         text=True, timeout=300)
    assert "EXIT 0" in out.stdout, out.stdout[-2000:] + out.stderr[-2000:]
    assert "torch" in json.loads(next(line for line in out.stdout.splitlines() if line.startswith("LOADED "))[7:])


@pytest.mark.parametrize("name", list_geometries())
def test_plain_geometry_equals_the_one_of_transformers_config(name):
    """A bundled geometry read as plain attributes (no transformers) is the geometry of AutoConfig's config: the
    files state every field the geometry reads, so transformers' defaults fill nothing."""
    _, hf, with_hf = load_geometry(name)
    _, plain, without = load_geometry(name, hf_config=False)
    assert type(hf).__module__.startswith("transformers") and not type(plain).__module__.startswith("transformers")
    assert without == with_hf


@pytest.mark.parametrize("spec", ["synthetic:gini=0.6", "synthetic:gini=0.5,concentration=inf,doc_concentration=inf"])
def test_a_longer_prompt_extends_the_last_draw_exactly(spec):
    """The prefix memo: chunks of prompt 512 then 1280 from one source equal 1280 drawn by a fresh source (and
    512's are its first chunks); the Gini each call reports is that of its own prompt."""
    _, _, geo = load_geometry("phi-tiny-moe", hf_config=False)
    specs = list(geo.moe)
    kept = parse_routing(spec, specs, 0)
    short = kept.chunks(specs, 512, 256, 0)
    g_short = kept.gini()
    long_ = kept.chunks(specs, 1280, 256, 0)
    fresh_src = parse_routing(spec, specs, 0)
    fresh = fresh_src.chunks(specs, 1280, 256, 0)
    assert len(short) == 2 and len(long_) == len(fresh) == 5
    for a, b in zip(long_, fresh):
        for layer in a:
            for x, y in zip(a[layer], b[layer]):
                np.testing.assert_array_equal(x, y)
    for a, b in zip(short, fresh):
        np.testing.assert_array_equal(a[specs[0].layer][0], b[specs[0].layer][0])
    assert kept.gini() == fresh_src.gini()
    alone = parse_routing(spec, specs, 0)
    alone.chunks(specs, 512, 256, 0)
    assert g_short == alone.gini() != kept.gini()
