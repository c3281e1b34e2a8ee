"""Devices: where the time (and power) of each op comes from.

Numerics always run for real on this host. A platform gives time: `measured` on this host (`cpu`: measured.py
times real calls), `modeled` elsewhere (Apple M2/M3/M4: cost.py OpCosts through platform.py DeviceModels whose
parameters are sourced in platforms/*.yaml, or fitted by fit-device). Every number carries which it is.
Device-model checking: measurements.py (data/measurements schema and loader), workload.py (a row's work
as an OpCost), graph_cost.py (the graph-level NPU structure), price.py (vectorised pricing over parameter draws),
fit.py (`fit-device`), validate.py (`validate-device`).
"""
from npumoe_lab.devices.cost import OpCost, attention_cost, dense_cost, expert_ffn_cost, memory_cost
from npumoe_lab.devices.measured import Measurement, Stopwatch, measure, rapl_available
from npumoe_lab.devices.platform import (DeviceModel, Platform, as_platform, format_platforms, get_platform,
                                         list_platforms, parse_platform_spec, resolve_platform)

__all__ = ["OpCost", "expert_ffn_cost", "attention_cost", "dense_cost", "memory_cost", "DeviceModel", "Platform",
           "get_platform", "as_platform", "list_platforms", "format_platforms", "Measurement", "Stopwatch", "measure",
           "rapl_available", "resolve_platform", "parse_platform_spec"]
