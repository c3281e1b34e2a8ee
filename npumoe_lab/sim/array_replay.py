"""An op stream (stream.py) scheduled and summarised on arrays: `timeline.schedule` + `summarize`, per draw.

The engine's dependency pattern makes the NPU / CPU schedule a closed form: each role is a serial queue and every
CHAIN op waits for the one before it, so the chain's ops run back to back; the BRANCH ops after a CHAIN op (one MoE
layer's static groups, cold and spilled experts) start when it ends and run in submission order on their queues;
their JOIN (scatter) starts when both queues are done. Hence
    TTFT = sum of CHAIN and JOIN durations + sum over branch blocks of max(NPU branch time, CPU branch time)
(one queue on a platform whose NPU role runs on the CPU: the block's sum). Energy, core-seconds and cycles are
`timeline.summarize`'s formulas on the summed busy times. Everything is linear in the op durations except the
per-block max, so a stream is reduced once to its distinct ops and count matrices, and D parameter draws cost a
(D, distinct ops) pricing and two sparse products.
"""
from __future__ import annotations

import numpy as np

from npumoe_lab.errors import NpuMoeError
from npumoe_lab.execution.ops import OP_KINDS
from npumoe_lab.execution.timeline import CYCLES_DEFINITION, MODELED, ROW_SCHEMA_VERSION, Event, schedule
from npumoe_lab.devices.price import npu_energy
from npumoe_lab.sim.pricing import INTERVAL, array_priced, parameter_draws, platform_params, price_stream
from npumoe_lab.sim.stream import BRANCH, CPU, JOIN, KIND, NPU, stream_from_ops

INTERVAL_METRICS = ("ttft_s", "energy_per_token_mj", "cpu_cycles")


class _Reduced:
    """A stream's distinct ops (columns) and how often each counts where (head, branch block x role, role)."""

    def __init__(self, stream, distinct: bool):
        c = stream.cols
        if len(c["dep"]) and c["dep"][0] == BRANCH:
            raise NpuMoeError("an op stream cannot start with a BRANCH op (it needs a CHAIN op to fork from)")
        priced = ("role", "flops", "bytes", "calls", "gemm_m", "gemm_n", "gemm_k")
        # the graph-level structure also reads attention FLOPs, rows per GEMM and palettized weights (pricing.py)
        priced += tuple(k for k in ("attn_flops", "rows", "lut_params") if k in c)
        if distinct:       # many draws: price each distinct op once (rows compared as raw bytes)
            key = np.stack([c[k] for k in priced], axis=1).astype(np.float64)
            raw = np.ascontiguousarray(key).view(np.dtype((np.void, key.itemsize * key.shape[1]))).reshape(-1)
            _, first, inv = np.unique(raw, return_index=True, return_inverse=True)
            inv = inv.reshape(-1)
            self.cols = {k: c[k][first] for k in priced}
        else:              # one draw: every op priced once anyway
            inv = np.arange(len(c["role"]))
            self.cols = {k: c[k] for k in priced}
        U = len(self.cols["role"])
        branch = c["dep"] == BRANCH
        block = np.cumsum(~branch) - 1
        self.head = np.bincount(inv[~branch], minlength=U).astype(np.float64)
        role = c["role"]
        self.per_role = np.stack([np.bincount(inv[role == r], minlength=U) for r in (NPU, CPU)], 1).astype(float)
        self.branch_total = np.bincount(inv[branch], minlength=U).astype(np.float64)
        bb, rr, ii = block[branch], role[branch], inv[branch]
        new = np.ones(len(bb), dtype=bool)          # block ids rise along the stream: number them by change
        new[1:] = bb[1:] != bb[:-1]
        bcol = np.cumsum(new) - 1
        self.n_blocks = int(new.sum())
        self.branch_key, self.branch_ops = bcol.reshape(-1) * 2 + rr, ii
        self._M, self._shape = None, (U, 2 * self.n_blocks)
        self.npu_calls = int(c["calls"][role == NPU].sum())
        self.n = len(c["role"])


    @property
    def M(self):
        """[distinct ops, blocks x 2] counts: how often each distinct op runs in each block's NPU / CPU branches."""
        if self._M is None:
            from scipy import sparse    # here, not at import: only the many-draw path needs it (~0.07 s)
            self._M = sparse.csr_matrix((np.ones(len(self.branch_ops)), (self.branch_ops, self.branch_key)),
                                        shape=self._shape)
        return self._M


def _reduced(stream, distinct: bool = True) -> _Reduced:
    r = stream._cache.get(("reduced", distinct))
    if r is None:
        r = stream._cache[("reduced", distinct)] = _Reduced(stream, distinct)
    return r


def stream_metrics(stream, params: dict, shared: bool) -> dict:
    """{metric: (D,) array} of one stream under D draws (`params` as from parameter_draws; scalars: D = 1):
    ttft_s, npu_busy_s, cpu_busy_s, cpu_core_s, cpu_cycles, energy_j, energy_per_token_mj."""
    D = max(np.size(v) for k, v in params.items() if not k.endswith("_throughput_curve"))
    r = _reduced(stream, distinct=D > 1)
    d = price_stream(params, r.cols)                                   # (D, U)
    D = d.shape[0]
    busy = d @ r.per_role                                              # (D, 2): npu, cpu
    if shared:
        ttft = d @ (r.head + r.branch_total)
    elif D == 1:          # one draw: the branch blocks' sums by bincount (no matrix needed)
        b = np.bincount(r.branch_key, weights=d[0, r.branch_ops], minlength=2 * r.n_blocks).reshape(-1, 2)
        ttft = d @ r.head + b.max(axis=1).sum()
    else:
        b = (r.M.T @ d.T).T.reshape(D, r.n_blocks, 2) if r.n_blocks else np.zeros((D, 0, 2))
        ttft = d @ r.head + b.max(axis=2).sum(axis=1)
    p = {k: np.asarray(v, dtype=np.float64).reshape(-1) for k, v in params.items()
         if not k.endswith("_throughput_curve")}
    npu_busy, cpu_busy = busy[:, 0], busy[:, 1]
    cores = p["cpu_cores"]
    if shared:
        core_s = cores * cpu_busy + p["npu_host_cores"] * npu_busy
    else:
        host_call = p["npu_host_cores"] * (p["npu_dispatch_s"] + p["npu_sync_s"])
        core_s = cores * cpu_busy + r.npu_calls * host_call
    host_busy = cpu_busy + (npu_busy if shared else 0.0)
    # the fit's power model per op (devices/price.npu_energy: floor + (active - floor) x utilisation), not
    # active power through all busy time
    npu_j = 0.0 if shared else npu_energy(params, r.cols["flops"], d) @ r.per_role[:, 0] \
        + p["npu_idle_power_w"] * np.maximum(ttft - npu_busy, 0)
    watts_per_core = (p["cpu_power_per_core_w"] * cores) / cores
    energy = npu_j + (watts_per_core * core_s + p["cpu_idle_power_w"] * np.maximum(ttft - host_busy, 0.0))
    out = dict(ttft_s=ttft, npu_busy_s=npu_busy, cpu_busy_s=cpu_busy, cpu_core_s=core_s,
               cpu_cycles=core_s * p["cpu_freq_hz"], energy_j=energy,
               energy_per_token_mj=energy / stream.n_tokens * 1e3)
    return {k: np.broadcast_to(np.asarray(v, dtype=np.float64), (D,)) for k, v in out.items()}


_POINT: dict = {}      # id(platform) -> (platform, its platform_params): a grid prices thousands of streams on few


def _point_params(platform) -> dict:
    """platform_params(platform), kept per platform object (platforms are frozen; the entry holds the object, so
    its id is not reused while kept); a copy, so no caller changes the kept one."""
    hit = _POINT.get(id(platform))
    if hit is None or hit[0] is not platform:
        if len(_POINT) >= 256:
            _POINT.clear()
        hit = _POINT[id(platform)] = (platform, platform_params(platform))
    return dict(hit[1])


def summarize_stream(stream, platform, draws: dict | None = None) -> dict:
    """The result-row summary `runtime.finish` gives for the same ops (timeline.summarize + drop / pad rates), and
    with `draws` (parameter_draws of this platform) the 90 % interval of ttft_s, energy_per_token_mj, cpu_cycles."""
    shared = platform.npu_shares_cpu
    m = {k: float(v[0]) for k, v in stream_metrics(stream, _point_params(platform), shared).items()}
    r = _reduced(stream, distinct=False)
    role = stream.cols["role"]
    on_npu, on_cpu = bool((role == NPU).any()), bool((role == CPU).any())
    work = on_cpu or (shared and on_npu) or (r.npu_calls * platform.npu.host_call_s > 0)
    out = {
        "ttft_s": m["ttft_s"], "cpu_busy_s": m["cpu_busy_s"], "npu_busy_s": m["npu_busy_s"],
        "cpu_core_s": m["cpu_core_s"], "cpu_cycles": m["cpu_cycles"], "cpu_threads": None,
        "n_npu_calls": r.npu_calls, "energy_j": m["energy_j"], "energy_per_token_mj": m["energy_per_token_mj"],
        "timing_source": MODELED if r.n else "none", "energy_source": MODELED if r.n else "none",
        "energy_note": (f"power parameters of platform {platform.name} ({platform.hash[:12]}) x busy/idle time; "
                        f"CPU: watts per core x core-seconds"),
        "cycles_source": MODELED if work else "none",
        "platform_profile": platform.name, "platform_hash": platform.hash,
        "timing_source_npu": MODELED if on_npu else "none",
        "timing_source_cpu": MODELED if on_cpu else "none",
        "schema_version": ROW_SCHEMA_VERSION, "cycles_definition": CYCLES_DEFINITION,
        "drop_rate": stream.drop_rate, "pad_rate": stream.pad_rate,
    }
    if draws is not None:
        out.update(interval_columns(stream_metrics(stream, draws, shared)))
    return out


def interval_columns(metrics: dict) -> dict:
    """`{metric}_lo` / `_hi`: the 5th and 95th percentiles over the draws (the 90 % interval)."""
    out = {}
    for k in INTERVAL_METRICS:
        lo, hi = np.percentile(metrics[k], INTERVAL)
        out[f"{k}_lo"], out[f"{k}_hi"] = float(lo), float(hi)
    return out


def ops_draw_metrics(ops, platform, n_tokens: int, draws: dict | None) -> dict | None:
    """stream_metrics of a recorded prefill's ops (a modeled run) under the draws; None without draws or ops in the
    engine's dependency pattern."""
    if not array_priced(platform):
        return None
    stream = stream_from_ops(ops, n_tokens) if draws is not None and ops else None
    return None if stream is None else stream_metrics(stream, draws, platform.npu_shares_cpu)


def mean_interval(per_sample: list) -> dict:
    """The 90 % interval of the samples' mean (per draw, averaged over the samples as the row's value is): `{m}_lo`
    / `_hi`, plus interval_draws; {} when any sample has no draws."""
    if not per_sample or any(m is None for m in per_sample):
        return {}
    mean = {k: np.mean([m[k] for m in per_sample], axis=0) for k in INTERVAL_METRICS}
    return {**interval_columns(mean), "interval_draws": len(mean[INTERVAL_METRICS[0]])}


def expert_ffn_and_scatter_s(stream, platform) -> tuple[float, float]:
    """Seconds of the expert FFN ops (groups, cold / spilled / HF experts) and of scatter (paper-check's
    breakdown), point parameters."""
    d = price_stream(platform_params(platform), stream)[0]
    k = stream.cols["kind"]
    ffn = np.isin(k, [KIND["expert_group"], KIND["experts_dynamic"], KIND["experts_hf"]])
    return float(d[ffn].sum()), float(d[k == KIND["scatter"]].sum())


def stream_events(stream, platform) -> list:
    """The stream as scheduled timeline Events (names and dependencies as the engine records them), for the
    per-op views (the explorer's timeline panel): priced on `platform`, placed by `timeline.schedule`."""
    c = stream.cols
    d = price_stream(platform_params(platform), stream)[0]
    names = {"expert_group": None, "experts_dynamic": None, "experts_hf": "experts"}
    events, fork, branches = [], None, []
    for i in range(len(c["kind"])):
        kind, dep = OP_KINDS[c["kind"][i]], int(c["dep"][i])
        name = names.get(kind, kind)
        if kind == "expert_group":
            name = f"group{int(c['group'][i])}"
        elif kind == "experts_dynamic":
            name = "spill" if c["spill"][i] else "cold"
        if dep == BRANCH:
            deps = (fork,)
            branches.append(i)
        elif dep == JOIN:
            deps, branches = tuple(branches) or (fork,), []
        else:
            deps = (i - 1,) if i else ()
        if dep != BRANCH:
            fork = i
        events.append(Event.trusted(name, int(c["chunk"][i]), int(c["layer"][i]), "npu" if c["role"][i] == NPU
                                    else "cpu", float(d[i]), float(c["flops"][i]), float(c["bytes"][i]), MODELED,
                                    deps, int(c["calls"][i])))
    return schedule(events, platform.npu_shares_cpu)


__all__ = ["stream_events", "ops_draw_metrics", "mean_interval", "stream_metrics", "summarize_stream", "interval_columns", "expert_ffn_and_scatter_s",
           "parameter_draws", "INTERVAL_METRICS"]
