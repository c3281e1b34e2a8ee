"""The parts of `make bench` (`--only policy`, part of the defaults): the checks that must hold on any CPU.

cpu_line: this CPU's model, the flags that decide dtypes, and the dtype the bench runs in (cpu_features.py).
attach_cost: a 2-layer model at Qwen3-30B-A3B geometry, a 3-tier plan calibrated on the bundled text; wall time of
  the first `attach(model, plan)` (group weights built, every expert packed for oneDNN) vs a second attach with
  another plan and options (weight_cache.py reuses what the first prepared).
chunked_prefill: the same model through the public API, `prefill(model, ids, chunk=512, platform="cpu")` on held-out
  bundled text, HF eager vs the static plan executed by the CPU (pad_rows="skip") and as static graphs (padding
  computed, the measured default), interleaved.
fp16_groups: NPU-precision groups (what a modeled run computes for resident groups): fp32 GEMMs on fp16-rounded
  values (numerics.py, used where the CPU has no native fp16 GEMM) vs torch's native fp16 GEMMs, one static group
  at Qwen3-30B-A3B geometry and a modeled prefill of the bundled tiny model; numerics against a float64 reference.
"""
from __future__ import annotations

import os
import statistics
import time
from contextlib import contextmanager

import numpy as np
import torch

from moe_layer import GEOMETRIES, hf_experts, med_iqr, time_interleaved
from npumoe_lab.core import cpu_features  # noqa: E402  (moe_layer put the checkout on sys.path)

NO_FP16 = "avx2,fma"            # flags under which numerics.py emulates fp16 (no native fp16 GEMM)
WITH_FP16 = "avx2,fma,avx512_fp16"   # flags under which torch's native fp16 GEMMs run


def cpu_line(dtype: torch.dtype) -> str:
    flags = cpu_features.row_fields(dtype)
    return (f"CPU: {cpu_features.cpu_model()}; flags {flags['cpu_flags'] or '(none of interest)'}; native bf16 "
            f"{cpu_features.native_bf16()}, native fp16 {cpu_features.native_fp16()}; dtype by the rule: "
            f"{cpu_features.dtype_name(cpu_features.fast_dtype())}, this run: {flags['dtype']}")


@contextmanager
def cpu_flags(flags: str):
    old = os.environ.get(cpu_features.ENV_FLAGS)
    os.environ[cpu_features.ENV_FLAGS] = flags
    try:
        yield
    finally:
        if old is None:
            os.environ.pop(cpu_features.ENV_FLAGS, None)
        else:
            os.environ[cpu_features.ENV_FLAGS] = old


def record(checks: list | None, name: str, value: float, op: str, threshold: float, info: bool = False) -> None:
    """One CPU-numerics target as data (`moe_layer.py --json`, bench/rounds.py): `value op threshold` must hold;
    `info`: not a target itself, read beside one (e.g. the same ratio at equal work)."""
    if checks is not None:
        checks.append(dict(check=name, value=float(value), op=op, threshold=float(threshold), info=info,
                           holds=bool(value >= threshold if op == ">=" else value <= threshold)))


# -- a 2-layer model at Qwen3-30B-A3B geometry with plans calibrated on the bundled text ---------------------
def two_layer_setup(dtype, chunk: int = 512, tokens: int = 4096, smoke: bool = False):
    """(model, tokenizer, [3-tier plan, 2-tier plan]); `smoke`: a small model of the same family (tests)."""
    from transformers import AutoTokenizer

    import npumoe_lab as nl
    from npumoe_lab.models.loading import TINY_MODEL_DIR
    from prefill import _big_model
    model = _big_model(2, dtype) if not smoke else _small_model(dtype)
    tok = AutoTokenizer.from_pretrained(TINY_MODEL_DIR)          # vocab 4096, as the model's
    profile = nl.calibrate(model, tok, workload="mixed", chunk=chunk, tokens=tokens)
    plans = [nl.build_plan(profile, model, tiers=t, platform="cpu", residency="all") for t in (3, 2)]
    return model, tok, plans


def _small_model(dtype):
    from transformers import AutoConfig, AutoModelForCausalLM
    cfg = AutoConfig.for_model("qwen3_moe", hidden_size=128, num_hidden_layers=2, num_experts=16, num_experts_per_tok=4,
                               moe_intermediate_size=64, intermediate_size=256, num_attention_heads=4,
                               num_key_value_heads=2, head_dim=32, vocab_size=4096, max_position_embeddings=4096,
                               norm_topk_prob=True, tie_word_embeddings=True)
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(cfg, attn_implementation="sdpa", dtype=dtype,
                                            experts_implementation="eager").eval().requires_grad_(False)


def attach_cost(model, plans, repeats: int = 3, checks: list | None = None) -> str:
    import npumoe_lab as nl
    from npumoe_lab.core.weight_cache import forget
    from npumoe_lab.models import find_moe_blocks
    firsts, seconds = [], []
    for _ in range(repeats):
        for ref in find_moe_blocks(model):
            forget(ref.experts)                      # a model that was never attached
        nl.detach(model)
        t0 = time.perf_counter()
        nl.attach(model, plans[0])
        firsts.append(time.perf_counter() - t0)
        nl.detach(model)
        t0 = time.perf_counter()
        nl.attach(model, plans[1], pad_rows="skip", spill=True)   # another plan, other options
        seconds.append(time.perf_counter() - t0)
        nl.detach(model)
    f, s = statistics.median(firsts), statistics.median(seconds)
    record(checks, "second attach, % of the first", 100 * s / f, "<=", 5)
    return (f"Attach (2-layer Qwen3-30B-A3B geometry, {repeats} times each, medians): first attach {1e3 * f:.0f} ms "
            f"(group weights, every expert packed), second attach with another plan and options {1e3 * s:.1f} ms: "
            f"**{100 * s / f:.2f} %** of the first (target < 5 %).")


def chunked_prefill(model, tok, plan, prompts, repeats: int, chunk: int = 512, checks: list | None = None) -> str:
    import npumoe_lab as nl
    from npumoe_lab.workloads import get_workload
    lines = ["| prompt | variant | median s | IQR s | vs HF eager | attention s | experts s | pad % of slots | drop % | "
             "computed / skipped | slots / filled rows |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for prompt in prompts:
        ids = torch.tensor([get_workload("lm-heldout").samples(tok, prompt, 1, seed=3)[0].input_ids])
        # an oracle: tiers fitted to this prompt's own routing (what calibration gives when routing does not move)
        fitted = nl.build_plan(nl.calibrate(model, tok, chunk=chunk, tokens=prompt, text=tok.decode(ids[0])), model,
                               tiers=3, platform="cpu", residency="all")
        setups = {"HF eager": lambda: (nl.detach(model), model.set_experts_implementation("eager")),
                  "static, padding skipped (CPU)": lambda: nl.attach(model, plan, pad_rows="skip"),
                  "static, padding skipped, overflow spilled (CPU, dropless)":
                      lambda: nl.attach(model, plan, pad_rows="skip", spill=True),
                  "static, padding computed (static graphs)": lambda: nl.attach(model, plan),
                  "static fitted to this prompt (oracle), padding skipped (CPU)":
                      lambda: nl.attach(model, fitted, pad_rows="skip"),
                  "dropless, no plan (`attach(model)`)": lambda: nl.attach(model)}
        ts, summ, parts = {k: [] for k in setups}, {}, {k: [] for k in setups}
        for r in range(repeats + 1):                  # repeat 0: warm-up
            names = list(setups)
            for name in names[r % len(names):] + names[:r % len(names)]:
                setups[name]()
                t0 = time.perf_counter()
                res = nl.prefill(model, ids, chunk=chunk, platform="cpu", attention="cpu")
                if r:
                    ts[name].append(time.perf_counter() - t0)
                    parts[name].append(op_split(res.events))
                summ[name] = res.summary
        nl.detach(model)
        t_e = statistics.median(ts["HF eager"])
        t_skip = statistics.median(ts["static, padding skipped (CPU)"])
        pad = summ["static, padding computed (static graphs)"]["pad_rate"]
        t_comp = statistics.median(ts["static, padding computed (static graphs)"])
        record(checks, f"2-layer prefill {prompt}: padding skipped vs HF eager", t_e / t_skip, ">=", 1.25)
        record(checks, f"2-layer prefill {prompt}: padding computed / skipped", t_comp / t_skip, "<=", 1 / (1 - pad))
        for what, name in (("oracle plan", "static fitted to this prompt (oracle), padding skipped (CPU)"),
                           ("overflow spilled", "static, padding skipped, overflow spilled (CPU, dropless)")):
            record(checks, f"2-layer prefill {prompt}: {what} vs HF eager (equal work)",
                   t_e / statistics.median(ts[name]), ">=", 1.25, info=True)
        split = {k: tuple(statistics.median(p[i] for p in v) for i in range(2)) for k, v in parts.items()}
        exp_e, exp_s = split["HF eager"][1], split["static, padding skipped (CPU)"][1]
        # what HF's attention leaves to the experts: the ratio if the static row's experts took no time at all
        record(checks, f"2-layer prefill {prompt}: experts alone, padding skipped vs HF eager", exp_e / exp_s, ">=",
               1.25, info=True)
        record(checks, f"2-layer prefill {prompt}: bound with free experts (HF eager / its non-expert time)",
               t_e / (t_e - exp_e), ">=", 1.25, info=True)
        for name, v in ts.items():
            m, iqr = med_iqr(v)
            s = summ[name]
            # computing every slot does slots / filled rows times the skipped GEMM work: "1 + padding fraction"
            # with the padding counted against the filled rows
            extra = (f"{100 * s['pad_rate']:.1f} | {100 * s['drop_rate']:.2f} | "
                     + (f"{m / t_skip:.2f} | {1 / (1 - pad):.2f}" if "computed" in name else " | ")) \
                if name != "HF eager" else " | | | "
            att, exp = split[name]
            ops = f"{att:.3f} | {exp:.3f}" if exp > 0 else f"{att:.3f} | (not timed apart)"
            lines.append(f"| {prompt} | {name} | {m:.3f} | {iqr:.3f} | {t_e / m:.2f}x | {ops} | {extra} |")
        print("\n".join(lines[-len(setups):]), flush=True)
    return ("Chunked prefill through the public API (`attach(model, plan)`, `prefill(model, ids, chunk=512, "
            "platform='cpu')`), 2-layer Qwen3-30B-A3B geometry, 3-tier plan calibrated on the bundled text (the "
            "oracle row: fitted to the prompt itself), held-out bundled text, "
            f"{repeats} interleaved repeats (measured; attention and experts: medians of the timeline's own ops, "
            "HF's attention in every row):\n\n" + "\n".join(lines))


EXPERT_OPS = ("experts", "dispatch", "pack", "cold", "spill", "scatter")   # + "group<i>" (engine.py's op names)


def op_split(events) -> tuple[float, float]:
    """(attention, experts) seconds of one measured prefill's timeline: the attention ops, and every op of the
    experts path (HF's experts op; the engine's dispatch, pack, groups, cold/spilled experts and scatter). Routers,
    norms and the rest are neither. The dropless path runs inside HF's forward untimed: its experts read 0."""
    att = sum(e.duration_s for e in events if e.name == "attention")
    exp = sum(e.duration_s for e in events if e.name in EXPERT_OPS or e.name.startswith("group"))
    return att, exp


# -- NPU-precision groups: emulated vs native fp16 ------------------------------------------------------------
def _reference_group(experts, G: int, x: torch.Tensor) -> np.ndarray:
    """float64 of fp16-rounded operands, rounded to fp16 where an fp16 device rounds (tests/test_numerics.py)."""
    def r16(a):
        return a.astype(np.float16).astype(np.float64)
    gu = r16(experts.gate_up_proj[:G].detach().double().numpy().transpose(0, 2, 1))
    dn = r16(experts.down_proj[:G].detach().double().numpy().transpose(0, 2, 1))
    h = r16(np.einsum("gch,ghn->gcn", r16(x.double().numpy()), gu))
    i = h.shape[-1] // 2
    a = r16(r16(h[..., :i] / (1 + np.exp(-h[..., :i]))) * h[..., i:])
    return r16(np.einsum("gci,gih->gch", a, dn))


@torch.no_grad()
def fp16_groups(dtype, repeats: int = 3, G: int = 8, C: int = 64, geometry: str = "qwen3-30b-a3b",
                tiny: bool = True, checks: list | None = None) -> str:
    from npumoe_lab.execution.engine import _run_group
    from npumoe_lab.models.weights import expert_weights
    from npumoe_lab.core.numerics import EmulatedFp16Weights, npu_layer_weights, select
    experts = hf_experts(GEOMETRIES[geometry], dtype)
    w = expert_weights(experts)
    with cpu_flags(NO_FP16):
        emu = select(npu_layer_weights(experts, w, torch.float16), range(G))
    with cpu_flags(WITH_FP16):
        nat = select(npu_layer_weights(experts, w, torch.float16), range(G))
    assert isinstance(emu, EmulatedFp16Weights) and nat.gate_up.dtype == torch.float16
    x = torch.randn(G, C, w.hidden, generator=torch.Generator().manual_seed(0)).to(dtype)
    ts = time_interleaved({"emulated": lambda: _run_group(x, emu), "native": lambda: _run_group(x, nat)},
                          repeats, warmup=0)
    ref = _reference_group(experts, G, x.float())
    scale = float(np.abs(ref).max())
    # fp32 activations for the check: the fp16 outputs come back unrounded (bf16 would add its own rounding)
    err = {k: float(np.abs(_run_group(x.float(), v).double().numpy() - ref).max()) / scale
           for k, v in (("emulated", emu), ("native", nat))}
    te, tn = statistics.median(ts["emulated"]), statistics.median(ts["native"])
    flops = 6 * G * C * w.hidden * w.intermediate
    group_line = (f"One static group in fp16 (G={G} experts x C={C} rows, {geometry} experts, {dtype_str(dtype)} "
                  f"activations, measured, median of {repeats}): native fp16 GEMMs {1e3 * tn:.0f} ms "
                  f"({flops / tn / 1e9:.1f} GFLOP/s), emulated (fp32 GEMMs on fp16 values) {1e3 * te:.1f} ms "
                  f"({flops / te / 1e9:.0f} GFLOP/s): **{tn / te:.1f}x** (target >= 10x on a CPU without native fp16). "
                  f"Max |error| / max |reference| vs float64 on fp16 operands: emulated {err['emulated']:.2e}, native "
                  f"{err['native']:.2e} (tolerance 2^-10 = {2 ** -10:.2e}).")
    record(checks, "fp16 groups: emulated max error over max abs reference", err["emulated"], "<=", 2 ** -10)
    record(checks, "fp16: one large group, emulated vs native", tn / te, ">=", 10, info=True)
    return group_line + ("\n\n" + _modeled_tiny(repeats, checks) if tiny else "")


def dtype_str(dtype):
    return cpu_features.dtype_name(dtype)


@torch.no_grad()
def _modeled_tiny(repeats: int, checks: list | None = None) -> str:
    """A modeled run (m2-max) of the bundled tiny model with the npumoe plan: its fp16 groups emulated vs native."""
    import npumoe_lab as nl
    from npumoe_lab.execution.engine import PlanExecutor
    from npumoe_lab.execution.experts import set_executor
    from npumoe_lab.models.loading import TINY_MODEL_DIR
    from npumoe_lab.planning.plan import variant_plan
    if not (TINY_MODEL_DIR / "model.safetensors").is_file():
        return "Modeled tiny-model prefill: skipped (no data/models/npumoe-tiny)."
    model, tok = nl.load_model("tiny")
    profile = nl.calibrate(model, tok, workload="mixed", chunk=128, tokens=4096)
    plan = variant_plan(profile, "npumoe-tg", model, platform="m2-max")
    nl.attach(model, plan)
    handles = model._npumoe.executor.handles
    ex = {}
    for name, flags in (("emulated", NO_FP16), ("native", WITH_FP16)):
        with cpu_flags(flags):
            ex[name] = PlanExecutor(plan, handles, npu_dtype=torch.float16).prepare()
    ids = torch.tensor([tok("In the beginning God created the heaven and the earth. " * 40).input_ids[:512]])
    out = {}

    def run(name):
        def go():
            set_executor(model, ex[name])
            out[name] = nl.prefill(model, ids, chunk=128, platform="m2-max")
        return go
    ts = time_interleaved({k: run(k) for k in ex}, repeats)
    nl.detach(model)
    te, tn = statistics.median(ts["emulated"]), statistics.median(ts["native"])
    d = (out["emulated"].logits - out["native"].logits).abs()
    top1 = float((out["emulated"].logits.argmax(-1) == out["native"].logits.argmax(-1)).float().mean())
    # a rounding flip of a near-tie routing or capacity decision moves a position's logits: count those
    diff = (f"logits emulated vs native: max |diff| {float(d.max()):.2e}, mean {float(d.mean()):.1e}, "
            f"{int((d.amax(-1) > 0.05).sum())} of {d.shape[1]} positions above 0.05, top-1 agreement {top1:.4f}")
    same = out["emulated"].summary["ttft_s"] == out["native"].summary["ttft_s"]
    record(checks, "fp16: modeled tiny-model prefill, emulated vs native", tn / te, ">=", 10)
    return (f"Modeled prefill (m2-max, npumoe-tg plan, bundled tiny model fp32, 512 tokens, chunk 128; host wall time "
            f"measured, median of {repeats}): native fp16 groups {tn:.2f} s, emulated {te:.2f} s: **{tn / te:.1f}x**; "
            f"{diff}; modeled TTFT identical: {same}.")
