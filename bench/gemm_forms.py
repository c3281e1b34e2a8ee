"""Expert GEMM forms on this CPU, side by side: why npumoe_lab/cpu_ffn.py pre-packs expert weights for oneDNN.

G experts' gate_up matrices (H=2048 -> 2I=1536, Qwen3-30B-A3B), M rows each; weights of all G experts
(G x 6 MB in bf16) exceed the caches, so every expert's weights stream from DRAM as in a real layer.
  bmm_tB        one torch.bmm over [G, M, H] x [G, H, 2I] with B stored transposed (HF's layout; engine's bmm path)
  bmm_rowB      the same with B row-major
  linear        F.linear per expert (HF eager's op)
  onednn_packed per expert on weights packed once by torch.ops.mkldnn._reorder_linear_weight (cpu_ffn.py)
Prints achieved GFLOP/s (median of --repeats).   .venv/bin/python bench/gemm_forms.py --threads 2
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch


def med(fn, repeats):
    fn()
    ts = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--experts", type=int, default=32)
    p.add_argument("--rows", default="32,64,128,256")
    p.add_argument("--dtypes", default="bf16,fp32")
    p.add_argument("--repeats", type=int, default=7)
    a = p.parse_args(argv)
    torch.set_num_threads(a.threads)
    G, H, N = a.experts, 2048, 1536
    print(f"| dtype | rows/expert | bmm_tB | bmm_rowB | linear | onednn_packed | packed / bmm_tB |\n|{'---|' * 7}")
    for dn in a.dtypes.split(","):
        dt = {"bf16": torch.bfloat16, "fp32": torch.float32}[dn]
        W = torch.randn(G, N, H, dtype=dt)             # HF layout [E, 2I, H]
        Wt, Wr = W.transpose(1, 2), W.transpose(1, 2).contiguous()
        P = [torch.ops.mkldnn._reorder_linear_weight(W[g], 128) for g in range(G)]
        for M in (int(m) for m in a.rows.split(",")):
            x = torch.randn(G, M, H, dtype=dt)
            fl = 2 * G * M * H * N
            r = {"bmm_tB": med(lambda: torch.bmm(x, Wt), a.repeats),
                 "bmm_rowB": med(lambda: torch.bmm(x, Wr), a.repeats),
                 "linear": med(lambda: [torch.nn.functional.linear(x[g], W[g]) for g in range(G)], a.repeats),
                 "onednn_packed": med(lambda: [torch.ops.mkldnn._linear_pointwise(x[g], P[g], None, "none", [], "")
                                               for g in range(G)], a.repeats)}
            gf = {k: fl / v / 1e9 for k, v in r.items()}
            print(f"| {dn} | {M} | " + " | ".join(f"{gf[k]:.0f}" for k in r)
                  + f" | {r['bmm_tB'] / r['onednn_packed']:.2f}x |", flush=True)


if __name__ == "__main__":
    main()
