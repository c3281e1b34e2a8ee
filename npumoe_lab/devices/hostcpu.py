"""What this host's CPU is, read from the host itself (/proc/cpuinfo), for `npumoe-lab platforms` and results.

The project's VMs differ (an Intel Xeon with AMX, an AMD EPYC Zen 4 with avx512_bf16, an AMD EPYC with AVX2 only:
docs/sources/ENVIRONMENT.md), and bf16 speed differs ~60x between them, so the measured platform is described
from the machine it runs on, never from a default.
"""
from __future__ import annotations

import os
import platform as _platform

from npumoe_lab.devices.hostprofile import find_host_fit, host_chip, load_host_profile
from npumoe_lab.devices.platform import format_platforms

# the flags that decide which dtype and kernels are fast here
ISA_FLAGS = ("avx2", "avx512f", "avx512_bf16", "avx512_fp16", "amx_tile", "amx_bf16")


def cpu_info(path: str = "/proc/cpuinfo") -> dict:
    """{'model': str, 'flags': set[str], 'logical_cpus': int} of this host (flags empty where not readable)."""
    model, flags = None, set()
    try:
        with open(path) as fh:
            for line in fh:
                key, _, value = line.partition(":")
                key = key.strip()
                if key == "model name" and model is None:
                    model = value.strip()
                elif key == "flags" and not flags:
                    flags = set(value.split())
    except OSError:
        pass
    return {"model": model or _platform.processor() or _platform.machine(), "flags": flags,
            "logical_cpus": os.cpu_count() or 1}


def describe_host(info: dict | None = None) -> str:
    """A few lines on the measured `cpu` platform's real host and whether its cost model was measured here."""
    info = info or cpu_info()
    isa = ", ".join(f"{f} {'yes' if f in info['flags'] else 'no'}" for f in ISA_FLAGS) if info["flags"] else \
        "flags not readable"
    return "\n".join([f"This host (the measured `cpu` platform): {info['model']}, {info['logical_cpus']} logical CPUs",
                      f"  ISA: {isa}", f"  cpu platform cost model (prices plans: residency, tuner, explorer): "
                      f"{cost_model_source()}", "  sources cited above: docs/sources/*.md in this repository"])


def cost_model_source() -> str:
    """Which numbers price plans on `--platform cpu` here: this host's fit, its profile, or another machine's."""
    fit = find_host_fit()
    if fit is not None:
        f = fit.get("host_fit") or {}
        return (f"this host's fit {fit['_path']} (fit-device --platform cpu on {f.get('rows_used')} rows, "
                f"{f.get('created')}; host key {fit['chip']})")
    prof = load_host_profile()
    if prof.get("measured"):
        return (f"this host's profile (single best-case rates, {prof.get('created')}); no host fit for key "
                f"{host_chip()}: run measure --device cpu and fit-device --platform cpu for a fitted one")
    return (f"NOT this host's: defaults of another machine of the project (docs/sources/ENVIRONMENT.md "
            f"§4); no fit or profile for host key {host_chip()}: run `npumoe-lab measure --device cpu` and "
            "`npumoe-lab fit-device --platform cpu` to price plans with this host's own model")


def platforms_report() -> str:
    return format_platforms() + "\n\n" + describe_host()
