"""`--device` of calibrate: an unavailable accelerator is one clear error (exit 2) before any work; on CPU the
profile is the one calibrate always wrote (the device move is a no-op)."""
import pytest
import torch

from npumoe_lab.cli import main


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA: the refusal cannot be seen")
def test_unavailable_device_refused(tmp_path, capsys):
    rc = main(["calibrate", "--model", "tiny", "--device", "cuda", "--tokens", "256", "--chunk", "128",
               "--out", str(tmp_path / "p")])
    err = capsys.readouterr().err
    assert rc == 2 and "--device cuda is not available" in err and not (tmp_path / "p").exists()


def test_cpu_device_is_the_default_path():
    from npumoe_lab.models import load_model
    model, _ = load_model("tiny", device="cpu")
    assert next(model.parameters()).device.type == "cpu"
