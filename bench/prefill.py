"""Model-level parts of bench/moe_layer.py (`--only calib,prefill`).

calibration_overhead: a forward of the tiny model under calibration's RoutingRecorder + per-chunk accumulation
  (what `npumoe_lab.calibration.calibrate` does per chunk) vs the same plain forward, chunk by chunk with the KV
  cache carried. The bundled `data/models/npumoe-tiny` when present, else the same architecture at random init.
prefill_tokens_per_s: a 4-layer model at Qwen3-30B-A3B geometry (random weights, bf16), one forward per prompt,
  HF eager / grouped_mm vs the workbench: `attach(model, plan)` with a 3-tier plan calibrated on other prompts,
  and the dropless path. Implementations are switched on one model (same weights) and timed interleaved.
"""
from __future__ import annotations

import statistics

import numpy as np
import torch

from moe_layer import build_plan, med_iqr, time_interleaved


def _tiny_model():
    from npumoe_lab.models.loading import TINY_MODEL_DIR
    if (TINY_MODEL_DIR / "config.json").is_file():
        from npumoe_lab.models import load_model
        return load_model("tiny")[0], "npumoe-tiny (trained)"
    from transformers import AutoModelForCausalLM

    from npumoe_lab.train.trainer import model_config
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(model_config(), attn_implementation="eager")
    return model.eval(), "tiny architecture at random init (no data/models/npumoe-tiny)"


@torch.no_grad()
def calibration_overhead(repeats: int, chunk: int = 512, n_chunks: int = 4) -> str:
    from npumoe_lab.calibration import _Accumulator
    from npumoe_lab.models import describe
    from npumoe_lab.routing import RoutingRecorder
    model, what = _tiny_model()
    vocab = model.config.vocab_size
    ids = torch.randint(3, vocab, (1, chunk * n_chunks), generator=torch.Generator().manual_seed(0))
    specs = describe(model)

    def run(record: bool):
        def go():
            acc, past = _Accumulator(specs, n_chunks), None
            rec = RoutingRecorder(model) if record else None
            if rec:
                rec.__enter__()
            try:
                for c in range(n_chunks):
                    out = model(input_ids=ids[:, c * chunk:(c + 1) * chunk], use_cache=True, past_key_values=past)
                    past = out.past_key_values
                    if rec:
                        for r in rec.records:
                            acc.add(r, c)
                        rec.records.clear()
            finally:
                if rec:
                    rec.__exit__(None, None, None)
        return go
    ts = time_interleaved({"plain": run(False), "calibrate": run(True)}, max(repeats, 5))
    (p, pi), (c, ci) = med_iqr(ts["plain"]), med_iqr(ts["calibrate"])
    return (f"Calibration overhead ({what}, {n_chunks} chunks of {chunk} tokens, KV cache carried; fp32): plain "
            f"forward {1e3 * p:.0f} ms (IQR {1e3 * pi:.0f}), recorder + accumulation {1e3 * c:.0f} ms "
            f"(IQR {1e3 * ci:.0f}): **{c / p:.3f}x** a plain forward (target <= 1.15x).")


def _big_model(layers: int, dtype):
    from transformers import AutoConfig, AutoModelForCausalLM
    cfg = AutoConfig.for_model("qwen3_moe", hidden_size=2048, num_hidden_layers=layers, num_experts=128,
                               num_experts_per_tok=8, moe_intermediate_size=768, intermediate_size=6144,
                               num_attention_heads=32, num_key_value_heads=4, head_dim=128, vocab_size=4096,
                               max_position_embeddings=4096, norm_topk_prob=True, tie_word_embeddings=True)
    torch.manual_seed(0)
    with torch.device("cpu"):
        model = AutoModelForCausalLM.from_config(cfg, attn_implementation="sdpa", dtype=dtype,
                                                 experts_implementation="eager")
    return model.eval().requires_grad_(False)


def _plan_for(model, prompt: int, n_calib: int, args):
    """3-tier plan per MoE layer from the routing of n_calib other random prompts of the same length. At random
    init each prompt has its own hot experts (a prompt-wide common component of the hidden states dominates the
    router logits), so per-expert loads vary a lot between prompts: a tighter held-out drop budget is used."""
    from npumoe_lab.models import describe
    from npumoe_lab.routing import capture_routing
    specs = {s.layer: s for s in describe(model)}
    counts = {layer: [] for layer in specs}
    g = torch.Generator().manual_seed(1234 + prompt)
    model.set_experts_implementation("grouped_mm")      # routing is the same whichever runs the experts
    for _ in range(n_calib):
        ids = torch.randint(3, model.config.vocab_size, (1, prompt), generator=g)
        for rec in capture_routing(model, ids):
            counts[rec.layer].append(np.bincount(rec.topk_idx.reshape(-1).numpy(), minlength=specs[rec.layer].n_experts))
    layers = []
    for layer, s in specs.items():
        c = np.stack(counts[layer], 1)
        plan, _ = build_plan(c, prompt, s.top_k, s.n_experts, s.hidden, s.intermediate, args.tier_rule,
                             args.percentile, args.group_size, layer=layer,
                             drop_budget=args.prefill_drop_budget)
        layers += plan["layers"]
    return {"saliency": "weight_x_norm", "renormalize": False, "layers": layers}


class _DropCounter:
    """Engine clock that runs ops untimed and sums the drop accounting of every layer call."""
    chunk, pad_mask, routed, dropped = 0, None, 0, 0

    def op(self, name, role, layer, cost, fn, *args, deps=()):
        return fn(*args), None

    def layer_stats(self, layer, st):
        self.routed += st.routed
        self.dropped += st.dropped


@torch.no_grad()
def prefill_tokens_per_s(args) -> str:
    import npumoe_lab as nl
    from npumoe_lab.experts import dropless_executor, set_executor
    model = _big_model(args.prefill_layers, torch.bfloat16)
    lines = [f"Whole-model prefill: {args.prefill_layers}-layer Qwen3-MoE at Qwen3-30B-A3B geometry (hidden 2048, "
             "128 experts top-8, moe_intermediate 768, 32/4 heads x 128; vocab 4096, HF init, sdpa attention), "
             "bf16, one forward per prompt, logits of the last token only; tokens/s (median over repeats):", "",
             "| prompt | HF eager | HF grouped_mm | static 3-tier plan | dropless (attach, no plan) | "
             "static / eager | static / grouped_mm | dropless / eager | static drop % | logits max abs diff static / dropless vs eager |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for prompt in [int(p) for p in args.prompts.split(",")]:
        plan = _plan_for(model, prompt, 12, args)
        ids = torch.randint(3, model.config.vocab_size, (1, prompt), generator=torch.Generator().manual_seed(7))
        nl.attach(model, plan)
        static_ex = model._npumoe.executor
        static_ex.clock = stats = _DropCounter()

        def run(impl, executor=None):
            def go():
                if executor is not None:
                    set_executor(model, executor)
                model.set_experts_implementation(impl)
                return model(ids, use_cache=False, logits_to_keep=1).logits.float()
            return go
        fns = {"eager": run("eager"), "grouped_mm": run("grouped_mm"), "static": run("npumoe", static_ex),
               "dropless": run("npumoe", dropless_executor)}
        ref = fns["eager"]()
        diffs = [float((fns[k]() - ref).abs().max()) for k in ("static", "dropless")]
        stats.routed = stats.dropped = 0
        ts = time_interleaved(fns, args.repeats)
        drop = 100 * stats.dropped / max(stats.routed, 1)
        nl.detach(model)
        del static_ex
        tps = {k: prompt / statistics.median(v) for k, v in ts.items()}
        lines.append(f"| {prompt} | {tps['eager']:.0f} | {tps['grouped_mm']:.0f} | {tps['static']:.0f} | "
                     f"{tps['dropless']:.0f} | {tps['static'] / tps['eager']:.2f}x | "
                     f"{tps['static'] / tps['grouped_mm']:.2f}x | {tps['dropless'] / tps['eager']:.2f}x | "
                     f"{drop:.2f} | {diffs[0]:.3g} / {diffs[1]:.3g} |")
        print("\n".join(lines[-1:]), flush=True)
    return "\n".join(lines)
