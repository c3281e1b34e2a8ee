"""Shared test set-up.

Threads are set once here: 1 torch thread, immune to OpenMP barrier stalls when the 2 cores of a CI machine are
shared (a test that needs another count sets it inside the test and restores it, e.g. test_runner).
Lanes: tests in SLOW_MODULES (notebooks and the browser, sweeps of notebooks, whole-model benchmarks) are marked
`slow`; `make test-fast` runs the rest, and `make test` runs the fast lane first, then the slow one."""
import os

import pytest
import torch

from npumoe_lab.models import TINY_MODEL_DIR, load_model

torch.set_num_threads(1)
# the cpu platform's plans must not depend on whichever host fit was last registered here (hostprofile.find_host_fit)
os.environ.setdefault("NPUMOE_HOST_FIT", "off")
# tests patch planning code: a plan read from the keyed plan cache would hide the patch (tests/sim turn it on)
os.environ.setdefault("NPUMOE_PLAN_CACHE", "off")

SLOW_MODULES = {"test_notebooks", "test_browser", "test_sweep", "test_bench", "test_tiny_model", "test_simulate",
                "test_accuracy", "test_workloads", "test_graphs", "test_graphs_coreml", "test_onnxruntime_device",
                "test_runner", "test_calibration", "test_models_parity", "test_papercheck", "test_adaptive",
                "test_tune_model", "test_demo"}


def pytest_collection_modifyitems(config, items):
    for item in items:
        if item.path.stem in SLOW_MODULES:
            item.add_marker(pytest.mark.slow)


@pytest.fixture(scope="module")
def tiny_model_fresh_cache(tmp_path_factory):
    """The bundled model with a calibration cache of the module's own (drift and tuner tests)."""
    if not (TINY_MODEL_DIR / "config.json").is_file():
        pytest.skip("the bundled tiny model is not built (npumoe-lab train-tiny)")
    mp = pytest.MonkeyPatch()
    mp.setenv("NPUMOE_CACHE", str(tmp_path_factory.mktemp("cache")))
    yield load_model("tiny")
    mp.undo()
