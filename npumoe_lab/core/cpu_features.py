"""What this CPU computes fast: its flags, the dtype measured rows run in, and whether it has a native fp16 GEMM.

The project's machines differ (shared/research/ENVIRONMENT.md, 2026-12-01): on an AVX2-only EPYC, torch's bf16
GEMM ran at ~1 GFLOP/s against 118 in fp32 and batched fp16 at 2-3 GFLOP/s against ~110; with avx512_bf16 or AMX,
bf16 is the fast dtype (448 vs ~218 GFLOP/s on the Zen EPYC of bench/RESULTS.md). So the dtype is chosen from the
flags, not fixed. `NPUMOE_CPU_FLAGS` (comma or space separated) replaces the detected flags, so tests and users
can take the decisions of another CPU (e.g. `NPUMOE_CPU_FLAGS=avx2,fma` = the AVX2-only EPYC).

torch can also be told to use fewer of the CPU's instructions: `ONEDNN_MAX_CPU_ISA=AVX2` (oneDNN's GEMMs) and
`ATEN_CPU_CAPABILITY=avx2` (ATen's kernels). Under both, an AVX-512 machine computes as an AVX2-only one does
(measured on the Zen 4 EPYC, 2 threads: bf16 GEMM 1.3 GFLOP/s against 912 unrestricted, fp32 ~200 both ways;
bench/RESULTS.md), so under the oneDNN limit the AVX-512 and AMX flags count as absent and rows say "+isa=AVX2".
"""
from __future__ import annotations

import functools
import os
import platform
import subprocess

import torch

from npumoe_lab.errors import NpuMoeError
from npumoe_lab.core.host_memory import malloc_policy

ENV_FLAGS = "NPUMOE_CPU_FLAGS"
# the flags that decide or explain a dtype choice (rows record these, not the CPU's hundred others)
RELEVANT = ("avx2", "fma", "f16c", "avx512f", "avx512_vnni", "avx512_bf16", "avx512_fp16", "amx_tile", "amx_bf16",
            "amx_fp16", "asimdhp", "bf16")
BF16_FLAGS = ("avx512_bf16", "amx_bf16", "bf16")          # x86 AVX512-BF16 / AMX, AArch64 FEAT_BF16
FP16_FLAGS = ("avx512_fp16", "amx_fp16", "asimdhp")        # x86 AVX512-FP16 / AMX-FP16, AArch64 FEAT_FP16
DTYPES = {"fp32": torch.float32, "float32": torch.float32, "bf16": torch.bfloat16, "bfloat16": torch.bfloat16,
          "fp16": torch.float16, "float16": torch.float16}


@functools.lru_cache(maxsize=1)
def _detected() -> tuple[str, frozenset]:
    """(model name, flags) of this CPU from /proc/cpuinfo (Linux) or sysctl (macOS); ("unknown", {}) otherwise."""
    try:
        with open("/proc/cpuinfo") as fh:
            text = fh.read()
    except OSError:
        return _detected_macos()
    model, flags = None, set()
    for line in text.splitlines():
        key, _, value = line.partition(":")
        key = key.strip()
        if key in ("model name", "Model name") and model is None:
            model = value.strip()
        elif key in ("flags", "Features"):       # x86 | AArch64
            flags.update(value.split())
    return model or platform.processor() or "unknown", frozenset(flags)


def _detected_macos() -> tuple[str, frozenset]:
    def sysctl(name):
        try:
            return subprocess.run(["sysctl", "-n", name], capture_output=True, text=True, timeout=5).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            return ""
    flags = {flag for name, flag in (("hw.optional.arm.FEAT_BF16", "bf16"), ("hw.optional.arm.FEAT_FP16", "asimdhp"))
             if sysctl(name) == "1"}
    return sysctl("machdep.cpu.brand_string") or platform.processor() or "unknown", frozenset(flags)


def cpu_model() -> str:
    return _detected()[0]


# oneDNN's ISA names below AVX-512 (ONEDNN_MAX_CPU_ISA)
_ONEDNN_BELOW_AVX512 = ("SSE41", "AVX", "AVX2", "AVX2_VNNI", "AVX2_VNNI_2")


def isa_limit() -> str | None:
    """The oneDNN ISA limit ("AVX2", ...) when ONEDNN_MAX_CPU_ISA keeps torch's GEMMs below AVX-512, else None.
    oneDNN is what runs bf16 GEMMs: ATEN_CPU_CAPABILITY=avx2 alone left them at 898 GFLOP/s on the Zen 4 EPYC."""
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return None
    onednn = os.environ.get("ONEDNN_MAX_CPU_ISA", os.environ.get("DNNL_MAX_CPU_ISA", "")).upper()
    return onednn if onednn in _ONEDNN_BELOW_AVX512 else None


def cpu_flags() -> frozenset:
    """This CPU's flags, or those of NPUMOE_CPU_FLAGS when it is set; without AVX-512 and AMX under an ISA limit."""
    override = os.environ.get(ENV_FLAGS)
    if override is not None:
        return frozenset(f for f in override.replace(",", " ").split() if f)
    flags = _detected()[1]
    if isa_limit():
        flags = frozenset(f for f in flags if not f.startswith(("avx512", "amx")))
    return flags


def native_bf16(flags=None) -> bool:
    flags = cpu_flags() if flags is None else flags
    return any(f in flags for f in BF16_FLAGS)


def native_fp16(flags=None) -> bool:
    """True when the CPU multiplies fp16 matrices in hardware; without it torch's fp16 GEMM is a slow fallback."""
    flags = cpu_flags() if flags is None else flags
    return any(f in flags for f in FP16_FLAGS)


def fast_dtype(flags=None) -> torch.dtype:
    """The dtype measured CPU rows run in: bf16 where the CPU has native bf16 (avx512_bf16 or AMX), else fp32."""
    return torch.bfloat16 if native_bf16(flags) else torch.float32


def resolve_dtype(dtype=None, flags=None) -> torch.dtype:
    """The user's dtype ("bf16", "fp32", torch.float16, ...) when given, else this CPU's fast dtype."""
    if dtype is None or dtype == "auto":
        return fast_dtype(flags)
    if isinstance(dtype, torch.dtype) and dtype in DTYPES.values():
        return dtype
    if isinstance(dtype, str) and dtype.lower() in DTYPES:
        return DTYPES[dtype.lower()]
    raise NpuMoeError(f"dtype {dtype!r} is not one the workbench runs; use 'auto' (this CPU's fast dtype), "
                      f"or one of {', '.join(sorted(set(DTYPES)))}")


def dtype_name(dtype: torch.dtype) -> str:
    return {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}.get(dtype, str(dtype))


def row_fields(dtype: torch.dtype, flags=None) -> dict:
    """What every measured result row records about the numerics it ran: `dtype`, `cpu_flags` (the relevant
    ones, sorted; '+override' when NPUMOE_CPU_FLAGS replaced the detected flags, '+isa=AVX2' under an ISA limit)
    and `cpu_model`, and `host_malloc`, the allocator policy in force (core/host_memory.py)."""
    overridden = flags is None and os.environ.get(ENV_FLAGS) is not None
    limit = isa_limit() if flags is None and not overridden else None
    flags = cpu_flags() if flags is None else flags
    text = (",".join(sorted(f for f in flags if f in RELEVANT)) + ("+override" if overridden else "")
            + (f"+isa={limit}" if limit else ""))
    return {"dtype": dtype_name(dtype), "cpu_flags": text, "cpu_model": cpu_model(), "host_malloc": malloc_policy()}


__all__ = ["cpu_flags", "cpu_model", "native_bf16", "native_fp16", "fast_dtype", "resolve_dtype", "dtype_name",
           "row_fields", "isa_limit", "ENV_FLAGS"]
