"""Graph-level NPU cost: what one static graph call costs as a whole, not op by op.

The per-op roofline (platform.py `DeviceModel.estimate` with `graph_model` off) rates every GEMM of a fused graph at
the single-dispatch square-GEMM rate of its own size, so a graph of many small GEMMs is charged the small-op floor.
Published chains and fused blocks run far above that (docs/sources/DEVICE_MODEL.md). Here a graph's time is

    t = calls * call_s + max(t_compute, t_memory, t_decompress)
    t_compute    = (mm * max(1, rows_half / rows) * spill + calls * work_half) / (clusters * peak)
                   + attn_flops / (clusters * attention_flops)
    spill        = 1 + (1 / spill_factor - 1) * x**4 / (1 + x**4),  x = tile_bytes / sram_bytes
    t_memory     = bytes / (clusters * bandwidth)                          (stored weights + activations)
    t_decompress = lut_params / (clusters * decompress_params_s)           (palettized weights, LUT2-LUT6)

with mm = matmul FLOPs (flops - attn_flops), rows = rows per GEMM (tokens), tile_bytes = 2 * N * K of the dominant
GEMM (its weights as fp16 on the engine: palettized weights are expanded there). Two additive costs on top of the
peak rate, each with a physical reading:
- `rows_half` (the row tile): the engine computes over tiles of rows_half rows, so a GEMM with fewer rows than a
  tile still takes a full tile's time per weight: mm * max(1, rows_half / rows) = 2 * weights * max(rows,
  rows_half). A 1-row decoder step of 1 GB of weights therefore costs what its GEMVs cost, weight by weight.
- `work_half`: a per-call pipeline fill (work_half / peak seconds per call, not slowed by a spill: it moves no
  weights), the same for a GEMV and a 512-row GEMM; the call-floor micro-benchmarks (a 64 x 256 x 256 GEMM and a
  single small conv at ~0.08 ms, ANEForge M4 Max) bound it together with the dispatch.
Until 2026-12-02 the two multiplied (u = w / (w + work_half) * rows / (rows + rows_half)), which made the fill
scale with 1 / rows: the fit then explained a slow 1-row GEMV probe as a per-call cost, which a 1 GB decoder step
pays once (it priced the M4 Max toy decoder 4.5x too fast, a validate row; docs/sources/DEVICE_MODEL.md §2 says
what changed, why, and how the variant was chosen). The spill term: a GEMM whose weights exceed the on-chip SRAM (~32 MB on M4) runs at
spill_factor of the rate (ANEForge M4 Max: 8.9 TF/s at N=2048, 3.7 at 6144-8192). Attention's activation x
activation GEMMs (scores, weighted sum; K = head_dim) run at their own measured rate and grow with context.
call_s = dispatch_s + sync_s. `clusters` = ANE clusters serving one model (1 on the Core ML path of an Ultra; 2 is
the direct-path option that pins programs to both). Path-specific terms: a measurement through the direct (private)
path uses `direct_dispatch_s` (no separate sync), `direct_bandwidth_bytes_s` and `direct_rows_half` (the private
path runs a 1-row GEMV as one row of a tile: ANEForge finds int8 weights no faster than fp16 for GEMV and B <= 64,
i.e. not weight-bound, while Core ML's LUT6 LM head is 2.6x faster than fp16, i.e. weight-bound) where given
(`DeviceModel.for_path`); simulations run the Core ML path (dispatch_s + sync_s, bandwidth_bytes_s). Every term is a parameter of the platform YAML, sourced or
fitted on micro-benchmarks (devices/fit.py); its sources are in docs/sources/DEVICE_MODEL.md.
"""
from __future__ import annotations

from npumoe_lab.errors import NpuMoeError

# stored bytes per weight element, and whether the format is palettized (expanded on the engine: decompress floor)
WEIGHT_FORMATS = {
    "fp32": (4.0, False), "bf16": (2.0, False), "fp16": (2.0, False), "int8": (1.0, False),
    "lut8": (1.0, True), "lut6": (0.75, True), "lut4": (0.5, True), "lut3": (0.375, True), "lut2": (0.25, True),
}
GRAPH_PARAMS = ("graph_peak_flops", "work_half_flops", "rows_half", "attention_flops", "decompress_params_s",
                "clusters", "sram_bytes", "spill_factor")
PATH_PARAMS = ("direct_dispatch_s", "direct_bandwidth_bytes_s", "direct_rows_half")


def weight_format(name: str) -> tuple[float, bool]:
    """(stored bytes per weight element, palettized?) of a weight format name."""
    if name not in WEIGHT_FORMATS:
        raise NpuMoeError(f"unknown weight format {name!r}; use one of {', '.join(WEIGHT_FORMATS)}")
    return WEIGHT_FORMATS[name]


def tile_bytes(op) -> float:
    """Weights of the op's dominant GEMM as fp16 on the engine (2 * N * K); 0 without a GEMM shape."""
    return 2.0 * op.gemm[1] * op.gemm[2] if op.gemm else 0.0


def spill(tile: float, sram_bytes: float, spill_factor: float) -> float:
    """Slow-down (>= 1) of a GEMM whose weight tile exceeds the on-chip SRAM: smooth step to 1/spill_factor."""
    x4 = (tile / sram_bytes) ** 4
    return 1.0 + (1.0 / spill_factor - 1.0) * x4 / (1.0 + x4)


def compute_flops_equiv(mm: float, rows: float, calls: float, work_half: float, rows_half: float,
                        slow: float = 1.0) -> float:
    """Matmul FLOPs as the engine spends them, in FLOP at peak: the row-tile floor (mm * max(1, rows_half / rows),
    slowed by a spill) plus the per-call pipeline fill (calls * work_half). Seconds = this / (clusters * peak)."""
    if mm <= 0:
        return 0.0
    return mm * max(1.0, rows_half / rows) * slow + calls * work_half


def utilisation(work_per_call: float, rows: float, work_half: float, rows_half: float, slow: float = 1.0) -> float:
    """Fraction of the peak rate a call of `work_per_call` matmul FLOPs at `rows` rows per GEMM reaches (0..1)."""
    if work_per_call <= 0:
        return 1.0
    return work_per_call / compute_flops_equiv(work_per_call, rows, 1.0, work_half, rows_half, slow)


def graph_time(dev, op) -> float:
    """Modeled seconds of `op` (an OpCost) as static graph calls on `dev` (a DeviceModel with graph parameters)."""
    clusters = dev.clusters
    mm = max(op.flops - op.attn_flops, 0.0)
    slow = spill(tile_bytes(op), dev.sram_bytes, dev.spill_factor)
    compute = compute_flops_equiv(mm, op.gemm_rows, op.calls, dev.work_half_flops, dev.rows_half, slow) \
        / (clusters * dev.graph_peak_flops) \
        + (op.attn_flops / (clusters * dev.attention_flops) if op.attn_flops else 0.0)
    memory = op.bytes / (clusters * dev.bandwidth_bytes_s)
    decompress = op.lut_params / (clusters * dev.decompress_params_s) if op.lut_params else 0.0
    return op.calls * dev.call_overhead_s + max(compute, memory, decompress)


def call_power(dev, op, seconds: float) -> float:
    """Modeled power [W] of `op` running for `seconds` on `dev`: floor + (active - floor) x utilisation, where
    utilisation = achieved FLOP rate / peak (graph-level: clusters x graph_peak_flops; roofline: throughput_flops)
    and floor = floor_power_w (None: constant active_power_w)."""
    floor = dev.active_power_w if dev.floor_power_w is None else dev.floor_power_w
    peak = dev.clusters * dev.graph_peak_flops if dev.graph_model else dev.throughput_flops
    util = min(1.0, op.flops / (seconds * peak)) if seconds > 0 else 0.0
    return floor + (dev.active_power_w - floor) * util


def npu_energy_j(dev, flops: float, seconds: float) -> float:
    """Joules of NPU work of `flops` busy for `seconds` on `dev`: call_power x seconds = floor x seconds +
    (active - floor) x min(seconds, flops / peak). The energy the fit's power model implies (the same formula
    prices power rows), so simulations and runs charge what the fitted watts say, not active_power_w throughout."""
    if seconds <= 0:
        return 0.0
    return call_power(dev, _Flops(flops), seconds) * seconds


class _Flops:       # the one attribute call_power reads of an op
    __slots__ = ("flops",)

    def __init__(self, flops: float):
        self.flops = flops
