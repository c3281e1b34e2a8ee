"""Core ML device (macOS only): load a graph package with chosen compute units (CPU_AND_NE by default), run and
time it for real, report where each op is placed (MLComputePlan), and read power from `powermetrics`.

On Linux coremltools converts but cannot load or run models (ENVIRONMENT 2); every run path raises one clear
NpuMoeError instead. The powermetrics parser is plain text processing and works (and is tested) everywhere."""
from __future__ import annotations

import re
import subprocess
import sys
import time
import warnings
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from npumoe_lab.errors import NpuMoeError
from npumoe_lab.graphs.coreml import COMPUTE_UNITS, require_coremltools
from npumoe_lab.graphs.modules import from_layout, to_layout

TIMING_SOURCE = "measured"


def require_macos(what: str = "running Core ML graphs") -> None:
    if sys.platform != "darwin":
        raise NpuMoeError(f"{what} needs macOS with Core ML (this is {sys.platform}); on this machine you can build "
                          "and validate the packages (`npumoe-lab convert --target coreml`), then copy them to a Mac "
                          "and follow docs/BACKENDS.md, or use the onnxruntime device here")


def function_io(spec, function: str) -> tuple[list, list]:
    """(input names, state names) of one function; a multifunction package lists them per function."""
    desc = spec.description
    funcs = {f.name: f for f in desc.functions}
    if funcs and function not in funcs:
        raise NpuMoeError(f"the package has no function {function!r}; it has {sorted(funcs)}")
    fdesc = funcs.get(function, desc)
    return [i.name for i in fdesc.input], [s.name for s in fdesc.state]


@dataclass
class CoreMLHandle:
    path: Path
    function: str
    model: object
    input_names: list
    state: object = None
    load_s: float = 0.0  # first load compiles and specialises for the device (ANCHORS 3.8): recorded apart


class CoreMLDevice:
    name = "coreml"
    timing_source = TIMING_SOURCE

    def __init__(self, compute_units: str = "CPU_AND_NE"):
        if compute_units not in COMPUTE_UNITS:
            raise NpuMoeError(f"unknown compute units {compute_units!r}; use one of {COMPUTE_UNITS}")
        require_macos()
        self.ct = require_coremltools()
        self.compute_units = compute_units

    def load(self, path, function: str) -> CoreMLHandle:
        t0 = time.perf_counter()
        model = self.ct.models.MLModel(str(path), compute_units=getattr(self.ct.ComputeUnit, self.compute_units),
                                       function_name=function)
        load_s = time.perf_counter() - t0
        names, states = function_io(model.get_spec(), function)
        return CoreMLHandle(Path(path), function, model, names, model.make_state() if states else None, load_s)

    def run(self, handle: CoreMLHandle, inputs: dict):
        """inputs {name: array} in the graph's layout -> ({output: float32 array}, measured wall seconds)."""
        feed = {k: np.asarray(v, dtype=np.float16) for k, v in inputs.items()}
        t0 = time.perf_counter()
        out = handle.model.predict(feed, state=handle.state) if handle.state is not None else handle.model.predict(feed)
        wall = time.perf_counter() - t0
        return {k: np.asarray(v, dtype=np.float32) for k, v in out.items()}, wall

    def run_group(self, handle: CoreMLHandle, x, layout: str = "conv"):
        """A group graph on x [G, C, H] (numpy) -> (y [G, C, H], measured wall seconds); same contract as the
        onnxruntime device's run."""
        out, wall = self.run(handle, {"x": to_layout(np.asarray(x, np.float32), layout)})
        return from_layout(out["y"], layout, x.shape[0]), wall


@dataclass
class Placement:
    """Where MLComputePlan puts the (non-const) ops of one function: counts and estimated-cost share per device."""
    graph: str
    function: str
    ops: dict = field(default_factory=dict)     # device -> op count
    cost: dict = field(default_factory=dict)    # device -> sum of estimated cost weights
    off_ane: list = field(default_factory=list)  # "op_type on DEVICE" for ops not on the ANE

    @property
    def all_on_ane(self) -> bool:
        return not self.off_ane


def _device_name(dev) -> str:
    name = type(dev).__name__
    return "ANE" if "NeuralEngine" in name else "GPU" if "GPU" in name else "CPU" if "CPU" in name else name


def placement(path, function: str, compute_units: str = "CPU_AND_NE", graph: str = "", resident: bool = True):
    """MLComputePlan of one function of a package. Warns when a resident group's ops are not all on the ANE."""
    require_macos("MLComputePlan placement")
    ct = require_coremltools()
    from coremltools.models.compute_plan import MLComputePlan
    units = getattr(ct.ComputeUnit, compute_units)
    compiled = ct.models.MLModel(str(path), compute_units=units, function_name=function).get_compiled_model_path()
    plan = MLComputePlan.load_from_path(path=compiled, compute_units=units)
    rep = Placement(graph or Path(path).stem, function)
    ops, cost = Counter(), Counter()
    for op in plan.model_structure.program.functions[function].block.operations:
        if op.operator_name == "const" or op.operator_name.startswith("constexpr_"):
            continue
        usage = plan.get_compute_device_usage_for_mlprogram_operation(op)
        dev = _device_name(usage.preferred_compute_device) if usage is not None else "unknown"
        est = plan.get_estimated_cost_for_mlprogram_operation(op)
        ops[dev] += 1
        cost[dev] += est.weight if est is not None else 0.0
        if dev != "ANE":
            rep.off_ane.append(f"{op.operator_name} on {dev}")
    rep.ops, rep.cost = dict(ops), dict(cost)
    if resident and rep.off_ane:
        warnings.warn(f"resident graph {rep.graph}/{function} falls off the ANE: {', '.join(rep.off_ane[:5])}"
                      f"{' ...' if len(rep.off_ane) > 5 else ''}; its time is not NPU time", stacklevel=2)
    return rep


# powermetrics text format (macOS 13-15): one block per sample, e.g.
#   *** Sampled system activity (Mon Nov 30 10:00:00 2026 -0800) (100.52ms elapsed) ***
#   CPU Power: 1234 mW / GPU Power: 56 mW / ANE Power: 789 mW / Combined Power (CPU + GPU + ANE): 2079 mW
_SAMPLE = re.compile(r"\*\*\* Sampled system activity .*?\(([\d.]+)ms elapsed\) \*\*\*")
_POWER = re.compile(r"^(CPU|GPU|ANE) Power:\s*([\d.]+)\s*mW", re.M)


def parse_powermetrics(text: str) -> list[dict]:
    """Samples [{elapsed_s, cpu_w, gpu_w, ane_w}] from `powermetrics --samplers cpu_power,gpu_power,ane_power`."""
    heads = list(_SAMPLE.finditer(text))
    if not heads:
        raise NpuMoeError("no '*** Sampled system activity' blocks in the powermetrics output; run it with "
                          "`--samplers cpu_power,gpu_power,ane_power` and text output (no --format plist)")
    samples = []
    for i, m in enumerate(heads):
        body = text[m.end(): heads[i + 1].start() if i + 1 < len(heads) else len(text)]
        sample = {"elapsed_s": float(m.group(1)) / 1e3, "cpu_w": None, "gpu_w": None, "ane_w": None}
        for unit, mw in _POWER.findall(body):
            sample[f"{unit.lower()}_w"] = float(mw) / 1e3
        samples.append(sample)
    return samples


def energy_j(samples: list[dict]) -> dict:
    """Energy per unit (J) over the samples: sum of power x elapsed time; a unit never reported stays None."""
    out = {}
    for unit in ("cpu", "gpu", "ane"):
        vals = [(s[f"{unit}_w"], s["elapsed_s"]) for s in samples if s[f"{unit}_w"] is not None]
        out[f"{unit}_j"] = sum(w * t for w, t in vals) if vals else None
    return out


class PowerMetrics:
    """`with PowerMetrics() as pm: work()` then `pm.samples`, `pm.energy`; needs macOS and sudo rights for
    powermetrics (run as root, or allow it in sudoers); raises a clear error otherwise."""

    def __init__(self, interval_ms: int = 100):
        require_macos("powermetrics energy")
        self.interval_ms = int(interval_ms)
        self.samples, self.energy = [], {}

    def __enter__(self):
        cmd = ["sudo", "-n", "powermetrics", "--samplers", "cpu_power,gpu_power,ane_power", "-i", str(self.interval_ms)]
        self._proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        time.sleep(self.interval_ms / 1e3)
        if self._proc.poll() is not None:
            raise NpuMoeError(f"powermetrics did not start ({self._proc.stderr.read().strip()}); run as root or allow "
                              "`sudo -n powermetrics`, or measure without energy")
        return self

    def __exit__(self, *exc):
        time.sleep(self.interval_ms / 1e3)  # let the last interval close
        self._proc.terminate()
        out, _ = self._proc.communicate(timeout=10)
        self.samples = parse_powermetrics(out)
        self.energy = energy_j(self.samples)
