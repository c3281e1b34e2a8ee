"""`npumoe-lab measure`: micro-benchmark this machine's ops (cpu | onnxruntime | coreml) into measurement rows."""
from __future__ import annotations


def register_cli(sub):
    p = sub.add_parser("measure", help="micro-benchmark this machine's ops into measurement rows (fit-device input)")
    p.add_argument("--device", required=True, help="cpu, onnxruntime or coreml (a Mac: Core ML on CPU_AND_NE)")
    p.add_argument("--geometry", default="tiny,qwen3-30b-a3b", help="comma list of tiny, qwen3-30b-a3b (default both)")
    p.add_argument("--repeats", type=int, default=5, help="timed repeats per op (median and IQR kept; >= 3)")
    p.add_argument("--quick", action="store_true", help="a smaller grid (tests, a first look)")
    p.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's own)")
    p.add_argument("--seed", type=int, default=0, help="seed of the random weights and inputs (default 0)")
    p.add_argument("--dtype", default="auto", choices=["auto", "bf16", "fp32"],
                   help="the models' dtype (default auto: this CPU's fast one); fit-device fits each dtype apart")
    p.add_argument("--out", required=True, help="folder for measurements.yaml")
    p.set_defaults(func=_cli)


def _cli(a) -> int:
    import sys
    if a.device == "coreml" and sys.platform != "darwin":    # refused before torch or Core ML import (seconds)
        from npumoe_lab.errors import NpuMoeError  # lazy: as light as the check
        raise NpuMoeError(f"measure --device coreml needs macOS with Core ML (this is {sys.platform}); here use "
                          "--device cpu or --device onnxruntime, or build the packages (`npumoe-lab convert "
                          "--target coreml`) and measure them on a Mac (docs/BACKENDS.md)")
    # lazy: torch and the benchmark grid load only when the command runs (`--help` stays fast)
    from npumoe_lab.experiments.measure import check_args, measure_device, write_measurements
    from npumoe_lab.utils import with_torch_threads
    geoms = tuple(g.strip() for g in a.geometry.split(",") if g.strip())
    check_args(a.device, geoms, a.repeats)
    if a.device == "coreml":
        from npumoe_lab.experiments.measure_coreml import measure_coreml   # lazy: the Mac-only path
        rows, fallbacks, record = measure_coreml(geoms, a.repeats, a.quick, a.seed)
        path = write_measurements(rows, a.out, a.device, fallbacks, record)
        print(f"{len(rows)} measured rows ({len(fallbacks)} graphs fell off the ANE: listed under fallbacks, not "
              f"timed as NPU rows; powermetrics {record.get('powermetrics')}) written to {path}")
        return 0
    rows = with_torch_threads(measure_device)(a.device, geoms, a.repeats, a.quick, a.seed, a.dtype,
                                                     threads=a.threads)
    path = write_measurements(rows, a.out, a.device, dtype=a.dtype)
    busy = sum(r["host_busy"] for r in rows)
    print(f"{len(rows)} measured rows ({busy} flagged host_busy) written to {path}")
    return 0
