"""Model-level parts of bench/moe_layer.py (`--only calib,prefill`).

calibration_overhead: a forward of the tiny model under calibration's RoutingRecorder + per-chunk accumulation
  (what `npumoe_lab.execution.calibrate.calibrate` does per chunk) vs the same plain forward, chunk by chunk with the KV
  cache carried. The bundled `data/models/npumoe-tiny` when present, else the same architecture at random init.
prefill_tokens_per_s: a 4-layer model at Qwen3-30B-A3B geometry (random weights, bf16), one forward per prompt,
  HF eager / grouped_mm vs the workbench: `attach(model, plan)` with a 3-tier plan calibrated on other prompts or
  fitted to the prompt itself, executed as static graphs (`pad_rows="compute"`: every slot) or by the CPU
  (`pad_rows="skip"`: filled rows only; the calibrated plan also with `spill=True`, overflow computed instead of
  dropped), and the dropless path. Implementations are switched on one model (same weights)
  and timed interleaved. At random init each prompt has its own hot experts (a prompt-wide common component of
  the hidden states dominates the router logits), the worst case for a calibrated static plan.
"""
from __future__ import annotations

import statistics
from dataclasses import replace

import numpy as np
import torch

from moe_layer import build_plan, med_iqr, time_interleaved
from npumoe_lab.execution.clock import NullClock  # noqa: E402  (moe_layer put the checkout on sys.path)
from npumoe_lab.execution.ops import ChunkContext, chunk_scope  # noqa: E402


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
    from npumoe_lab.execution.calibrate import _Accumulator, kv_cache_kwarg
    from npumoe_lab.models import describe
    from npumoe_lab.execution.routing import RoutingRecorder
    model, what = _tiny_model()
    vocab = model.config.vocab_size
    ids = torch.randint(3, vocab, (1, chunk * n_chunks), generator=torch.Generator().manual_seed(0))
    specs = describe(model)
    cache_arg = kv_cache_kwarg(model)

    def run(record: bool):
        def go():
            acc, past = _Accumulator(specs, n_chunks), None
            rec = RoutingRecorder(model) if record else None
            if rec:
                rec.__enter__()
            try:
                for c in range(n_chunks):
                    out = model(input_ids=ids[:, c * chunk:(c + 1) * chunk], use_cache=True, **{cache_arg: past})
                    past = getattr(out, cache_arg)
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


def _plan_for(model, prompts, args, percentile=None):
    """(a 3-tier plan per MoE layer from the routing of `prompts` ([1, T] ids, all of length T), static slots per
    routed assignment)."""
    from npumoe_lab.models import describe
    from npumoe_lab.execution.routing import capture_routing
    specs = {s.layer: s for s in describe(model)}
    counts = {layer: [] for layer in specs}
    model.set_experts_implementation("grouped_mm")      # routing is the same whichever runs the experts
    for ids in prompts:
        for rec in capture_routing(model, ids):
            counts[rec.layer].append(np.bincount(rec.topk_idx.reshape(-1).numpy(), minlength=specs[rec.layer].n_experts))
    layers, T = [], prompts[0].shape[1]
    for layer, s in specs.items():
        plan = build_plan(np.stack(counts[layer], 1), T, s.top_k, s.n_experts, s.hidden, s.intermediate,
                             args.tier_rule, percentile, args.group_size, layer=layer,
                          drop_budget=args.prefill_drop_budget)[0]
        layers += plan.layers
    slots = sum(g.capacity * len(g.experts) for lay in layers for g in lay.groups)
    k = next(iter(specs.values())).top_k
    return replace(plan, layers=tuple(layers), chunk=T), slots / (len(layers) * T * k)


class _DropCounter(NullClock):
    """Engine clock that runs ops untimed and sums the drop accounting of every layer call."""

    def __init__(self):
        self.routed = self.dropped = 0

    def layer_stats(self, chunk, layer, st):
        self.routed += st.routed
        self.dropped += st.dropped


class _Counted:
    """An executor whose ops (and drop counts) go to its own _DropCounter: one chunk of the whole prompt."""

    def __init__(self, executor):
        self.executor, self.clock = executor, _DropCounter()

    def __call__(self, handle, hidden, idx, w):
        T = hidden.shape[0]
        with chunk_scope(ChunkContext(index=0, past=0, n_real=T, length=T, clock=self.clock)):
            return self.executor(handle, hidden, idx, w)


def _skip_experts(module, hidden_states, top_k_index, top_k_weights):
    """An experts implementation that computes nothing: times the rest of the forward (attention, routers...)."""
    return torch.zeros_like(hidden_states)


@torch.no_grad()
def prefill_tokens_per_s(args) -> str:
    """Two interleaved blocks per prompt (one static executor alive at a time: each holds a copy of the expert
    weights): [eager, grouped_mm, dropless, static with a plan calibrated on 12 other prompts], then [eager, static
    with tiers fitted to this prompt's own routing]. Ratios are taken within a block."""
    from transformers.integrations.moe import ALL_EXPERTS_FUNCTIONS

    import npumoe_lab as nl
    from moe_layer import measure_peaks
    from npumoe_lab.execution.experts import dropless_executor, set_executor
    ALL_EXPERTS_FUNCTIONS.register("bench_skip_experts", _skip_experts)
    from moe_layer import DTYPES
    dtype = DTYPES[args.dtypes.split(",")[0]]          # the run's dtype (by default this CPU's fast dtype)
    model = _big_model(args.prefill_layers, dtype)
    peak = measure_peaks(dtype)[0]
    bounds = []
    lines = [f"Whole-model prefill: {args.prefill_layers}-layer Qwen3-MoE at Qwen3-30B-A3B geometry (hidden 2048, "
             "128 experts top-8, moe_intermediate 768, 32/4 heads x 128; vocab 4096, HF init, sdpa attention), "
             f"{args.dtypes.split(',')[0]}, one forward per prompt of random token ids, logits of the last token only; tokens/s = prompt / "
             "median forward time. `calibrated`: 3-tier plan from 12 other prompts; `fitted`: 3 tiers fitted to "
             "this prompt's own routing (an oracle plan: what calibration gives when the routing distribution is "
             "stable); `static graphs`: every static slot computed (pad_rows='compute'); `CPU`: filled rows only "
             "(pad_rows='skip'), with `spill` the overflow computed on the CPU instead of dropped; `dropless`: "
             "`attach(model)` without a plan; slots / routed: the plan's static slots per routed assignment.", "",
             "| prompt | block | variant | tokens/s | vs HF eager | vs HF grouped_mm | slots / routed | drop % | "
             "last-token logits max abs diff vs eager |", "|---|---|---|---|---|---|---|---|---|"]
    for prompt in [int(p) for p in args.prompts.split(",")]:
        g = torch.Generator().manual_seed(1234 + prompt)
        calib = [torch.randint(3, model.config.vocab_size, (1, prompt), generator=g) for _ in range(12)]
        ids = torch.randint(3, model.config.vocab_size, (1, prompt), generator=torch.Generator().manual_seed(7))

        def run(impl, executor=None):
            def go():
                if executor is not None:
                    set_executor(model, executor)
                model.set_experts_implementation(impl)
                return model(ids, use_cache=False, logits_to_keep=1).logits.float()
            return go
        for block, (plan, spr) in (("A", _plan_for(model, calib, args)), ("B", _plan_for(model, [ids], args, 100))):
            nl.attach(model, plan, pad_rows="compute")
            static_ex = _Counted(model._npumoe.executor)
            what = "calibrated" if block == "A" else "fitted"
            cpu_ex = _Counted(static_ex.executor.sibling(pad_rows="skip", spill=block == "A"))
            fns = {"HF eager": run("eager"), "HF grouped_mm": run("grouped_mm"),
                   f"static ({what}; static graphs)": run("npumoe", static_ex),
                   f"static ({what}; CPU{', spill' if block == 'A' else ''})": run("npumoe", cpu_ex),
                   "dropless": run("npumoe", dropless_executor),
                   "experts skipped (the rest of the forward)": run("bench_skip_experts")}
            if block == "B":
                fns = {k: v for k, v in fns.items() if k not in ("HF grouped_mm", "dropless") and "skipped" not in k}
            ref = fns["HF eager"]()
            diffs = {k: float((f() - ref).abs().max()) if "skipped" not in k else float("nan")
                     for k, f in fns.items()}
            for ex in (static_ex, cpu_ex):
                ex.clock.routed = ex.clock.dropped = 0
            ts = time_interleaved(fns, args.repeats)
            drops = [100 * ex.clock.dropped / max(ex.clock.routed, 1) for ex in (static_ex, cpu_ex)]
            nl.detach(model)
            tps = {k: prompt / statistics.median(v) for k, v in ts.items()}
            if block == "A":    # Amdahl: what any experts path can give when the rest of the forward stays HF's
                t_e, t_rest = prompt / tps["HF eager"], prompt / tps.pop("experts skipped (the rest of the forward)")
                cfg = model.config
                t_roof = (len(plan.layers) * prompt * cfg.num_experts_per_tok * 6 * cfg.hidden_size
                          * cfg.moe_intermediate_size / peak)
                bounds.append(f"- prompt {prompt}: the experts are {100 * (t_e - t_rest) / t_e:.0f} % of HF eager's "
                              f"forward ({1e3 * t_e:.0f} ms; the rest {1e3 * t_rest:.0f} ms). Bound on the speedup "
                              f"of any experts path: {t_e / (t_rest + t_roof):.2f}x with the experts at the measured "
                              f"dense GEMM peak ({peak / 1e9:.0f} GFLOP/s, {1e3 * t_roof:.0f} ms of useful FLOPs), "
                              f"{t_e / t_rest:.2f}x with the experts free.")
            for k, v in tps.items():
                gm = f"{v / tps['HF grouped_mm']:.2f}x" if "HF grouped_mm" in tps else ""
                extra = f"{spr:.2f} | {drops['CPU' in k]:.2f}" if k.startswith("static") else " | "
                lines.append(f"| {prompt} | {block} | {k} | {v:.0f} | {v / tps['HF eager']:.2f}x | {gm} | {extra} | "
                             f"{diffs[k]:.3g} |")
            print("\n".join(lines[-len(tps):]), flush=True)
            del static_ex, cpu_ex
    lines += [""] + bounds
    return "\n".join(lines)
