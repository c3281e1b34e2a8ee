"""Quiet, responsive command line: `--help` without torch/pandas; `platforms` describes this host from the host
itself and cites only sources that ship with the repository."""
from __future__ import annotations

import re
import subprocess
import sys
import time

import yaml

from npumoe_lab.devices.hostcpu import cpu_info, describe_host
from npumoe_lab.utils import REPO_ROOT

PLATFORMS = REPO_ROOT / "npumoe_lab" / "devices" / "platforms"


def test_top_level_help_imports_no_torch_or_pandas_and_is_fast():
    code = ("import sys, time; t = time.perf_counter(); from npumoe_lab import cli\n"
            "try:\n    cli.main(['--help'])\nexcept SystemExit:\n    pass\n"
            "print('HEAVY', sorted(m for m in ('torch', 'pandas', 'transformers') if m in sys.modules))\n"
            "print('SECONDS', time.perf_counter() - t)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=REPO_ROOT)
    assert "HEAVY []" in out.stdout, out.stdout + out.stderr
    assert "run variants on a workload" in out.stdout and "sweep" in out.stdout
    assert float(out.stdout.split("SECONDS")[1]) < 1.0
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-m", "npumoe_lab", "--help"], capture_output=True, timeout=60, check=True)
    assert time.perf_counter() - t0 < 3.0      # interpreter start-up included, on a shared 2-core CI box


def _cited_sections():
    for path in PLATFORMS.glob("*.yaml"):
        text = path.read_text()
        yaml.safe_load(text)
        for note, section in re.findall(r"docs/sources/([A-Z_]+\.md)(?: (§[0-9.]+|addendum))?", text):
            yield path.name, note, section


def test_every_cited_source_note_and_section_is_in_the_repository():
    cites = list(_cited_sections())
    assert len(cites) > 30
    for yaml_name, note, section in cites:
        doc = REPO_ROOT / "docs" / "sources" / note
        assert doc.is_file(), f"{yaml_name} cites {note}, which is not in docs/sources/"
        heads = [h for h in doc.read_text().splitlines() if h.startswith("#")]
        if section.startswith("§"):
            num = section[1:]
            assert any(re.match(rf"#+ {re.escape(num)}[. ]", h) for h in heads), (yaml_name, note, section)
    assert not any("/work/" in p.read_text() for p in PLATFORMS.glob("*.yaml"))


def test_host_description_comes_from_cpuinfo(tmp_path):
    fake = tmp_path / "cpuinfo"
    fake.write_text("processor\t: 0\nmodel name\t: AMD EPYC 9R14 96-Core Processor\n"
                    "flags\t\t: fpu avx2 avx512f avx512_bf16\n\nprocessor\t: 1\nmodel name\t: AMD EPYC 9R14\n")
    info = cpu_info(str(fake))
    assert info["model"] == "AMD EPYC 9R14 96-Core Processor" and {"avx2", "avx512_bf16"} <= info["flags"]
    text = describe_host(info)
    assert "AMD EPYC 9R14 96-Core Processor" in text and "amx_bf16 no" in text and "avx512_bf16 yes" in text
    assert "Xeon" not in text
    real = open("/proc/cpuinfo").read()
    model = re.search(r"model name\s*:\s*(.+)", real).group(1).strip()
    out = subprocess.run([sys.executable, "-m", "npumoe_lab", "platforms"], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0 and f"This host (the measured `cpu` platform): {model}" in out.stdout


def test_loading_the_bundled_model_is_quiet_under_no_progress():
    """No weight-loading bar under NPUMOE_NO_PROGRESS=1 (there is one without it), and no max-length warning when
    a text longer than the context is tokenized to be cut into prompts."""
    from npumoe_lab.models import TINY_MODEL_DIR
    if not (TINY_MODEL_DIR / "model.safetensors").exists():
        import pytest
        pytest.skip("bundled tiny model not present")
    code = ("import npumoe_lab as nl\nfrom npumoe_lab.workloads.base import encode\n"
            "m, tok = nl.load_model('tiny')\nassert len(encode(tok, 'hello world ' * 3000)) > 2304\n")
    import os
    quiet = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                           env={**os.environ, "NPUMOE_NO_PROGRESS": "1"})
    assert quiet.returncode == 0 and quiet.stderr.strip() == "", quiet.stderr[-500:]
    loud = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                          env={k: v for k, v in os.environ.items() if k not in ("NPUMOE_NO_PROGRESS", "NPUMOE_IN_SWEEP")})
    assert "Loading weights" in loud.stderr and "maximum sequence length" not in loud.stderr
