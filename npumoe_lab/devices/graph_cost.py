"""Graph-level NPU cost: what one static graph call costs as a whole, not op by op.

The per-op roofline (platform.py `DeviceModel.estimate` with `graph_model` off) rates every GEMM of a fused graph at
the single-dispatch square-GEMM rate of its own size, so a graph of many small GEMMs is charged the small-op floor.
Published chains and fused blocks run far above that (docs/sources/DEVICE_MODEL.md). Here a graph's time is

    t = calls * call_s + max(t_compute, t_memory, t_decompress)
    t_compute    = matmul_flops / (clusters * peak * u)  +  attn_flops / (clusters * attention_flops)
    u            = w / (w + work_half)  *  rows / (rows + rows_half)      (utilisation, 0..1)
    t_memory     = bytes / (clusters * bandwidth)                          (stored weights + activations)
    t_decompress = lut_params / (clusters * decompress_params_s)           (palettized weights, LUT2-LUT6)

with w = matmul FLOPs per call, rows = rows per GEMM (tokens), matmul_flops = flops - attn_flops. Utilisation rises
with the work per call (a call's fixed pipeline fill and weight-tile loads amortised over more work) and with the
rows per GEMM (the engine computes over row tiles; a GEMV uses a sliver of each). Attention's activation x
activation GEMMs (scores, weighted sum; K = head_dim) run at their own measured rate and grow with context.
call_s = dispatch_s + sync_s. `clusters` = ANE clusters serving one model (1 on the Core ML path of an Ultra; 2 is
the direct-path option that pins programs to both). Every term is a parameter of the platform YAML, sourced or
fitted on micro-benchmarks (devices/fit.py); its sources are in docs/sources/DEVICE_MODEL.md.
"""
from __future__ import annotations

from ..errors import NpuMoeError

# stored bytes per weight element, and whether the format is palettized (expanded on the engine: decompress floor)
WEIGHT_FORMATS = {
    "fp32": (4.0, False), "bf16": (2.0, False), "fp16": (2.0, False), "int8": (1.0, False),
    "lut8": (1.0, True), "lut6": (0.75, True), "lut4": (0.5, True), "lut3": (0.375, True), "lut2": (0.25, True),
}
GRAPH_PARAMS = ("graph_peak_flops", "work_half_flops", "rows_half", "attention_flops", "decompress_params_s",
                "clusters")


def weight_format(name: str) -> tuple[float, bool]:
    """(stored bytes per weight element, palettized?) of a weight format name."""
    if name not in WEIGHT_FORMATS:
        raise NpuMoeError(f"unknown weight format {name!r}; use one of {', '.join(WEIGHT_FORMATS)}")
    return WEIGHT_FORMATS[name]


def utilisation(work_per_call: float, rows: float, work_half: float, rows_half: float) -> float:
    """Fraction of the peak rate a call reaches: saturating in the work per call and in the rows per GEMM."""
    if work_per_call <= 0:
        return 1.0
    return work_per_call / (work_per_call + work_half) * rows / (rows + rows_half)


def graph_time(dev, op) -> float:
    """Modeled seconds of `op` (an OpCost) as static graph calls on `dev` (a DeviceModel with graph parameters)."""
    clusters = dev.clusters
    mm = max(op.flops - op.attn_flops, 0.0)
    u = utilisation(mm / op.calls, op.gemm_rows, dev.work_half_flops, dev.rows_half)
    compute = (mm / (clusters * dev.graph_peak_flops * u) if mm else 0.0) \
        + (op.attn_flops / (clusters * dev.attention_flops) if op.attn_flops else 0.0)
    memory = op.bytes / (clusters * dev.bandwidth_bytes_s)
    decompress = op.lut_params / (clusters * dev.decompress_params_s) if op.lut_params else 0.0
    return op.calls * dev.call_overhead_s + max(compute, memory, decompress)
