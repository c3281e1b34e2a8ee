"""Platform profiles: an NPU role and a CPU role, each a roofline DeviceModel with sourced parameters.

A platform is a YAML file in `platforms/`. Every parameter is `{value, unit, source, confidence, note}` (values in SI
units, named by the key's suffix: `_s`, `_flops` = FLOP/s, `_bytes_s` = B/s, `_w`, `_hz`). A parameter may list
`alternatives` (named values from other sources); an override may name one of them instead of a number.
`kind: modeled` platforms (Apple chips) give time from the model; the `cpu` platform (this host) is `measured`:
runs time it for real, and its model numbers come from the host profile (hostprofile.py), for residency's use.
`throughput_curve` (optional, either role) is the measured GEMM rate by size: a list of [size, FLOP/s] points of
square GEMMs. An op with a GEMM shape (OpCost.gemm = M, N, K) is rated at its effective size
(M*N*K)**(1/3), interpolated log-log between points and clamped at the ends (`DeviceModel.gemm_rate`).

Two NPU cost structures: `npu.graph_model` 0 = the per-op roofline above (the shipped default of the sourced
platforms, so their old numbers reproduce), 1 = graph-level (graph_cost.py: utilisation rising with work per call,
stored weight bytes per format, a decompression floor, an attention term); select it with the override
`npu_graph_model=graph`. Optional top-level keys: `chip` (the measurement rows' chip, data/measurements),
`fit` (free parameters and their bounds for `fit-device`), `posterior` (draws written by `fit-device`).
A platform is named by `resolve_platform(spec)`: a name, a YAML path, either with overrides in brackets,
e.g. "m2-max[npu_dispatch_s=4e-4; npu_graph_model=graph]" (`;` or `,` between overrides).
"""
from __future__ import annotations

import copy
import dataclasses
import functools
import math
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from npumoe_lab.errors import NpuMoeError
from npumoe_lab.utils import sha256_json
from npumoe_lab.devices.graph_cost import GRAPH_PARAMS, PATH_PARAMS, graph_time

PLATFORM_DIR = Path(__file__).resolve().parent / "platforms"
KINDS = ("modeled", "measured")
ROLES = ("npu", "cpu")
FIELDS = ("value", "unit", "source", "confidence", "note")
CONFIDENCE = ("H", "M", "L")
REQUIRED = {
    "npu": ("dispatch_s", "sync_s", "throughput_flops", "bandwidth_bytes_s", "graph_limit_bytes", "max_dim",
            "active_power_w", "idle_power_w", "weight_bytes", "host_cores"),
    "cpu": ("cores", "throughput_flops", "bandwidth_bytes_s", "op_overhead_s", "power_per_core_w",
            "idle_power_w", "freq_hz"),
}


def _number(v) -> bool:
    return not isinstance(v, bool) and isinstance(v, (int, float)) and math.isfinite(v)


def _curve(points, where: str) -> tuple[tuple[float, float], ...] | None:
    """[[size, flops], ...] with sizes strictly increasing and rates > 0; [] or None = no curve (flat rate)."""
    if points is None or (isinstance(points, (list, tuple)) and len(points) == 0):
        return None
    ok = isinstance(points, (list, tuple)) and all(
        isinstance(p, (list, tuple)) and len(p) == 2 and all(_number(x) and x > 0 for x in p) for p in points)
    if not ok or any(b[0] <= a[0] for a, b in zip(points, points[1:])):
        raise NpuMoeError(f"{where}: throughput_curve must be [[size, FLOP/s], ...] with positive numbers and "
                          f"strictly increasing sizes, got {points!r}")
    return tuple((float(a), float(b)) for a, b in points)


@dataclass(frozen=True)
class DeviceModel:
    """One role of a platform. estimate() = calls*(dispatch+sync+op_overhead) + max(flops/rate, bytes/bw), rate =
    gemm_rate(op.gemm) when the role has a throughput_curve and the op a GEMM shape, else throughput_flops."""
    role: str
    kind: str
    throughput_flops: float
    bandwidth_bytes_s: float
    active_power_w: float
    idle_power_w: float
    dispatch_s: float = 0.0          # npu: Core ML per-prediction overhead
    sync_s: float = 0.0              # npu: CPU<->NPU synchronisation per call
    op_overhead_s: float = 0.0       # cpu: framework overhead per op call
    graph_limit_bytes: float | None = None
    max_dim: int | None = None
    freq_hz: float | None = None     # cpu: clock used to turn busy seconds into cycles
    cores: int | None = None         # cpu: cores one CPU op keeps busy (its power and cycles count them)
    throughput_curve: tuple | None = None   # ((size, FLOP/s), ...) square-GEMM rates, sizes increasing
    weight_bytes: int | None = None  # stored weight element size on this role (None: the activation size)
    host_cores: float = 0.0          # npu: CPU cores busy per call through its dispatch + sync
    graph_model: bool = False        # npu: graph-level cost structure (graph_cost.py) instead of the per-op roofline
    graph_peak_flops: float | None = None     # graph-level: peak rate a large fused graph reaches
    work_half_flops: float = 0.0     # graph-level: matmul FLOPs per call at which utilisation is half
    rows_half: float = 0.0           # graph-level: rows per GEMM at which utilisation is half
    attention_flops: float | None = None      # graph-level: rate of activation x activation (attention) GEMMs
    decompress_params_s: float | None = None  # graph-level: palettized weight elements expanded per second
    clusters: float = 1.0            # graph-level: ANE clusters serving one model (Ultra direct path: 2)
    sram_bytes: float = 1e12         # graph-level: on-chip SRAM a GEMM's weight tile spills past (1e12: none)
    spill_factor: float = 1.0        # graph-level: rate fraction of a spilled GEMM (1: no spill)
    direct_dispatch_s: float | None = None        # npu: per-call cost through the direct (private) path
    direct_bandwidth_bytes_s: float | None = None  # npu: weight-streaming rate through the direct path
    direct_rows_half: float | None = None  # npu: rows_half of the direct path (GEMV tiling differs from Core ML)
    floor_power_w: float | None = None  # npu: power at ~0 utilisation (power rows: floor + (active-floor) x util)

    def __post_init__(self):
        if self.role not in ROLES:
            raise NpuMoeError(f"DeviceModel role {self.role!r} is unknown; use one of {', '.join(ROLES)}")
        if self.kind not in KINDS:
            raise NpuMoeError(f"DeviceModel kind {self.kind!r} is unknown; use one of {', '.join(KINDS)}")
        for f in ("throughput_flops", "bandwidth_bytes_s"):
            if not _number(getattr(self, f)) or getattr(self, f) <= 0:
                raise NpuMoeError(f"{self.role} {f} must be a positive number, got {getattr(self, f)!r}")
        object.__setattr__(self, "throughput_curve", _curve(self.throughput_curve, f"{self.role} DeviceModel"))
        for f in ("active_power_w", "idle_power_w", "dispatch_s", "sync_s", "op_overhead_s", "host_cores"):
            if not _number(getattr(self, f)) or getattr(self, f) < 0:
                raise NpuMoeError(f"{self.role} {f} must be a number >= 0, got {getattr(self, f)!r}")
        for f in ("graph_limit_bytes", "max_dim", "freq_hz", "cores", "weight_bytes", "graph_peak_flops",
                  "attention_flops", "decompress_params_s", "sram_bytes", "direct_dispatch_s",
                  "direct_bandwidth_bytes_s", "floor_power_w", "direct_rows_half"):
            v = getattr(self, f)
            if v is not None and (not _number(v) or v <= 0):
                raise NpuMoeError(f"{self.role} {f} must be a positive number or None, got {v!r}")
        for f in ("work_half_flops", "rows_half"):
            if not _number(getattr(self, f)) or getattr(self, f) < 0:
                raise NpuMoeError(f"{self.role} {f} must be a number >= 0, got {getattr(self, f)!r}")
        if not _number(self.clusters) or self.clusters < 1:
            raise NpuMoeError(f"{self.role} clusters must be a number >= 1, got {self.clusters!r}")
        if not _number(self.spill_factor) or not 0 < self.spill_factor <= 1:
            raise NpuMoeError(f"{self.role} spill_factor must be in (0, 1], got {self.spill_factor!r}")
        if self.graph_model:
            missing = [f for f in ("graph_peak_flops", "attention_flops", "decompress_params_s")
                       if getattr(self, f) is None]
            if missing:
                raise NpuMoeError(f"{self.role}: the graph-level structure needs {', '.join(missing)}; add them to "
                                  "the platform YAML (see m2-max.yaml) or leave graph_model at 0")

    def for_path(self, path: str) -> "DeviceModel":
        """This role as a measurement through `path` sees it: the direct path's own dispatch (no separate sync),
        bandwidth and rows_half where given; every other path (coreml, onnxruntime, torch...) as is."""
        if path != "direct" or all(v is None for v in (self.direct_dispatch_s, self.direct_bandwidth_bytes_s,
                                                        self.direct_rows_half)):
            return self
        changes = {}
        if self.direct_dispatch_s is not None:
            changes.update(dispatch_s=self.direct_dispatch_s, sync_s=0.0, op_overhead_s=0.0)
        if self.direct_bandwidth_bytes_s is not None:
            changes.update(bandwidth_bytes_s=self.direct_bandwidth_bytes_s)
        if self.direct_rows_half is not None:
            changes.update(rows_half=self.direct_rows_half)
        return dataclasses.replace(self, **changes)

    @property
    def call_overhead_s(self) -> float:
        return self.dispatch_s + self.sync_s + self.op_overhead_s

    def gemm_rate(self, gemm) -> float:
        """FLOP/s of a GEMM of shape (M, N, K): the curve at the effective size (M*N*K)**(1/3), log-log between
        points, clamped outside them; throughput_flops when there is no curve or no shape.

        Why the geometric mean: the sources measure square GEMMs only, so a non-square one must be mapped to a
        square one. The cube with the same MACs keeps the measured points exact for square shapes and rates a GEMM
        by its work per dispatch; min(M, N, K) would rate a skinny expert GEMM ([C, H] x [H, I], C << H) like a
        tiny cube even though its weight tiles are large. The bandwidth bound is the roofline's other term.
        """
        curve = self.throughput_curve
        if curve is None or gemm is None:
            return self.throughput_flops
        m, n, k = gemm
        size = (float(m) * n * k) ** (1.0 / 3.0)
        if size <= curve[0][0]:
            return curve[0][1]
        if size >= curve[-1][0]:
            return curve[-1][1]
        for (s0, r0), (s1, r1) in zip(curve, curve[1:]):
            if size <= s1:
                t = math.log(size / s0) / math.log(s1 / s0)
                return math.exp(math.log(r0) + t * (math.log(r1) - math.log(r0)))
        raise AssertionError("unreachable: size within the curve's range")

    def estimate(self, op) -> float:
        """Modeled seconds for `op` (an OpCost): fixed cost per call plus the roofline bound; with `graph_model`,
        the graph-level cost of graph_cost.py."""
        if self.graph_model:
            return graph_time(self, op)
        rate = self.gemm_rate(getattr(op, "gemm", None))
        return op.calls * self.call_overhead_s + max(op.flops / rate, op.bytes / self.bandwidth_bytes_s)

    @property
    def host_call_s(self) -> float:
        """CPU core-seconds one NPU call costs the host (dispatch + sync on host_cores cores); 0 for a cpu role."""
        return self.host_cores * (self.dispatch_s + self.sync_s)

    def fits_graph(self, weight_bytes: float, dims=()) -> bool:
        """Whether a static graph with these weights and tensor dims stays on this device (NPU limits)."""
        if self.graph_limit_bytes is not None and weight_bytes > self.graph_limit_bytes:
            return False
        return self.max_dim is None or all(d <= self.max_dim for d in dims)


@dataclass(frozen=True)
class Platform:
    name: str
    description: str
    kind: str
    npu: DeviceModel
    cpu: DeviceModel
    npu_shares_cpu: bool
    params: dict
    hash: str
    chip: str = ""                   # the measurement rows' chip (data/measurements); the name when not given
    fit: tuple = ()                  # free parameters for fit-device: ({param, low, high}, ...)
    posterior: dict | None = None    # fit-device's posterior: {params: [...], draws: [[...], ...], sigma_log: [...]}
    source: str = ""                 # the name or path it was loaded from
    overrides: dict = field(default_factory=dict)

    def __post_init__(self):
        if self.kind not in KINDS:
            raise NpuMoeError(f"platform {self.name!r} kind {self.kind!r} is unknown; use one of {', '.join(KINDS)}")
        if (self.npu.role, self.cpu.role) != ("npu", "cpu"):
            raise NpuMoeError(f"platform {self.name!r} roles are swapped; npu= takes the npu role, cpu= the cpu role")

    def device(self, role: str) -> DeviceModel:
        if role not in ROLES:
            raise NpuMoeError(f"device role {role!r} is unknown; use one of {', '.join(ROLES)}")
        return self.npu if role == "npu" else self.cpu

    @property
    def label(self) -> str:
        """The name result rows, summaries and figure titles show: the platform's name (a fitted YAML's own, e.g.
        m2-max-fit) plus its overrides, e.g. "m2-max[npu_dispatch_s=0.0004]" (keys sorted, `; ` between them), so
        that two platforms of one chip with different parameters are told apart by more than platform_hash. It
        is itself a spec `resolve_platform` reads back for a bundled name. `name` stays the chip profile's name
        (the rows' `platform_base`)."""
        if not self.overrides:
            return self.name
        items = "; ".join(f"{k}={v!r}" if isinstance(v, float) else f"{k}={v}"
                          for k, v in sorted(self.overrides.items()))
        return f"{self.name}[{items}]"

    def provenance(self) -> dict:
        return {"platform_profile": self.name, "platform_hash": self.hash}


def list_platforms() -> list[str]:
    return sorted(p.stem for p in PLATFORM_DIR.glob("*.yaml"))


@functools.lru_cache(maxsize=None)
def _read_yaml(name: str) -> dict:
    if not isinstance(name, str) or name not in list_platforms():
        raise NpuMoeError(f"unknown platform {name!r}; valid platforms: {', '.join(list_platforms())} "
                          "(or a platform YAML path)")
    return _read_path(PLATFORM_DIR / f"{name}.yaml")


def _read_path(path: Path) -> dict:
    """The validated raw YAML of a platform file; parsed once per (path, modification time): a fit's posterior
    draws make the file large, and sensitivity loads it with hundreds of overrides. Callers deep-copy it."""
    try:
        stamp = Path(path).stat().st_mtime_ns
    except OSError as exc:
        raise NpuMoeError(f"{path}: cannot read the platform file ({exc.strerror})") from None
    return _read_path_cached(str(path), stamp)


@functools.lru_cache(maxsize=64)
def _read_path_cached(name: str, stamp: int) -> dict:
    path = Path(name)
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    try:
        with open(path) as f:
            raw = yaml.load(f, Loader=loader)  # noqa: S506 - a safe loader (the C one where built)
    except yaml.YAMLError as exc:
        raise NpuMoeError(f"{path}: not valid YAML ({str(exc).splitlines()[0]}); fix the file") from None
    except OSError as exc:
        raise NpuMoeError(f"{path}: cannot read the platform file ({exc.strerror})") from None
    _validate(raw, path)
    return raw


def _parse_value(text: str):
    try:
        return float(text)
    except ValueError:
        return text


def parse_platform_spec(spec: str) -> tuple[str, dict]:
    """"name", "path.yaml", "name[k=v; k2=v2]" -> (name or path, {knob: number or alternative name})."""
    if not isinstance(spec, str) or not spec.strip():
        raise NpuMoeError(f"platform spec must be a name or a YAML path, got {spec!r}")
    spec = spec.strip()
    base, bracket, rest = spec.partition("[")
    overrides = {}
    if bracket:
        if not rest.endswith("]") or "[" in rest[:-1] or "]" in rest[:-1]:
            raise NpuMoeError(f"platform spec {spec!r} does not parse: write NAME[knob=value; knob=value]")
        for item in filter(None, (x.strip() for x in rest[:-1].replace(";", ",").split(","))):
            knob, eq, value = (x.strip() for x in item.partition("="))
            if not eq or not knob or not value:
                raise NpuMoeError(f"platform spec {spec!r}: override {item!r} does not parse; write knob=value "
                                  "(e.g. npu_dispatch_s=4e-4 or npu_graph_model=graph)")
            overrides[knob] = _parse_value(value)
    if not base.strip():
        raise NpuMoeError(f"platform spec {spec!r} names no platform before its overrides")
    return base.strip(), overrides


def _is_path(base: str) -> bool:
    return base.endswith((".yaml", ".yml")) or "/" in base


def resolve_platform(spec, **overrides) -> Platform:
    """A platform from a spec: a bundled name, a YAML path (a fitted platform), either with [overrides];
    keyword overrides are applied after the spec's own."""
    if isinstance(spec, Platform):
        return spec if not overrides else get_platform(spec.source, **{**spec.overrides, **overrides})
    base, spec_overrides = parse_platform_spec(spec)
    return get_platform(base, **{**spec_overrides, **overrides})


def _validate(raw, path: Path) -> None:
    if not isinstance(raw, dict):
        raise NpuMoeError(f"{path}: not a mapping; a platform file needs name, description, kind, npu, cpu")
    for key in ("name", "description", "kind", "npu_shares_cpu", "npu", "cpu"):
        if key not in raw:
            raise NpuMoeError(f"{path}: missing top-level key {key!r}; add it (see m2-max.yaml)")
    if raw["name"] != path.stem:
        raise NpuMoeError(f"{path}: name {raw['name']!r} differs from the file name; make them equal")
    if "chip" in raw and not (isinstance(raw["chip"], str) and raw["chip"]):
        raise NpuMoeError(f"{path}: chip must be a chip name as in data/measurements (e.g. m2-max)")
    _validate_fit(raw.get("fit"), path, raw)
    if raw["kind"] not in KINDS or not isinstance(raw["npu_shares_cpu"], bool):
        raise NpuMoeError(f"{path}: kind must be one of {KINDS} and npu_shares_cpu a boolean")
    for role, keys in REQUIRED.items():
        if not isinstance(raw[role], dict):
            raise NpuMoeError(f"{path}: {role} must be a mapping of parameters; see m2-max.yaml")
        missing = [k for k in keys if k not in raw[role]]
        if missing:
            raise NpuMoeError(f"{path}: {role} lacks parameters {missing}; add them with {', '.join(FIELDS)}")
        for key, entry in raw[role].items():
            where = f"{path}: {role}.{key}"
            if not isinstance(entry, dict) or any(f not in entry for f in FIELDS):
                raise NpuMoeError(f"{where} must have all of {', '.join(FIELDS)}")
            if not all(isinstance(entry[f], str) and entry[f].strip() for f in FIELDS[1:]):
                raise NpuMoeError(f"{where}: unit, source, confidence and note must be non-empty text")
            if entry["confidence"] not in CONFIDENCE:
                raise NpuMoeError(f"{where}: confidence {entry['confidence']!r} must be one of {CONFIDENCE}")
            if "from_host_profile" in entry or "derived_from" in entry:
                continue  # filled in at load time (host profile; cpu_active_power = cpu power_per_core_w x cores)
            if key == "throughput_curve":
                _curve(entry["value"], where)
                for alt, v in entry.get("alternatives", {}).items():
                    _curve(v, f"{where} alternative {alt!r}")
                continue
            if not _number(entry["value"]) or entry["value"] < 0:
                raise NpuMoeError(f"{where}: value {entry['value']!r} is not a number >= 0 (write floats as 5.4e+12)")
            for alt, v in entry.get("alternatives", {}).items():
                if not _number(v) or v < 0:
                    raise NpuMoeError(f"{where}: alternative {alt!r} = {v!r} is not a number >= 0")


def _validate_fit(fit, path, raw) -> None:
    """`fit:` = [{param: npu_dispatch_s, low: .., high: ..}, ...]: free parameters (log-uniform priors)."""
    if fit is None:
        return
    if not isinstance(fit, list) or not fit:
        raise NpuMoeError(f"{path}: fit must be a non-empty list of {{param, low, high}}")
    for item in fit:
        if not isinstance(item, dict) or set(item) - {"param", "low", "high", "note"} or \
                not {"param", "low", "high"} <= set(item):
            raise NpuMoeError(f"{path}: fit entry {item!r} must have param, low, high (and optionally note)")
        role, _, key = str(item["param"]).partition("_")
        if role not in ROLES or key not in raw[role]:
            raise NpuMoeError(f"{path}: fit param {item['param']!r} is not a parameter of this platform "
                              "(write role_key, e.g. npu_dispatch_s)")
        lo, hi = item["low"], item["high"]
        if not (_number(lo) and _number(hi) and 0 < lo < hi):
            raise NpuMoeError(f"{path}: fit param {item['param']!r} needs 0 < low < high, got {lo!r}, {hi!r}")


def _apply_override(params: dict, knob: str, value) -> None:
    role, _, key = knob.partition("_")
    entry = params.get(role, {}).get(key) if role in ROLES else None
    if entry is None:
        valid = [f"{r}_{k}" for r in ROLES for k in params[r]]
        raise NpuMoeError(f"unknown platform override {knob!r}; valid knobs: {', '.join(valid)}")
    alternatives = entry.get("alternatives", {})
    if key == "throughput_curve" and not isinstance(value, str):
        raise NpuMoeError(f"override {knob}={value!r}: a curve is set by naming one of its alternatives "
                          f"({', '.join(alternatives) or 'none listed'}); for one flat rate set {role}_throughput_flops")
    if isinstance(value, str):
        if value not in alternatives:
            raise NpuMoeError(f"override {knob}={value!r} names no alternative; use a number or one of "
                              f"{', '.join(alternatives) or '(none listed)'}")
        label, value = f"alternative {value!r}", alternatives[value]
    elif _number(value) and value >= 0:
        label = "override"
    else:
        raise NpuMoeError(f"override {knob}={value!r} must be a number >= 0 or an alternative name")
    entry["note"] = f"{label} of {entry['value']!r} ({entry['source']}); original note: {entry['note']}"
    entry.update(value=value, source=f"{label} (get_platform {knob}=...)", confidence="L")
    curve = params[role].get("throughput_curve")
    if key == "throughput_flops" and curve is not None and curve["value"]:
        # a flat-rate override means that rate for every op (sensitivity runs: "ANE at 1.68 TF/s")
        curve["note"] = f"set aside by the override {knob}={value!r}; original note: {curve['note']}"
        curve.update(value=[], source=f"set aside by {label} of throughput_flops", confidence="L")


def _fill_derived(params: dict) -> None:
    """`derived_from: cpu_active_power` (host: the NPU role runs on the CPU's cores, at the CPU's power)."""
    for role in ROLES:
        for name, entry in params[role].items():
            if entry.get("derived_from") == "cpu_active_power" and entry["value"] is None:
                cpu = params["cpu"]
                entry["value"] = cpu["power_per_core_w"]["value"] * cpu["cores"]["value"]
            elif entry.get("derived_from") is not None and entry["value"] is None:
                raise NpuMoeError(f"{role}.{name}: unknown derived_from {entry['derived_from']!r}; "
                                  f"only cpu_active_power is defined")


def _device(role: str, kind: str, p: dict) -> DeviceModel:
    v = {k: e["value"] for k, e in p.items()}
    wb = v.get("weight_bytes")
    common = dict(role=role, kind=kind, throughput_flops=v["throughput_flops"],
                  bandwidth_bytes_s=v["bandwidth_bytes_s"], idle_power_w=v["idle_power_w"],
                  throughput_curve=v.get("throughput_curve"), weight_bytes=None if wb is None else int(wb))
    if wb is not None and (wb != int(wb) or wb < 1):
        raise NpuMoeError(f"{role}.weight_bytes must be a whole number of bytes >= 1 (2 = fp16, 1 = int8), got {wb!r}")
    if role == "npu":
        graph = {k: float(v[k]) for k in GRAPH_PARAMS + PATH_PARAMS + ("floor_power_w",) if v.get(k) is not None}
        return DeviceModel(**common, active_power_w=v["active_power_w"], dispatch_s=v["dispatch_s"],
                           sync_s=v["sync_s"], graph_limit_bytes=v["graph_limit_bytes"], max_dim=int(v["max_dim"]),
                           host_cores=float(v["host_cores"]), graph_model=bool(v.get("graph_model", 0)), **graph)
    cores = int(v["cores"])
    return DeviceModel(**common, active_power_w=v["power_per_core_w"] * cores, op_overhead_s=v["op_overhead_s"],
                       freq_hz=v["freq_hz"], cores=cores)


def get_platform(name: str, **overrides) -> Platform:
    """Load platform `name` (a bundled name, a platform YAML path, or a spec with [overrides], see
    resolve_platform); overrides like npu_dispatch_s=2e-4 or npu_throughput_flops="fused_block"."""
    if isinstance(name, str) and "[" in name:
        return resolve_platform(name, **overrides)
    source = str(name)
    if isinstance(name, Path) or (isinstance(name, str) and _is_path(name)):
        path = Path(name)
        if not path.is_file():
            raise NpuMoeError(f"platform file {str(path)!r} does not exist; pass a platform YAML (e.g. one written "
                              f"by fit-device) or one of {', '.join(list_platforms())}")
        raw = copy.deepcopy(_read_path(path))
    else:
        raw = copy.deepcopy(_read_yaml(name))
    name = raw["name"]
    params = {role: raw[role] for role in ROLES}
    if any("from_host_profile" in e for r in ROLES for e in params[r].values()):
        from npumoe_lab.devices.hostprofile import fill_host_params   # lazy: measures or reads this host only for the cpu platform
        fill_host_params(params)
    for knob, value in sorted(overrides.items()):
        _apply_override(params, knob, value)
    _fill_derived(params)
    header = {k: raw[k] for k in ("name", "kind", "npu_shares_cpu")}
    digest = sha256_json({**header, "params": params})
    return Platform(name=name, description=raw["description"].strip(), kind=raw["kind"],
                    npu=_device("npu", raw["kind"], params["npu"]), cpu=_device("cpu", raw["kind"], params["cpu"]),
                    npu_shares_cpu=raw["npu_shares_cpu"], params={**header, **params,
                                                                  "assumptions": raw.get("assumptions", [])},
                    hash=digest, chip=raw.get("chip", name), fit=tuple(raw.get("fit") or ()),
                    posterior=raw.get("posterior"), source=source, overrides=dict(overrides))


def as_platform(platform, **overrides) -> Platform | None:
    """The one place a platform given by name (a CLI flag, an API argument, a plan's JSON) becomes the `Platform`
    the rest of the workbench passes along; `overrides` apply to a name (get_platform). A Platform is returned as
    it is (anything else not a name too: tests hand in stand-ins), None stays None (no device: no limits, no cost
    model)."""
    if not isinstance(platform, str):
        return platform
    return get_platform(platform, **overrides)


def format_platforms() -> str:
    """Table of all platforms (for `npumoe-lab platforms`), then the source of each key parameter."""
    cols = ("name", "kind", "npu TF/s", "npu GB/s", "call ms", "graph GB", "npu W", "cpu cores", "cpu TF/s",
            "cpu GB/s", "cpu W", "cpu GHz")
    rows, sources = [], []
    for name in list_platforms():
        p = get_platform(name)
        n, c = p.npu, p.cpu
        rows.append((name, p.kind, f"{n.throughput_flops / 1e12:.2f}", f"{n.bandwidth_bytes_s / 1e9:.1f}",
                     f"{(n.dispatch_s + n.sync_s) * 1e3:.3f}", f"{n.graph_limit_bytes / 1e9:.2f}",
                     f"{n.active_power_w:.2f}", str(c.cores), f"{c.throughput_flops / 1e12:.2f}",
                     f"{c.bandwidth_bytes_s / 1e9:.1f}", f"{c.active_power_w:.1f}", f"{c.freq_hz / 1e9:.2f}"))
        sources.append(f"{name} ({p.kind}, hash {p.hash[:12]}): {p.description}")
        for role in ROLES:
            for key in ("throughput_flops", "throughput_curve", "bandwidth_bytes_s", "dispatch_s", "weight_bytes",
                        "power_per_core_w", "active_power_w"):
                e = p.params[role].get(key)
                if e is not None:
                    v = e["value"]
                    v = " ".join(f"{a:g}:{b:.3g}" for a, b in v) or "none" if isinstance(v, list) else f"{v:g}"
                    sources.append(f"  {role}.{key} = {v} {e['unit']} [{e['confidence']}]: {e['source']}")
    widths = [max(len(str(r[i])) for r in (cols, *rows)) for i in range(len(cols))]
    line = lambda r: "  ".join(str(x).ljust(w) for x, w in zip(r, widths)).rstrip()
    return "\n".join([line(cols), line(["-" * w for w in widths]), *map(line, rows), "", "Sources:", *sources])
