"""Expert GEMM forms on this CPU, side by side: why npumoe_lab/core/cpu_ffn.py pre-packs expert weights for oneDNN.

G experts' gate_up matrices (H=2048 -> 2I=1536, Qwen3-30B-A3B), M rows each; weights of all G experts
(G x 6 MB in bf16) exceed the caches, so every expert's weights stream from DRAM as in a real layer.
  bmm_tB        one torch.bmm over [G, M, H] x [G, H, 2I] with B stored transposed (HF's layout; engine's bmm path)
  bmm_rowB      the same with B row-major
  linear        F.linear per expert (HF eager's op)
  onednn_packed per expert on weights packed once by torch.ops.mkldnn._reorder_linear_weight (cpu_ffn.py)
Prints achieved GFLOP/s (median of --repeats). A second table times a whole expert FFN (gate_up, SwiGLU, down) for
a group of 16 experts by expert size: the engine's bmm path vs npumoe_lab.core.cpu_ffn.PackedExperts, which sets the size
where `cpu_kernel="auto"` starts packing (cpu_ffn.MIN_PACKED_ELEMS).
    .venv/bin/python bench/gemm_forms.py --threads 2
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


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
    ffn_by_size(max(a.repeats, 15), a.dtypes.split(","))


def ffn_by_size(repeats, dtypes):
    """Group of 16 experts, whole FFN: engine bmm path (plain weights) vs PackedExperts (oneDNN, per expert)."""
    from transformers import AutoConfig
    from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeExperts

    from npumoe_lab.core.cpu_ffn import MIN_PACKED_ELEMS, PackedExperts
    from npumoe_lab.execution.engine import _bmm_weights
    from npumoe_lab.models.weights import expert_weights
    from npumoe_lab.core.packing import Workspace, group_ffn_into
    G = 16
    print(f"\n| dtype | H x I | rows/expert | bmm per group ms | packed per expert ms | bmm / packed | auto packs? |"
          f"\n|{'---|' * 7}")
    for dn in dtypes:
        dt = {"bf16": torch.bfloat16, "fp32": torch.float32}[dn]
        for H, I in ((256, 128), (512, 256), (1024, 512), (2048, 768)):
            cfg = AutoConfig.for_model("qwen3_moe", num_experts=G, num_experts_per_tok=2, hidden_size=H,
                                       moe_intermediate_size=I)
            w = expert_weights(Qwen3MoeExperts(cfg).to(dt).eval().requires_grad_(False))
            bw, px, work = _bmm_weights(w), PackedExperts(w, "onednn"), Workspace()
            for M in (16, 64, 256):
                x = torch.randn(G * M, H).to(dt)
                out, spans = torch.empty_like(x), [(e, e * M, M) for e in range(G)]
                with torch.no_grad():
                    a = med(lambda: group_ffn_into(x.view(G, M, H), bw, out.view(G, M, H), work), repeats)
                    b = med(lambda: px.ffn_rows(x, spans, out), repeats)
                print(f"| {dn} | {H} x {I} | {M} | {1e3 * a:.2f} | {1e3 * b:.2f} | {a / b:.2f}x | "
                      f"{'yes' if H * I >= MIN_PACKED_ELEMS else 'no'} |", flush=True)


if __name__ == "__main__":
    main()
