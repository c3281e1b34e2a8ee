"""Host profile: micro-benchmarks of this CPU so the `cpu` platform's cost model (used by residency) has numbers.

Runs on the `cpu` platform are timed for real (measured.py); this profile only feeds `DeviceModel.estimate` there.
Measured once per (CPU model, core count, torch version, torch threads) and cached as YAML under
$NPUMOE_CACHE_DIR (default ~/.cache/npumoe-lab). Until measured, defaults from docs/sources/ENVIRONMENT.md apply and every
filled parameter says so in its source.
"""
from __future__ import annotations

import datetime as _dt
import os
import platform as _platform
import time
import warnings
from pathlib import Path

import yaml

from npumoe_lab.errors import NpuMoeError
from npumoe_lab.utils import cache_dir, host_description, sha256_json

# docs/sources/ENVIRONMENT.md §4 and its Qwen3-geometry addendum, measured on the project's build machine (2 vCPU Intel Xeon
# with AMX, torch 2.13, 2 threads). Another host (even another VM of the same project) may differ: measure it.
DEFAULTS = {
    "gemm_bf16_flops": 2.2e12,     # dense bf16 GEMM [4096x2048]x[2048x3072] (AMX), docs/sources/ENVIRONMENT.md addendum
    "gemm_fp32_flops": 2.16e11,    # fp32 bmm on pre-packed [64,256,1024], docs/sources/ENVIRONMENT.md §4 table
    "mem_read_bytes_s": 2.1e10,    # sum over 512 MB, docs/sources/ENVIRONMENT.md addendum
    "op_overhead_s": 2.4e-6,       # torch.add on tiny tensors, docs/sources/ENVIRONMENT.md §4
    "module_call_s": 3.65e-6,      # nn.Module call on tiny tensors, docs/sources/ENVIRONMENT.md §4
    "threads": 2,
    "freq_hz": 2.6e9,              # psutil.cpu_freq().current = 2600 MHz, docs/sources/ENVIRONMENT.md §5
}
DEFAULT_SOURCE = ("default from docs/sources/ENVIRONMENT.md §4-5 (measured on another machine of the project, an "
                  "Intel Xeon with AMX); NOT measured on this host - run "
                  "npumoe_lab.devices.hostprofile.measure_host_profile()")


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return _platform.processor() or _platform.machine()


def host_key() -> dict:
    import torch
    return {"cpu_model": _cpu_model(), "cpu_count": os.cpu_count(), "torch": str(torch.__version__),
            "threads": torch.get_num_threads()}


def host_chip() -> str:
    """`host-<key>`: this CPU model, core count, torch build and torch threads (host_key), hashed: the chip of the
    rows `measure --device cpu` writes and the key a host fit is found by."""
    return f"host-{sha256_json(host_key())[:12]}"


def profile_path() -> Path:
    return cache_dir() / f"{host_chip()}.yaml"


def host_fit_path(chip: str | None = None) -> Path:
    """Where this host's registered fit lives: $NPUMOE_CACHE_DIR/host-fits/<chip>-fit.yaml."""
    return cache_dir() / "host-fits" / f"{chip or host_chip()}-fit.yaml"


def register_host_fit(path, chip: str) -> Path:
    """Copy a cpu-fit.yaml (fit-device --platform cpu) to host_fit_path(chip): `--platform cpu` on that host then
    prices plans (residency, tuner, explorer) with it."""
    dest = host_fit_path(chip)
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_suffix(".tmp")
    tmp.write_text(Path(path).read_text())
    tmp.replace(dest)
    return dest


def find_host_fit() -> dict | None:
    """This host's registered fit (its YAML as a dict, key `_path` added), None when there is none or it is of
    another host key (another CPU, core count, torch build or thread count). $NPUMOE_HOST_FIT=off ignores it (the
    test suite does: its expectations must not depend on what was last fitted here); =PATH uses that fit file."""
    choice = os.environ.get("NPUMOE_HOST_FIT", "")
    if choice.lower() == "off":
        return None
    path = Path(choice) if choice else host_fit_path()
    if choice and not path.is_file():
        raise NpuMoeError(f"NPUMOE_HOST_FIT={choice!r} is not a file; point it at a cpu-fit.yaml or unset it")
    if not path.is_file():
        return None
    try:
        raw = yaml.safe_load(path.read_text())
    except yaml.YAMLError:
        raise NpuMoeError(f"host fit {path} does not parse; delete it and run fit-device --platform cpu") from None
    if not isinstance(raw, dict) or "host_model" not in raw or (raw.get("chip") != host_chip() and not choice):
        return None
    return {**raw, "_path": str(path)}


def _best_rate(fn, work: float, budget_s: float) -> float:
    """Best work/second over repeated calls within budget_s (best = least disturbed by other tenants)."""
    fn()  # warm-up: allocation, kernel selection
    best, deadline = 0.0, time.perf_counter() + budget_s
    while True:
        t0 = time.perf_counter()
        fn()
        dt = time.perf_counter() - t0
        best = max(best, work / dt) if dt > 0 else best
        if time.perf_counter() >= deadline:
            return best


def _per_call(fn, budget_s: float, batch: int = 200) -> float:
    """Smallest mean seconds per call of a tiny op, over batches of `batch` calls."""
    best, deadline = float("inf"), time.perf_counter() + budget_s
    while True:
        t0 = time.perf_counter()
        for _ in range(batch):
            fn()
        best = min(best, (time.perf_counter() - t0) / batch)
        if time.perf_counter() >= deadline:
            return best


def measure_host_profile(seconds: float = 2.0, save: bool = True, gemm_n: int = 1024, mem_mb: int = 256) -> dict:
    """Micro-benchmark this host at the current torch thread count; returns (and caches) the profile dict."""
    import psutil
    import torch
    if not seconds > 0 or gemm_n < 16 or mem_mb < 1:
        raise NpuMoeError(f"measure_host_profile needs seconds > 0, gemm_n >= 16, mem_mb >= 1; got "
                          f"seconds={seconds}, gemm_n={gemm_n}, mem_mb={mem_mb}")
    share = seconds / 5
    n, flop = gemm_n, 2.0 * gemm_n ** 3
    a32, b32 = torch.randn(n, n), torch.randn(n, n)
    a16, b16 = a32.bfloat16(), b32.bfloat16()
    big = torch.ones(mem_mb * 2 ** 20 // 4)
    tiny, module = torch.ones(1, 8), torch.nn.Linear(8, 8)  # module: the smallest real graph call
    with torch.inference_mode():
        prof = {
            "gemm_fp32_flops": _best_rate(lambda: torch.mm(a32, b32), flop, share),
            "gemm_bf16_flops": _best_rate(lambda: torch.mm(a16, b16), flop, share),
            "mem_read_bytes_s": _best_rate(lambda: big.sum(), big.numel() * 4.0, share),
            "op_overhead_s": _per_call(lambda: torch.add(tiny, tiny), share),
            "module_call_s": _per_call(lambda: module(tiny), share),
        }
    freq = psutil.cpu_freq()
    prof.update(threads=torch.get_num_threads(), freq_hz=float(freq.current * 1e6) if freq and freq.current
                else DEFAULTS["freq_hz"], measured=True, host=host_description(), key=host_key(),
                created=_dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
                settings={"seconds": seconds, "gemm_n": gemm_n, "mem_mb": mem_mb})
    if save:
        path = profile_path()
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(yaml.safe_dump(prof, sort_keys=True))
        tmp.replace(path)  # atomic: a reader never sees half a profile
    return prof


def load_host_profile(measure_if_missing: bool = False) -> dict:
    """The cached profile of this host, else (measure_if_missing) a fresh one, else docs/sources/ENVIRONMENT.md defaults."""
    path = profile_path()
    if path.is_file():
        prof = yaml.safe_load(path.read_text())
        if not isinstance(prof, dict) or not all(k in prof for k in DEFAULTS):
            raise NpuMoeError(f"host profile {path} is damaged or from an older version; delete it and run "
                              f"measure_host_profile() again")
        prof["source"] = f"measured on this host by measure_host_profile ({prof.get('created')}, {path})"
        return prof
    if measure_if_missing:
        prof = measure_host_profile()
        prof["source"] = f"measured on this host by measure_host_profile ({prof['created']}, {path})"
        return prof
    return {**DEFAULTS, "measured": False, "source": DEFAULT_SOURCE}


def fill_host_params(params: dict, profile: dict | None = None, use_fit: bool = True) -> None:
    """Fill platform entries marked `from_host_profile: <key>` (and `alternatives_from_host_profile`) in place:
    from this host's registered fit where it fitted the entry (`use_fit` and find_host_fit), else from the host
    profile (measured here, or another machine's defaults: the entry's source says which)."""
    prof = load_host_profile() if profile is None else profile
    fit = find_host_fit() if use_fit and profile is None else None
    rates = {"gemm_bf16_flops", "gemm_fp32_flops", "mem_read_bytes_s", "module_call_s", "op_overhead_s"}
    wants = any(e.get("from_host_profile") in rates for r in params.values() for e in r.values())
    # NPUMOE_HOST_FIT=off asks for the defaults on purpose (tests, a comparison with another machine): no warning
    asked = os.environ.get("NPUMOE_HOST_FIT", "").lower() == "off"
    if use_fit and profile is None and fit is None and not prof.get("measured") and wants and not asked:
        warnings.warn("the cpu platform prices plans (residency, tuner, explorer) with DEFAULTS OF ANOTHER MACHINE "
                      f"(docs/sources/ENVIRONMENT.md): no host fit for this host's key {host_chip()}; run "
                      "`npumoe-lab measure --device cpu` and `npumoe-lab fit-device --platform cpu` to use its own",
                      UserWarning, stacklevel=2)
    for role_name, role in params.items():
        for name, entry in role.items():
            key = entry.get("from_host_profile")
            if key is None:
                continue
            fitted = ((fit or {}).get(role_name) or {}).get(name)
            if isinstance(fitted, dict) and str(fitted.get("source", "")).startswith("host_model."):
                entry.pop("from_host_profile")
                alts = {a: prof[k] for a, k in entry.pop("alternatives_from_host_profile", {}).items()}
                entry.update(value=fitted["value"], confidence=fitted["confidence"],
                             source=f"this host's fit {fit['_path']}: {fitted['source']}",
                             alternatives={**entry.get("alternatives", {}), **alts, **fitted.get("alternatives", {})})
                continue
            if key not in prof:
                raise NpuMoeError(f"platform parameter {name} wants host profile key {key!r}, which the profile "
                                  f"lacks; valid keys: {', '.join(sorted(DEFAULTS))}")
            entry["value"] = prof[key]
            entry["source"] = f"{prof['source']} [{key}]"
            entry["confidence"] = "M" if prof.get("measured") else "L"
            alts = entry.pop("alternatives_from_host_profile", {})
            entry["alternatives"] = {**entry.get("alternatives", {}), **{a: prof[k] for a, k in alts.items()}}
