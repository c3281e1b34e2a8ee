"""GPU check: the MoE layer benchmark on CUDA with every static group's grouped FFN captured as a CUDA graph.

Same layer, routing and 3-tier plan as bench/moe_layer.py (Qwen3-30B-A3B expert geometry, bf16). Per chunk:
  hf-grouped_mm / hf-eager   transformers' experts module on the GPU
  static-graphs              dispatch (packing.plan_dispatch) -> pack into a fixed buffer -> replay one
                             torch.cuda.CUDAGraph per group (bmm, SwiGLU, bmm on static [G, C, H] shapes, captured
                             once per plan) -> scatter; all on the GPU
  graphs-only                the captured graphs alone on the pre-packed buffer (the static compute floor)
Times are CUDA-event medians after warm-up. Prints a markdown table; exits 0 with a message where there is no GPU.
Budget: well under 8 minutes on one H100/H200 (weights ~1.2 GB, a few hundred timed calls).

    .venv/bin/python bench/gpu_check.py [--chunks 512,2048,4096] [--repeats 20]
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time

import numpy as np
import torch

from moe_layer import GEOMETRIES, build_plan, counts_of, hf_experts, load_shares, provenance, sample_chunks


def cuda_time(fn, repeats: int, warmup: int = 3) -> list[float]:
    """Seconds per call from CUDA events (each call bracketed, the stream synchronised after each)."""
    if not torch.cuda.is_available():      # --dry-run on the CPU: wall clock
        fn()
        return [_wall(fn) for _ in range(repeats)]
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    out = []
    for _ in range(repeats):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        out.append(a.elapsed_time(b) / 1e3)
    return out


def _wall(fn):
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


class GraphedGroups:
    """One CUDA graph per static group of a layout: reads its rows of `packed`, writes its rows of `out`. The
    buffers are allocated once (static addresses, as graph replay needs); capture follows PyTorch's recipe:
    warm-up on a side stream (cuBLAS handles/workspaces), then capture on it."""

    def __init__(self, layout, group_weights, H, dtype, device, capture=True):
        from npumoe_lab.core.packing import Workspace, group_ffn_into
        self.packed = torch.zeros(layout.total_rows, H, dtype=dtype, device=device)
        self.out = torch.zeros_like(self.packed)
        self.work = Workspace()
        self.graphs = []
        calls = []
        for gs, w in zip(layout.groups, group_weights):
            G = len(gs.experts)
            x = self.packed[gs.start:gs.start + gs.rows].view(G, gs.capacity, H)
            y = self.out[gs.start:gs.start + gs.rows].view(G, gs.capacity, H)
            calls.append(lambda x=x, w=w, y=y: group_ffn_into(x, w, y, self.work))
        if not capture:                       # --dry-run: the same calls, eagerly
            self.graphs = [type("Eager", (), {"replay": staticmethod(c)}) for c in calls]
            return
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(3):
                for c in calls:      # allocates the workspace buffers before capture (fixed addresses)
                    c()
        torch.cuda.current_stream().wait_stream(side)
        torch.cuda.synchronize()
        for c in calls:
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                c()
            self.graphs.append(g)
        torch.cuda.synchronize()

    def replay(self):
        for g in self.graphs:
            g.replay()


def run(args) -> str:
    from npumoe_lab.execution.engine import PlanExecutor
    from npumoe_lab.execution.experts import LayerHandle
    from npumoe_lab.core.packing import pack, plan_dispatch, scatter
    from npumoe_lab.core.saliency import saliency_scores
    dev, dtype = torch.device("cuda" if not args.dry_run else "cpu"), torch.bfloat16
    geom = GEOMETRIES[args.geometry]
    E, K, H, I = geom["E"], geom["K"], geom["H"], geom["I"]
    shares, source = load_shares(E)
    experts = hf_experts(geom, dtype).to(dev)
    handle = LayerHandle(0, experts)
    rows = ["| chunk | variant | median ms | IQR ms | vs HF grouped_mm | vs HF eager | drop % | pad % | "
            "max abs diff vs grouped_mm |", "|---|---|---|---|---|---|---|---|---|"]
    for T in [int(c) for c in args.chunks.split(",")]:
        t0 = time.time()
        chunks = sample_chunks(shares, T, K, args.calib_chunks + 1, args.seed + T, dtype)
        (idx, w), calib = chunks[0], chunks[1:]
        counts = np.stack([counts_of(i, E) for i, _ in calib], 1)
        plan, ta, _ = build_plan(counts, T, K, E, H, I, "optimal", None, args.group_size, drop_budget=0.02)
        layout, _, gweights = PlanExecutor(plan, [handle], cpu_kernel="torch")._compiled(handle)  # stacked
        idx, w = idx.to(dev), w.to(dev)
        hidden = torch.randn(T, H, generator=torch.Generator().manual_seed(args.seed)).to(dev, dtype)
        graphs = GraphedGroups(layout, gweights, H, dtype, dev, capture=not args.dry_run)
        gather = torch.empty(T * K, H, dtype=dtype, device=dev)
        norms = hidden.float().norm(dim=-1)

        def static():
            scores = saliency_scores("weight_x_norm", w, norms)
            d, _ = plan_dispatch(idx, w, layout, scores=scores)
            pack(hidden, d, out=graphs.packed)
            graphs.replay()
            return scatter(graphs.out, d, work=gather), d

        def hf(impl):
            def go():
                experts.config._experts_implementation = impl
                return experts(hidden, idx, w)
            return go
        with torch.no_grad():
            ref = hf("grouped_mm")().float()
            y, d = static()
            kept = (d.slot >= 0).view(T, K)
            w_kept = torch.where(kept, w, torch.zeros_like(w))
            ref_kept = experts(hidden, idx, w_kept).float()    # HF on the same kept assignments
            err = float((y.float() - ref_kept).abs().max())
            drop = 100 * (1 - float(kept.float().mean()))
            pad = 100 * d.n_padded / layout.total_rows
            fns = {"hf-grouped_mm": hf("grouped_mm"), "hf-eager": hf("eager"), "static-graphs": static,
                   "graphs-only": graphs.replay}
            ts = {k: cuda_time(f, args.repeats) for k, f in fns.items()}
        med = {k: statistics.median(v) for k, v in ts.items()}
        for k, v in ts.items():
            q = np.percentile(v, [25, 75])
            rows.append(f"| {T} | {k} | {1e3 * med[k]:.3f} | {1e3 * (q[1] - q[0]):.3f} | "
                        f"{med['hf-grouped_mm'] / med[k]:.2f}x | {med['hf-eager'] / med[k]:.2f}x | "
                        + (f"{drop:.2f} | {pad:.1f} | {err:.3g} |" if k == "static-graphs" else " | | |"))
        print(f"# chunk {T}: tiers {ta.tier_capacities}, {len(layout.groups)} graphs, {time.time() - t0:.0f} s; "
              f"HF on the same kept assignments vs static: max abs diff {err:.3g} (ref all: "
              f"{float((y.float() - ref).abs().max()):.3g})", file=sys.stderr, flush=True)
        del graphs, gweights
        if not args.dry_run:
            torch.cuda.empty_cache()
    name = "CPU dry run (no CUDA graphs)" if args.dry_run else torch.cuda.get_device_name()
    return "\n".join([f"# GPU check: {name}, {provenance(torch.get_num_threads())}", f"Routing: {source}.", "",
                      *rows])


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--geometry", default="qwen3-30b-a3b", choices=list(GEOMETRIES))
    p.add_argument("--chunks", default="512,2048,4096")
    p.add_argument("--repeats", type=int, default=20)
    p.add_argument("--group-size", type=int, default=128)
    p.add_argument("--calib-chunks", type=int, default=16)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--dry-run", action="store_true", help="run the same flow on the CPU, graphs as eager calls "
                   "(checks the code paths where there is no GPU)")
    args = p.parse_args(argv)
    if not torch.cuda.is_available() and not args.dry_run:
        print("gpu_check: no CUDA GPU on this machine (torch.cuda.is_available() is False); skipping.")
        return 0
    print(run(args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
