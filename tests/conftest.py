"""Shared test set-up.

Threads are set once here: 1 torch thread, immune to OpenMP barrier stalls when the 2 cores of a CI machine are
shared (a test that needs another count sets it inside the test and restores it, e.g. test_runner). Lanes: tests in SLOW_MODULES (notebooks and the
browser, sweeps of notebooks, whole-model benchmarks) are marked `slow`; `make test-fast` runs the rest, and
`make test` runs the fast lane first, then the slow one."""
import pytest
import torch

torch.set_num_threads(1)

SLOW_MODULES = {"test_notebooks", "test_browser", "test_sweep", "test_bench", "test_tiny_model", "test_simulate",
                "test_accuracy", "test_workloads", "test_graphs", "test_graphs_coreml", "test_onnxruntime_device",
                "test_runner", "test_calibration", "test_models_parity", "test_papercheck"}


def pytest_collection_modifyitems(config, items):
    for item in items:
        if item.path.stem in SLOW_MODULES:
            item.add_marker(pytest.mark.slow)
