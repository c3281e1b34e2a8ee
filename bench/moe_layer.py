"""One MoE layer on this CPU, side by side in one run: HF eager / grouped_mm vs the workbench's static path.

Variants (all given the same hidden states and routing; the router itself is identical for all and excluded):
  hf-eager, hf-grouped_mm   transformers' experts module (`config._experts_implementation`)
  static-3tier              PlanExecutor.__call__ (what `attach(model, plan)` runs): saliency -> dispatch -> pack
                            -> every static slot of every group computed (the static graphs' shapes, padding
                            included; expert GEMMs on pre-packed oneDNN weights) -> scatter, on a 3-tier plan
                            (assign_tiers + make_groups) calibrated on other chunks of the same routing distribution
  static-3tier-cpu          the same plan and executor with pad_rows="skip": the CPU computes each expert's filled
                            rows only (same outputs; what untimed/modeled runs and CPU-resident groups do)
  static-dropless           the same path, 3 tiers sized to this chunk's own loads (nothing dropped)
  static-dropless-cpu       static-dropless with pad_rows="skip"
  dropless-dynamic          packing.dropless_experts (plain `attach(model)`): capacity = load, one bmm per expert
  bare-gemm                 the 3-tier plan's expert FFNs alone on pre-packed buffers, every slot (no dispatch/pack/
                            scatter)
  static-3tier-bf16         (fp32 runs only) static-3tier with the groups computed in bf16 (`npu_dtype`)
  static-groupcaps16        NOT a 3-tier plan: groups of 16 experts (by need), each with its own capacity (less
                            padding, same number of graphs); shows what the 3-tier quantization costs
Routing: per-expert load shares from the bundled tiny model's calibration (`data/models/npumoe-tiny`, one layer's
shares stretched to E experts) or, without it, a Zipf-like fallback; each token draws K distinct experts.
Roofline = max(useful FLOPs / measured dense GEMM peak, weights of the experts touched / measured read bandwidth),
useful FLOPs = 6*H*I per routed assignment. Timings are medians over interleaved repeats (variants rotate each
repeat so machine noise hits them alike). `--only calib|prefill` runs bench/prefill.py's parts; `--only experts`
the experts path timed inside the 2-layer prefill (static vs HF eager vs HF grouped_mm, bench/experts_path.py).

    .venv/bin/python bench/moe_layer.py          # acceptance set: qwen3 geometry, the CPU's fast dtype, chunks 512 2048,
                                                 # calib, prefill, policy (bench/policy.py)
    .venv/bin/python bench/moe_layer.py --geometry all --dtypes fp32,bf16 --chunks 256,512,1024,4096
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from npumoe_lab.core.host_memory import keep_freed_memory, malloc_policy  # noqa: E402
from npumoe_lab.execution.clock import NullClock  # noqa: E402  (after the path insert: bench runs from a checkout)
from npumoe_lab.planning.layout import ExecutionLayout  # noqa: E402
from npumoe_lab.execution.ops import ChunkContext, chunk_scope  # noqa: E402
from npumoe_lab.sim.routing import sample_routing, stretch  # noqa: E402  (the simulation's routing sampler)

GEOMETRIES = {  # expert geometry of the real models (E experts, top-K, hidden H, expert intermediate I)
    "qwen3-30b-a3b": dict(family="qwen3_moe", E=128, K=8, H=2048, I=768),
    "olmoe": dict(family="olmoe", E=64, K=8, H=2048, I=1024),
    "smoke": dict(family="qwen3_moe", E=16, K=4, H=128, I=64),   # tests/test_bench.py: every code path, in seconds
}
DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}
# fallback shares ~ (rank + 14)^-1: the hottest expert gets 3.9x the mean load, the skew of the trained tiny
# model (ENVIRONMENT.md section 7: max/mean 3.4-5.5 per layer, 3.8 in layer 0 of run A); Gini 0.36
ZIPF = (1.0, 14.0)


# -- timing -------------------------------------------------------------------------------------------------
def time_interleaved(fns: dict, repeats: int, warmup: int = 1) -> dict:
    """{name: [seconds]}: every repeat runs each variant once, the order rotating per repeat."""
    names = list(fns)
    for _ in range(warmup):
        for n in names:
            fns[n]()
    out = {n: [] for n in names}
    for r in range(repeats):
        for n in names[r % len(names):] + names[:r % len(names)]:
            t0 = time.perf_counter()
            fns[n]()
            out[n].append(time.perf_counter() - t0)
    return out


def med_iqr(ts):
    q = np.percentile(ts, [25, 50, 75])
    return float(q[1]), float(q[2] - q[0])


def measure_peaks(dtype, repeats: int = 5) -> tuple[float, float]:
    """(dense GEMM FLOP/s in dtype, memory read bytes/s), measured now on this machine. The GEMM peak is the best
    of mm/bmm with row-major or transposed B and oneDNN on pre-packed B (torch's CPU kernels differ between
    these forms)."""
    a, b = torch.randn(2048, 2048, dtype=dtype), torch.randn(2048, 3072, dtype=dtype)
    A, B = a.view(2, 1024, 2048), b.expand(2, 2048, 3072)
    bt, Bt = b.t().contiguous().t(), b.t().contiguous().t().expand(2, 2048, 3072)
    forms = {"mm": lambda: a @ b, "mm_tB": lambda: a @ bt, "bmm": lambda: torch.bmm(A, B),
             "bmm_tB": lambda: torch.bmm(A, Bt)}
    from npumoe_lab.core.cpu_ffn import onednn_packs
    if onednn_packs(dtype):      # the form the static path uses: weights pre-packed once for oneDNN
        wp = torch.ops.mkldnn._reorder_linear_weight(b.t().contiguous(), 2048)
        forms["onednn_packed"] = lambda: torch.ops.mkldnn._linear_pointwise(a, wp, None, "none", [], "")
    best = min(min(v) for v in time_interleaved(forms, repeats).values())
    big = torch.ones(64 * 2**20, dtype=torch.float32)           # 256 MB, far beyond the caches
    rs = time_interleaved({"read": lambda: big.sum()}, repeats)["read"]
    return 2 * 2048 * 2048 * 3072 / best, big.numel() * 4 / min(rs)


# -- routing ------------------------------------------------------------------------------------------------
def load_shares(E: int, layer: int = 1, chunk: int = 256, tokens: int = 4096) -> tuple[np.ndarray, str]:
    """Per-expert load shares [E] (hottest first) and where they came from."""
    from npumoe_lab.models.loading import TINY_MODEL_DIR
    if (TINY_MODEL_DIR / "config.json").is_file():
        try:
            from npumoe_lab.execution.calibrate import calibrate
            from npumoe_lab.models import load_model
            model, tok = load_model("tiny")
            prof = calibrate(model, tok, "mixed", chunk=chunk, tokens=tokens)
            layer = min(layer, max(prof.layers))
            s = np.asarray(prof.load_share(layer), dtype=float)
            return stretch(s, E), (f"calibrated: npumoe-tiny layer {layer} ({len(s)} experts, {tokens} tokens) "
                                   f"stretched to {E}")
        except Exception as exc:      # noqa: BLE001 - a broken tiny model must not stop the benchmark
            print(f"# tiny-model calibration failed ({exc}); using the Zipf fallback", file=sys.stderr)
    s, r0 = ZIPF
    p = (np.arange(E) + r0) ** -s
    return p / p.sum(), f"Zipf fallback: share ~ (rank + {r0:g})^-{s:g} (no data/models/npumoe-tiny)"


def sample_chunks(shares, T, K, n, seed, dtype):
    """n chunks of routing from one distribution (the same hot experts in every chunk: calibration and the
    timed chunk come from the same deployment)."""
    g = np.random.default_rng(seed)
    perm = g.permutation(len(shares))
    return [(idx, w.to(dtype)) for idx, w in (sample_routing(shares, T, K, g, perm) for _ in range(n))]


# -- plan ---------------------------------------------------------------------------------------------------
def counts_of(idx, E):
    return np.bincount(idx.reshape(-1).numpy(), minlength=E)


PERCENTILES = (20, 30, 40, 50, 60, 70, 75, 80, 85, 90, 95, 100)


def build_plan(per_chunk_counts, chunk, K, E, H, I, rule="optimal", percentile=None, group_size=16, layer=0,
               drop_budget=0.02):
    """(ExecutionLayout of one layer, tier assignment, percentile): 3 capacity tiers (assign_tiers) and groups of
    same-tier experts.
    percentile=None: the lowest of PERCENTILES whose tiers, fitted on half of the calibration chunks, drop at most
    drop_budget on the other half (held out, so the choice is not fooled by sampling noise); the final tiers are
    fitted on all chunks. Padding costs compute on every chunk, so the planner trades a little accuracy for it."""
    from npumoe_lab.planning.grouping import make_groups
    from npumoe_lab.planning.tiers import assign_tiers, expected_drop_rate
    counts = np.asarray(per_chunk_counts)
    fit, held = (counts[:, ::2], counts[:, 1::2]) if counts.shape[1] >= 4 else (counts, counts)
    pct = percentile
    if pct is None:
        pct = next((p for p in PERCENTILES if expected_drop_rate(
            assign_tiers(fit, chunk, K, E, tiers=3, percentile=p, rule=rule), held) <= drop_budget), 100)
    ta = assign_tiers(counts, chunk, K, E, tiers=3, percentile=pct, rule=rule)
    groups = make_groups(ta.tier, ta.capacity, counts.mean(1), group_size, hidden=H, intermediate=I)
    spec = SimpleNamespace(layer=layer, n_experts=E, top_k=K, hidden=H, intermediate=I)
    return ExecutionLayout.build([spec], {layer: [(g.experts, g.capacity, True) for g in groups]}), ta, pct


def build_plan_group_caps(per_chunk_counts, chunk, K, H, I, group=16, drop_budget=0.02, align=8):
    """Not a 3-tier plan (the comparison that shows what tiering costs): experts sorted by need, cut into groups
    of `group`, each group its own capacity = its largest need (aligned). On an NPU every group is its own graph
    anyway, so per-group capacities add no graphs; they only cut padding. Percentile chosen as in build_plan."""
    from npumoe_lab.planning.tiers import align_up, expected_drop_rate, percentile_need
    counts = np.asarray(per_chunk_counts)
    fit, held = (counts[:, ::2], counts[:, 1::2]) if counts.shape[1] >= 4 else (counts, counts)

    def caps(c, pct):
        need = percentile_need(c, pct)
        order = np.argsort(-need, kind="stable")
        cap = np.zeros(len(need), dtype=np.int64)
        for i in range(0, len(order), group):
            members = order[i:i + group]
            cap[members] = min(align_up(chunk, align), max(align, align_up(need[members].max(), align)))
        return cap, order
    pct = next((p for p in PERCENTILES if expected_drop_rate(caps(fit, p)[0], held) <= drop_budget), 100)
    cap, order = caps(counts, pct)
    groups = [(order[i:i + group], int(cap[order[i]]), True) for i in range(0, len(order), group)]
    spec = SimpleNamespace(layer=0, n_experts=len(cap), top_k=K, hidden=H, intermediate=I)
    return ExecutionLayout.build([spec], {0: groups})


def hf_experts(geom, dtype, seed=0):
    """transformers' experts module of the geometry's family, random weights (fan-in scaled)."""
    from transformers import AutoConfig
    fam, E, K, H, I = geom["family"], geom["E"], geom["K"], geom["H"], geom["I"]
    if fam == "olmoe":
        from transformers.models.olmoe.modeling_olmoe import OlmoeExperts as Cls
        cfg = AutoConfig.for_model(fam, num_experts=E, num_experts_per_tok=K, hidden_size=H, intermediate_size=I)
    else:
        from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeExperts as Cls
        cfg = AutoConfig.for_model(fam, num_experts=E, num_experts_per_tok=K, hidden_size=H,
                                   moe_intermediate_size=I)
    cfg._experts_implementation = "eager"
    torch.manual_seed(seed)
    m = Cls(cfg).to(dtype).eval().requires_grad_(False)
    with torch.no_grad():
        m.gate_up_proj.normal_(0, H ** -0.5)
        m.down_proj.normal_(0, I ** -0.5)
    return m


class TimingClock(NullClock):
    """Engine clock that times every op of PlanExecutor.execute (dispatch, pack, group*, scatter) by kind."""

    def __init__(self):
        self.times, self.stats = {}, None

    def run(self, op, fn, *args, deps=None):
        t0 = time.perf_counter()
        out = fn(*args)
        key = "groups" if op.kind == "expert_group" else op.name
        self.times.setdefault(key, []).append(time.perf_counter() - t0)
        return out, None

    def layer_stats(self, chunk, layer, stats):
        self.stats = stats


def timed_by(executor, clock, handle, T):
    """executor(handle, ...) with every op going to `clock` (a one-chunk context of T tokens)."""
    def call(hidden, idx, w):
        with chunk_scope(ChunkContext(index=0, past=0, n_real=T, length=T, clock=clock)):
            return executor(handle, hidden, idx, w)
    return call


# -- the layer benchmark ------------------------------------------------------------------------------------
def bench_layer(gname, dtype_name, chunks, args, shares, peaks) -> list[dict]:
    from npumoe_lab.execution.engine import PlanExecutor
    from npumoe_lab.execution.experts import LayerHandle
    from npumoe_lab.core.packing import Workspace, dropless_experts, group_ffn_into, pack, plan_dispatch
    geom, dtype = GEOMETRIES[gname], DTYPES[dtype_name]
    E, K, H, I = geom["E"], geom["K"], geom["H"], geom["I"]
    experts = hf_experts(geom, dtype)
    handle = LayerHandle(0, experts)
    peak, bw = peaks[dtype_name]
    rows = []
    for T in chunks:
        calib = sample_chunks(shares, T, K, args.calib_chunks + 1, args.seed + T, dtype)
        (idx, w), calib = calib[0], calib[1:]
        counts = np.stack([counts_of(i, E) for i, _ in calib], 1)
        plan, ta, pct = build_plan(counts, T, K, E, H, I, args.tier_rule, args.percentile, args.group_size,
                                   drop_budget=args.drop_budget)
        load = counts_of(idx, E)
        plan_dl = build_plan(load[:, None], T, K, E, H, I, args.tier_rule, 100.0, args.group_size)[0]
        hidden = torch.randn(T, H, generator=torch.Generator().manual_seed(args.seed), dtype=torch.float32).to(dtype)
        clock = TimingClock()
        kw = dict(cpu_kernel=args.cpu_kernel, pad_rows="compute")
        static = PlanExecutor(plan, [handle], **kw)
        skip = dict(kw, pad_rows="skip")             # siblings share static's packed weights (one copy in memory)
        static_cpu = static.sibling(**skip)
        static_dl, static_dl_cpu = static.sibling(plan_dl, **kw), static.sibling(plan_dl, **skip)
        static_bf16 = static.sibling(npu_dtype=torch.bfloat16, **kw) if dtype != torch.bfloat16 else None
        static_gc = static.sibling(build_plan_group_caps(counts, T, K, H, I, 16, args.drop_budget), **kw)
        run_static, run_cpu, run_gc = (timed_by(static, clock, handle, T),
                                       timed_by(static_cpu, cpu_clock := TimingClock(), handle, T),
                                       timed_by(static_gc, gc_clock := TimingClock(), handle, T))
        layout, _, gweights = static._compiled(handle)
        disp, _ = plan_dispatch(idx, w, layout)
        packed, work, out = pack(hidden, disp), Workspace(), torch.empty(layout.total_rows, H, dtype=dtype)
        pex = static.packed_experts(handle)
        spans = [(e, gs.start + j * gs.capacity, gs.capacity) for gs in layout.groups for j, e in enumerate(gs.experts)]

        def bare():
            if all(gw is None for gw in gweights):
                return pex.ffn_rows(packed, spans, out)
            for gs, gw in zip(layout.groups, gweights):
                G = len(gs.experts)
                group_ffn_into(packed[gs.start:gs.start + gs.rows].view(G, gs.capacity, H), gw,
                               out[gs.start:gs.start + gs.rows].view(G, gs.capacity, H), work)

        def hf(impl):
            def run():
                experts.config._experts_implementation = impl
                return experts(hidden, idx, w)
            return run
        fns = {"hf-eager": hf("eager"), "hf-grouped_mm": hf("grouped_mm"),
               "static-3tier": lambda: run_static(hidden, idx, w),
               "static-3tier-cpu": lambda: run_cpu(hidden, idx, w),
               "static-dropless": lambda: static_dl(handle, hidden, idx, w),
               "static-dropless-cpu": lambda: static_dl_cpu(handle, hidden, idx, w),
               "dropless-dynamic": lambda: dropless_experts(handle.weights, hidden, idx, w),
               "bare-gemm": bare, "static-groupcaps16": lambda: run_gc(hidden, idx, w)}
        if static_bf16 is not None:   # the "NPU" computes in bf16 (weights cast once per plan) on fp32 activations
            fns["static-3tier-bf16"] = lambda: static_bf16(handle, hidden, idx, w)
        if args.variants:
            fns = {k: v for k, v in fns.items() if k in args.variants.split(",") or k.startswith("hf-")}
        with torch.no_grad():
            ref = hf("eager")().float()
            err = {k: float((fns[k]().float() - ref).abs().max())
                   for k in ("static-dropless", "static-dropless-cpu", "dropless-dynamic") if k in fns}
            if "static-3tier-cpu" in fns:   # skipping padding must not change a bit (static-3tier selected or not)
                err["static-3tier-cpu vs static-3tier"] = float((fns["static-3tier-cpu"]().float()
                                                                 - static(handle, hidden, idx, w).float()).abs().max())
            clock.times.clear()
            cpu_clock.times.clear()
            ts = time_interleaved(fns, args.repeats)
            if clock.stats is None:       # static-3tier not selected: one untimed call for the plan's drop/pad stats
                run_static(hidden, idx, w)
                clock.times.clear()
        st = clock.stats
        flops = 6 * H * I * T * K
        wbytes = int((load > 0).sum()) * 3 * H * I * torch.finfo(dtype).bits // 8
        roof = max(flops / peak, wbytes / bw)
        t_static = statistics.median(ts["static-3tier"]) if "static-3tier" in ts else float("nan")
        share = {k: statistics.median(v) / t_static for k, v in clock.times.items()}
        t_cpu = statistics.median(ts["static-3tier-cpu"]) if "static-3tier-cpu" in ts else float("nan")
        share_cpu = {k: statistics.median(v) / t_cpu for k, v in cpu_clock.times.items()}
        meta = dict(geometry=gname, dtype=dtype_name, chunk=T, tiers=tuple(ta.tier_capacities),
                    percentile=pct,
                    n_groups=len(layout.groups), slots=layout.total_rows, routed=T * K,
                    drop_pct=100 * st.dropped / max(st.routed, 1), pad_pct=100 * st.padded / max(st.slots, 1),
                    pack_scatter_pct=100 * (share.get("pack", 0) + share.get("scatter", 0)),
                    dispatch_pct=100 * share.get("dispatch", 0),
                    pack_scatter_pct_cpu=100 * (share_cpu.get("pack", 0) + share_cpu.get("scatter", 0)),
                    roofline_ms=1e3 * roof,
                    roof_bound="compute" if flops / peak >= wbytes / bw else "memory",
                    peak_gflops=peak / 1e9, bw_gbs=bw / 1e9, err=err, experts_touched=int((load > 0).sum()),
                    gc=gc_clock.stats)
        t_e, t_g = statistics.median(ts["hf-eager"]), statistics.median(ts["hf-grouped_mm"])
        for name, v in ts.items():
            m, iqr = med_iqr(v)
            rows.append(dict(meta, variant=name, median_ms=1e3 * m, iqr_ms=1e3 * iqr, vs_eager=t_e / m,
                             vs_grouped=t_g / m, gflops=flops / m / 1e9, pct_peak=100 * flops / m / peak,
                             vs_roofline=m / roof))
        print_config(rows[-len(ts):], sys.stderr)
        del static, static_cpu, static_dl, static_dl_cpu, static_bf16, static_gc, gweights, packed, out, work, pex
    return rows


def print_config(rows, f=sys.stdout):
    r = rows[0]
    print(f"## {r['geometry']} {r['dtype']} chunk {r['chunk']}: tiers {r['tiers']} (p{r['percentile']:g}), "
          f"{r['n_groups']} groups, "
          f"{r['slots']} slots for {r['routed']} routed (pad {r['pad_pct']:.1f}%, drop {r['drop_pct']:.2f}%), "
          f"{r['experts_touched']} experts touched; pack+scatter {r['pack_scatter_pct']:.1f}% / dispatch "
          f"{r['dispatch_pct']:.1f}% of static-3tier; roofline {r['roofline_ms']:.1f} ms ({r['roof_bound']}-bound, "
          f"peak {r['peak_gflops']:.0f} GFLOP/s, {r['bw_gbs']:.1f} GB/s); max |diff| vs eager {r['err']}", file=f)


def markdown(rows) -> str:
    head = ("| geometry | dtype | chunk | variant | median ms | IQR ms | vs HF eager | vs HF grouped_mm | GFLOP/s | "
            "% peak | / roofline | drop % | pad % | pack+scatter % |\n|" + "---|" * 14)
    out = [head]
    for r in rows:
        gc = r["gc"]
        extra = (f"{r['drop_pct']:.2f} | {r['pad_pct']:.1f} | {r['pack_scatter_pct']:.1f}"
                 if r["variant"] == "static-3tier" else
                 f"{r['drop_pct']:.2f} | 0 (skipped) | {r['pack_scatter_pct_cpu']:.1f}"
                 if r["variant"] == "static-3tier-cpu" else
                 f"{100 * gc.dropped / max(gc.routed, 1):.2f} | {100 * gc.padded / max(gc.slots, 1):.1f} | "
                 if r["variant"] == "static-groupcaps16" and gc is not None else " | | ")
        out.append(f"| {r['geometry']} | {r['dtype']} | {r['chunk']} | {r['variant']} | {r['median_ms']:.1f} | "
                   f"{r['iqr_ms']:.1f} | {r['vs_eager']:.2f}x | {r['vs_grouped']:.2f}x | {r['gflops']:.0f} | "
                   f"{r['pct_peak']:.0f} | {r['vs_roofline']:.2f} | {extra} |")
    return "\n".join(out)


def layer_checks(rows, checks: list) -> None:
    """The per-layer targets from the table's rows: the plan on the CPU (padding skipped) >= 1.25x HF eager,
    and computing the padding costs at most slots / filled rows (= 1 / (1 - pad fraction)) times skipping it."""
    from policy import record
    by = {(r["geometry"], r["dtype"], r["chunk"], r["variant"]): r for r in rows}
    for (g, d, c, v), r in by.items():
        if v != "static-3tier-cpu" or (g, d, c, "static-3tier") not in by:
            continue
        comp = by[(g, d, c, "static-3tier")]
        record(checks, f"layer {g} {d} {c}: padding skipped vs HF eager", r["vs_eager"], ">=", 1.25)
        record(checks, f"layer {g} {d} {c}: padding computed / skipped", comp["median_ms"] / r["median_ms"], "<=",
               1 / (1 - comp["pad_pct"] / 100))


def provenance(threads) -> str:
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                                text=True).stdout.strip()
    except OSError:
        commit = "?"
    cpu = next((ln.split(":", 1)[1].strip() for ln in open("/proc/cpuinfo") if ln.startswith("model name")), "?")
    return (f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, commit {commit} (+ working tree), {cpu}, "
            f"torch {torch.__version__}, threads {threads}, malloc {malloc_policy()}")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--only", default="all", help="comma list of layer, calib, prefill, policy, experts, or 'all'")
    p.add_argument("--geometry", default="qwen3-30b-a3b", help=f"comma list of {list(GEOMETRIES)} or 'all'")
    p.add_argument("--chunks", default="512,2048", help="tokens per chunk (comma list)")
    p.add_argument("--dtypes", default="auto",
                   help="comma list of bf16, fp32, or auto: this CPU's fast dtype (bf16 with avx512_bf16/AMX, else fp32)")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--variants", default="", help="subset of layer variants (HF ones always run)")
    p.add_argument("--cpu-kernel", default="auto", help="expert GEMMs of the static path: auto | onednn | torch")
    p.add_argument("--tier-rule", default="optimal", help="assign_tiers rule (tiered|optimal|uniform|max_observed)")
    p.add_argument("--percentile", type=float, default=None, help="tier percentile (default: by --drop-budget)")
    p.add_argument("--drop-budget", type=float, default=0.04,
                   help="max held-out drop rate of the 3-tier plan (the target allows 5 %%; 4 %% leaves room for "
                        "sampling noise)")
    p.add_argument("--group-size", type=int, default=128,
                   help="experts per group (make_groups caps it to the tier and to 65536 // intermediate)")
    p.add_argument("--calib-chunks", type=int, default=16, help="chunks of sampled routing to calibrate tiers on")
    p.add_argument("--prompts", default="512,2048", help="prefill prompt lengths")
    p.add_argument("--prefill-layers", type=int, default=4)
    p.add_argument("--prefill-drop-budget", type=float, default=0.005, help="held-out drop budget of the prefill plan")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default="", help="also write the markdown report here")
    p.add_argument("--json", default="", help="also write the CPU-numerics targets as data here (bench/rounds.py)")
    return p.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    keep_freed_memory()              # as every engine prefill does: no page faults in the timed rows
    from npumoe_lab.core.cpu_features import dtype_name, fast_dtype
    args.dtypes = ",".join(dtype_name(fast_dtype()) if d == "auto" else d for d in args.dtypes.split(","))
    only = {"layer", "calib", "prefill", "policy", "experts"} if args.only == "all" else set(args.only.split(","))
    import policy
    checks = []          # the targets as data (--json)
    cpu = policy.cpu_line(DTYPES[args.dtypes.split(",")[0]])
    report = [f"# npumoe-lab CPU benchmark: {provenance(args.threads)}", "", cpu, ""]
    if "layer" in only:
        geoms = [g for g in GEOMETRIES if g != "smoke"] if args.geometry == "all" else args.geometry.split(",")
        dtypes = args.dtypes.split(",")
        chunks = [int(c) for c in args.chunks.split(",")]
        peaks = {d: measure_peaks(DTYPES[d]) for d in dtypes}
        rows = []
        for g in geoms:
            shares, source = load_shares(GEOMETRIES[g]["E"])
            report.append(f"Routing ({g}): {source}.")
            for d in dtypes:
                rows += bench_layer(g, d, chunks, args, shares, peaks)
        report += ["", markdown(rows), ""]
        report += [f"- dense GEMM peak {d}: {p / 1e9:.0f} GFLOP/s, memory read {b / 1e9:.1f} GB/s (measured)"
                   for d, (p, b) in peaks.items()]
        layer_checks(rows, checks)
        seen = set()
        for r in rows:
            if (r["geometry"], r["dtype"], r["chunk"]) not in seen:
                seen.add((r["geometry"], r["dtype"], r["chunk"]))
                print_config([r], _Lines(report))
    if only & {"calib", "prefill"}:
        import prefill
        if "calib" in only:
            report += ["", prefill.calibration_overhead(args.repeats)]
        if "prefill" in only:
            report += ["", prefill.prefill_tokens_per_s(args)]
    if "policy" in only:     # attach cost, 2-layer chunked prefill, fp16 emulation (policy.py)
        dtype = DTYPES[args.dtypes.split(",")[0]]
        model, tok, plans = policy.two_layer_setup(dtype)
        report += ["", policy.attach_cost(model, plans, checks=checks),
                   "", policy.chunked_prefill(model, tok, plans[0], [int(p) for p in args.prompts.split(",")],
                                              args.repeats, checks=checks)]
        del model
        report += ["", policy.fp16_groups(dtype, min(args.repeats, 3), checks=checks)]
    if "experts" in only:    # the experts path alone inside the same prefill (bench/experts_path.py)
        import experts_path
        dtype = DTYPES[args.dtypes.split(",")[0]]
        model, tok, plans = policy.two_layer_setup(dtype, smoke=args.geometry == "smoke")
        report += ["", experts_path.experts_in_prefill(model, tok, plans[0], [int(p) for p in args.prompts.split(",")],
                                                       args.repeats, measure_peaks(dtype), checks=checks)]
        del model
    text = "\n".join(report)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")
    if args.json:
        from npumoe_lab.core.cpu_features import row_fields
        Path(args.json).write_text(json.dumps(dict(provenance=provenance(args.threads), cpu=cpu,
                                                   **row_fields(DTYPES[args.dtypes.split(",")[0]]), checks=checks),
                                              indent=1) + "\n")


class _Lines:
    """A file-like that appends printed lines to a list (print_config -> the report)."""

    def __init__(self, lines):
        self.lines = lines

    def write(self, s):
        if s.strip():
            self.lines.append("- " + s.strip().removeprefix("## "))


if __name__ == "__main__":
    main()
