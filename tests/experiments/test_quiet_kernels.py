"""Sweeps print no warning the user did not cause: neither the warm kernels (IPC sockets, so ipykernel has no TCP
warning to give) nor fresh ones (`--fresh-kernels`: kernel log level ERROR) print "running over TCP"."""
from pathlib import Path

import pytest

from npumoe_lab.experiments.sweep import run_sweep

FIX = Path(__file__).resolve().parent.parent / "fixtures"


@pytest.mark.slow
@pytest.mark.parametrize("warm", [True, False])
def test_sweep_kernels_print_no_tcp_warning(tmp_path, capfd, warm):
    report = run_sweep(FIX / "sweep_base.yaml", tmp_path / "out", warm=warm)
    from npumoe_lab.experiments.warm_kernel import shutdown
    shutdown()
    assert report.ok and len(report.done) == 2
    captured = capfd.readouterr()
    assert "without encryption" not in captured.err + captured.out
    assert not list(tmp_path.glob("**/kernel-*")) and not list(Path(FIX).glob("kernel*"))   # no socket files left
