"""The keep-freed allocator policy: a freed large block is reused without page faults (counted by the kernel,
not timed), the system policy faults on every fresh block, and rows say which was in force. Each case runs in a
fresh interpreter: the policy is process-wide and cannot be taken back."""
import os
import platform
import subprocess
import sys

import pytest

from npumoe_lab.core import host_memory
from npumoe_lab.errors import NpuMoeError

PROBE = """
import ctypes, resource, torch
from npumoe_lab.core.host_memory import keep_freed_memory, malloc_policy
from npumoe_lab.core.cpu_features import row_fields
before = malloc_policy()
policy = keep_freed_memory()
libc = ctypes.CDLL("libc.so.6")
libc.malloc.restype, libc.free.argtypes = ctypes.c_void_p, [ctypes.c_void_p]
def faults(n=64 << 20):                     # 64 MB: above glibc's largest mmap threshold (32 MB)
    f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    p = libc.malloc(n)                      # the allocator torch's CPU tensors come from
    ctypes.memset(p, 1, n)
    libc.free(p)
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0
faults()
reuse = [faults() for _ in range(3)]
print(before, policy, row_fields(torch.float32)["host_malloc"], min(reuse), max(reuse))
"""

glibc = pytest.mark.skipif(platform.system() != "Linux" or platform.libc_ver()[0] != "glibc",
                           reason="the policy acts on glibc's malloc only")


def _probe(policy: str) -> list:
    env = dict(os.environ, NPUMOE_MALLOC=policy)
    out = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, check=True)
    return out.stdout.split()


@glibc
def test_keep_freed_reuses_a_large_block_without_page_faults():
    before, policy, recorded, _, most = _probe("keep")
    assert (before, policy, recorded) == ("system", "keep-freed", "keep-freed")
    assert int(most) < 200                 # 64 MB of fresh pages would be 16,384 faults


@glibc
def test_the_system_policy_faults_on_every_fresh_large_block():
    before, policy, recorded, fewest, _ = _probe("system")
    assert (policy, recorded) == ("system", "system")
    assert int(fewest) > 8000                # the block is mmapped afresh and first-touched again


def test_an_unknown_policy_is_one_clear_error(monkeypatch):
    monkeypatch.setenv(host_memory.ENV, "jemalloc")
    with pytest.raises(NpuMoeError, match="NPUMOE_MALLOC='jemalloc'.*'keep'.*'system'"):
        host_memory.keep_freed_memory()


def test_run_with_an_unknown_policy_stops_before_any_work(tmp_path, monkeypatch, capsys):
    from npumoe_lab.cli import main
    from npumoe_lab.experiments import runner

    def no_load(*a, **k):
        raise AssertionError("the model was loaded before the policy was checked")
    monkeypatch.setattr(runner, "load_model", no_load)
    monkeypatch.setenv(host_memory.ENV, "tcmalloc")
    out = tmp_path / "run"
    rc = main(["run", "--model", "tiny", "--workload", "ruler-multikey", "--platform", "cpu", "--out", str(out)])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and "NPUMOE_MALLOC='tcmalloc'" in err[0]
    assert not list(out.glob("rows-*"))                        # nothing measured, nothing written
