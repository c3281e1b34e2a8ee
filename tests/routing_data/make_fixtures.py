"""Writes the routing fixtures in each tool's documented output format (docs/ROUTING.md cites the code each format
is read from). Routing of the bundled tiny geometry (4 MoE layers, 32 experts, top-4) drawn from a skewed popularity
with a fixed seed, so the fixtures are small, deterministic and not uniform. Run: python tests/routing_data/make_fixtures.py"""
import base64
import csv
import json
import pickle
from collections import Counter
from pathlib import Path

import numpy as np

HERE = Path(__file__).parent / "fixtures"
L, E, K = 4, 32, 4
rng = np.random.default_rng(7)


def draw(T, n_experts=E, k=K):
    """[T, L, k] distinct expert ids per token, weights [T, L, k] descending (softmax of the drawn scores)."""
    p = (np.arange(n_experts) + 1.0) ** -1.1
    score = np.log(p)[None, None, :] - np.log(-np.log(rng.random((T, L, n_experts))))
    idx = np.argsort(-score, axis=2)[:, :, :k]
    s = np.take_along_axis(score, idx, 2)
    w = np.exp(s - s[:, :, :1])
    return idx, (w / w.sum(2, keepdims=True)).astype(np.float32)


def main():
    HERE.mkdir(exist_ok=True)
    idx, w = draw(48)
    # llama.cpp moe-trace: headerless, one `layer,expert` row per routed activation, ubatch by ubatch, layer by layer
    with open(HERE / "llama_moe_trace.csv", "w", newline="") as f:
        wr = csv.writer(f)
        for ub in (slice(0, 32), slice(32, 48)):
            for layer in range(L):
                for t in idx[ub, layer]:
                    wr.writerows([layer, int(e)] for e in t)
    # fork form: phase,token,layer,rank,expert (first 32 tokens prefill, the rest decode)
    with open(HERE / "llama_moe_trace_phase.csv", "w", newline="") as f:
        wr = csv.writer(f)
        wr.writerow(["phase", "token", "layer", "rank", "expert"])
        for t in range(48):
            for layer in range(L):
                wr.writerows(["prefill" if t < 32 else "decode", t, layer, r, int(idx[t, layer, r])] for r in range(K))
    # fork form: pos,layer,id0..id3 (negative pos = prefill)
    with open(HERE / "llama_moe_trace_pos.csv", "w", newline="") as f:
        wr = csv.writer(f)
        wr.writerow(["pos", "layer"] + [f"id{r}" for r in range(K)])
        for t in range(48):
            for layer in range(L):
                wr.writerow([-(t + 1) if t < 32 else t - 32, layer, *map(int, idx[t, layer])])
    # vLLM routed_experts: [seq_len, num_layers, top_k] int32 (.npy), and request outputs as JSON
    np.save(HERE / "vllm_routed_experts.npy", idx.astype(np.int32))
    i2, _ = draw(20)
    (HERE / "vllm_routed_experts.json").write_text(json.dumps([
        {"prompt_token_ids": list(range(30)), "routed_experts": idx[:40].tolist()},
        {"prompt_token_ids": list(range(12)), "routed_experts": i2.tolist()}]))
    # SGLang: meta_info.routed_experts = base64 of int32 [num_tokens, num_layers, top_k], flattened
    i3, _ = draw(36)
    (HERE / "sglang_response.json").write_text(json.dumps({"text": "...", "meta_info": {
        "prompt_tokens": 28, "completion_tokens": 8,
        "routed_experts": base64.b64encode(i3.astype("<i4").tobytes()).decode()}}))
    # SGLang EPLB recorder dump: logical_count [num_layers, num_logical_experts]
    import torch
    torch.save({"rank": 0, "logical_count": torch.tensor(np.stack([np.bincount(idx[:, layer].ravel(), minlength=E)
                                                                   for layer in range(L)]))}, HERE / "sglang_eplb.pt")
    # TensorRT-LLM: meta_info.json + rank{r}.safetensors keyed "{iter}_{layer}" (per-expert token counts)
    from safetensors.numpy import save_file
    t = HERE / "trtllm"
    t.mkdir(exist_ok=True)
    (t / "meta_info.json").write_text(json.dumps({"num_experts": E, "num_experts_per_token": K}))
    for rank, ub in ((0, slice(0, 24)), (1, slice(24, 48))):
        save_file({f"{it}_{layer}": np.bincount(idx[ub][it * 12:(it + 1) * 12, layer].ravel(), minlength=E)
                   .astype(np.int32) for it in range(2) for layer in range(L)}, str(t / f"rank{rank}.safetensors"))
    # HF output_router_logits: one [tokens, experts] tensor per MoE layer
    logits = rng.normal(size=(L, 40, E)).astype(np.float32) + np.linspace(2, 0, E, dtype=np.float32)
    save_file({f"router_logits.{layer}": logits[layer] for layer in range(L)}, str(HERE / "hf_router_logits.safetensors"))
    # OLMoE expert_counts: a pickled list of 3 Counters (layers 0, 7, 15) of NumPy int64 -> count (64 experts, top-8)
    io, _ = draw(100, 64, 8)
    with open(HERE / "olmoe_arxiv.pkl", "wb") as f:
        pickle.dump([Counter(np.int64(e) for e in io[:, j].ravel()) for j in range(3)], f)
    io2, _ = draw(100, 64, 8)
    with open(HERE / "olmoe_github.pkl", "wb") as f:
        pickle.dump([Counter(np.int64(e) for e in io2[:, j].ravel()) for j in range(3)], f)
    # mbolt co-activation profile: per-layer heat[E] = decode tokens whose top-k holds the expert
    (HERE / "mbolt_coactivation.json").write_text(json.dumps({
        "model": "npumoe-tiny", "quant": "F32", "n_layers": L, "n_expert_per_layer": E, "k": K,
        "n_decode_tokens": 48, "layers": [{"layer": layer, "heat": np.bincount(idx[:, layer].ravel(), minlength=E)
                                           .tolist(), "pairs": [], "clusters": []} for layer in range(L)]}))
    # speculative-moe JSONL: the prompt's tokens all at token_pos 0 (prefill), then one row per generated token
    with open(HERE / "speculative_moe.jsonl", "w") as f:
        for layer in range(L):
            for t in range(48):
                f.write(json.dumps({"dataset": "humaneval", "problem_id": 0, "layer": layer,
                                    "token_pos": 0 if t < 30 else t - 29, "experts": idx[t, layer].tolist(),
                                    "gating_probs": w[t, layer].tolist()}) + "\n")
    # vLLM-MoE-Logger JSONL: a meta line, 150 warm-up rows of one selection, then route rows of one layer
    with open(HERE / "vllm_moe_logger_layer2.jsonl", "w") as f:
        f.write(json.dumps({"type": "meta", "top_k": K, "layers_logged": [2]}) + "\n")
        for t in range(150):
            f.write(json.dumps({"type": "route", "req_id": "r1", "token_idx": t, "layer": 2,
                                "topk_ids": [3, 1, 4, 5], "topk_weights": [0.4, 0.3, 0.2, 0.1]}) + "\n")
        for t in range(48):
            f.write(json.dumps({"type": "route", "req_id": "r1", "token_idx": t, "layer": 2,
                                "topk_ids": idx[t, 2].tolist(), "topk_weights": w[t, 2].tolist()}) + "\n")
    # bad inputs
    lines = (HERE / "llama_moe_trace.csv").read_text().splitlines()
    (HERE / "bad_truncated.csv").write_text("\n".join(lines[:-1]) + "\n" + lines[-1].split(",")[0] + ",\n")
    (HERE / "bad_ids.csv").write_text("\n".join(lines[:-1] + ["3,32"]) + "\n")
    (HERE / "bad_missing_layer.csv").write_text(
        "phase,token,layer,rank,expert\n" + "".join(f"prefill,{t},{layer},{r},{int(idx[t, layer, r])}\n"
                                                    for t in range(8) for layer in range(3) for r in range(K)))
    (HERE / "bad_shape.json").write_text(json.dumps({"outputs": [{"text": "no routing here"}]}))
    (HERE / "bad_constant.csv").write_text("phase,token,layer,rank,expert\n" + "".join(
        f"decode,{t},{layer},{r},{r}\n" for t in range(8) for layer in range(L) for r in range(K)))

    class Evil:
        def __reduce__(self):
            import os
            return (os.system, ("echo pwned",))
    (HERE / "bad_evil.pkl").write_bytes(pickle.dumps([Evil()]))


if __name__ == "__main__":
    main()
