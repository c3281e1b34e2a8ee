"""Training recipe of the tiny MoE (`npumoe-lab train-tiny`, or `python -m npumoe_lab.train.trainer`).

Model: `transformers.Qwen3MoeForCausalLM`, vocab 4096, hidden 256, 4 layers, 4 heads / 2 KV heads (head_dim 64),
32 experts top-4, moe_intermediate 128, norm_topk_prob, tied embeddings, router_aux_loss_coef 0.001.
Data mixture: natural text of the 4 domains (train splits) + synthetic long-context tasks from the SAME generators
as the eval workloads (`npumoe_lab.workloads.ruler` / `fewshot`), with the training text as haystack and a
separate seed stream; answer tokens get extra loss weight; optionally an induction warm-up task `repeat`
(segments of natural text or random tokens, each followed by an exact copy). Length curriculum by time fractions (e.g. 512 -> 1024
-> 2304). AdamW, warmup + cosine decay (over the time budget), grad clip 1.0. Time-budgeted, resumable,
logs `training_log.csv` + `loss_curve.png` in the run dir, exports fp16 weights + tokenizer.
"""
from __future__ import annotations

import csv
import json
import math
import os
import random
import time
from pathlib import Path

import numpy as np

from npumoe_lab.errors import NpuMoeError
from npumoe_lab.utils import DATA_DIR, progress
from npumoe_lab.workloads import fewshot, ruler
from npumoe_lab.workloads.base import Haystack, newline_ids
from npumoe_lab.train import corpora
from npumoe_lab.train.tokenizer import load_tokenizer, train_tokenizer

DEFAULT_RUN = DATA_DIR / "train-runs" / "tiny"
DEFAULT_EXPORT = DATA_DIR / "models" / "npumoe-tiny"
CONTEXT = 2304


def model_config(vocab_size: int = 4096, max_pos: int = CONTEXT):
    from transformers import Qwen3MoeConfig
    return Qwen3MoeConfig(
        vocab_size=vocab_size, hidden_size=256, intermediate_size=512, num_hidden_layers=4,
        num_attention_heads=4, num_key_value_heads=2, head_dim=64, max_position_embeddings=max_pos,
        num_experts=32, num_experts_per_tok=4, moe_intermediate_size=128, norm_topk_prob=True,
        decoder_sparse_step=1, router_aux_loss_coef=0.001, tie_word_embeddings=True, rope_theta=10000.0,
        bos_token_id=0, eos_token_id=0, pad_token_id=1, rms_norm_eps=1e-6, attention_dropout=0.0)


def parse_stages(spec: str) -> list[tuple[int, float]]:
    out = []
    for part in spec.split(","):
        try:
            L, f = part.split(":")
            out.append((int(L), float(f)))
        except ValueError as exc:
            raise NpuMoeError(f"--stages {spec!r}: each part must be SEQ_LEN:TIME_FRACTION, e.g. 512:0.4") from exc
    tot = sum(f for _, f in out)
    return [(L, f / tot) for L, f in out]


class Mixture:
    """Draws training sequences: natural text or a synthetic task (answer-token mask marks up-weighted targets)."""

    def __init__(self, tok, tokens: dict[str, np.ndarray], synth_frac: float, seed: int,
                 task_weights: dict[str, float] | None = None):
        self.tok, self.tokens, self.synth_frac = tok, tokens, synth_frac
        self.hay = Haystack(tokens, newline_ids(tok))
        self.rng = random.Random(f"train-mixture:{seed}")
        self.bos = [tok.bos_token_id]
        self.domains = sorted(tokens)
        self.task_weights = task_weights or {"multikey": 0.4, "vt": 0.4, "fewshot": 0.2}
        self.max_queries = 4
        self.weight_copies = False  # repeat task: give the copied halves the answer-token weight

    def natural(self, L):
        d = self.rng.choice(self.domains)
        w, _ = self.hay.window(self.rng, L - 1, d)
        return self.bos + w, [0] * L, "natural"

    def synthetic(self, L, task=None):
        r = self.rng
        task = task or r.choices(list(self.task_weights), weights=list(self.task_weights.values()))[0]
        if task == "repeat":  # induction warm-up: segments each followed by an exact copy (natural or random)
            ids, mask = list(self.bos), [0]
            while len(ids) < L:
                n = r.randint(16, 128)
                if r.random() < 0.5:
                    seg, _ = self.hay.window(r, n)
                else:
                    seg = [r.randrange(2, len(self.tok)) for _ in range(n)]
                ids += seg + seg
                mask += [0] * n + [int(self.weight_copies)] * n
            return ids[:L], mask[:L], task
        if task == "multikey":
            nq = r.randint(1, self.max_queries)
            t = ruler.build_multikey(self.tok, r, self.hay, L, n_needles=r.randint(max(2, nq), 6), n_queries=nq,
                                     answered_last=True)
            ids, mask = t.training_ids([])
        elif task == "vt":
            nc = r.randint(1, 3)
            t = ruler.build_vt(self.tok, r, self.hay, L, n_vars=3, n_chains=nc, n_queries=nc, answered_last=True,
                               vary_len=r.random() < 0.3)
            ids, mask = t.training_ids([])
        else:
            lab = fewshot.LABELS
            qd = r.choice(fewshot.DOMAINS)
            lab_ids = self.tok.encode(lab[qd], add_special_tokens=False)
            ids, _, spans, _ = fewshot.build_fewshot(self.tok, r, self.hay, L - len(lab_ids), query_domain=qd)
            mask = [0] * len(ids)
            for a, b in spans:
                mask[a:b] = [1] * (b - a)
            ids = ids + lab_ids
            mask = mask + [1] * len(lab_ids)
        assert len(ids) == L, (task, len(ids), L)
        return ids, mask, task

    def batch(self, B, L):
        import torch
        rows = [self.synthetic(L) if self.rng.random() < self.synth_frac else self.natural(L) for _ in range(B)]
        ids = torch.tensor([r[0] for r in rows], dtype=torch.long)
        mask = torch.tensor([r[1] for r in rows], dtype=torch.float32)
        return ids, mask


def encode_corpora(tok, cache: Path) -> dict[str, np.ndarray]:
    out = {}
    for d in corpora.DOMAINS:
        f = cache / f"tokens_{d}_train.npy"
        if not f.exists():
            text = corpora.train_text(d)
            chunks = [text[i:i + 200_000] for i in range(0, len(text), 200_000)]
            ids = []
            for enc in tok(chunks, add_special_tokens=False)["input_ids"]:
                ids.extend(enc)
            np.save(f, np.asarray(ids, dtype=np.uint16))
        out[d] = np.load(f)
    return out


def lm_loss(model, ids, mask, answer_weight):
    import torch.nn.functional as F
    out = model(input_ids=ids, output_router_logits=True)
    logits = out.logits[:, :-1].float()
    tgt = ids[:, 1:]
    ce = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), tgt.reshape(-1), reduction="none").view_as(tgt)
    m = mask[:, 1:]
    w = 1.0 + answer_weight * m
    loss = (ce * w).sum() / w.sum()
    aux = out.aux_loss if getattr(out, "aux_loss", None) is not None else 0.0
    ans = (ce * m).sum() / m.sum().clamp(min=1)
    return loss + model.config.router_aux_loss_coef * aux, ce.mean().detach(), ans.detach(), float(m.sum())


def evaluate(model, tok, val_windows, probe):
    """per-domain val loss (calib split windows) + teacher-forced synthetic-task accuracy (all answer tokens argmax)."""
    import torch
    import torch.nn.functional as F
    model.eval()
    res = {}
    with torch.no_grad():
        for d, w in val_windows.items():
            logits = model(input_ids=w).logits[:, :-1].float()
            res[f"val_{d}"] = float(F.cross_entropy(logits.reshape(-1, logits.shape[-1]), w[:, 1:].reshape(-1)))
        for task, (ids, mask) in probe.items():
            pred = model(input_ids=ids).logits[:, :-1].argmax(-1)
            m = mask[:, 1:].bool()
            ok = [(pred[i][m[i]] == ids[i, 1:][m[i]]).all().item() for i in range(ids.shape[0])]
            res[f"acc_{task}"] = float(np.mean(ok))
    model.train()
    return res


def plot_curve(csv_path: Path, png_path: Path):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        import pandas as pd
        df = pd.read_csv(csv_path)
        fig, ax = plt.subplots(1, 2, figsize=(11, 4))
        ax[0].plot(df["tokens"] / 1e6, df["train_loss"], label="train (all tokens)", alpha=0.6)
        for c in [c for c in df.columns if c.startswith("val_")]:
            ax[0].plot(df["tokens"] / 1e6, df[c], marker=".", label=c)
        ax[0].set_xlabel("tokens (M)"), ax[0].set_ylabel("loss (nats/token)"), ax[0].legend(fontsize=7)
        for c in [c for c in df.columns if c.startswith("acc_")]:
            ax[1].plot(df["tokens"] / 1e6, df[c], marker=".", label=c)
        ax[1].set_xlabel("tokens (M)"), ax[1].set_ylabel("teacher-forced answer accuracy"), ax[1].legend(fontsize=7)
        ax[1].set_ylim(-0.02, 1.02)
        fig.tight_layout()
        fig.savefig(png_path, dpi=110)
        plt.close(fig)
    except Exception as exc:  # plotting never kills a run
        print(f"plot failed: {exc}")


def export(model, tok, out_dir: Path, run_dir: Path, meta: dict):
    import copy

    import torch
    out_dir.mkdir(parents=True, exist_ok=True)
    m = copy.deepcopy(model).to(torch.float16)
    m.config.dtype = "float16"
    m.save_pretrained(out_dir, safe_serialization=True)
    tok.save_pretrained(out_dir)
    for f in ("training_log.csv", "loss_curve.png"):
        if (run_dir / f).exists():
            (out_dir / f).write_bytes((run_dir / f).read_bytes())
    (out_dir / "training_meta.json").write_text(json.dumps(meta, indent=1))


def train(args) -> int:
    import torch
    from transformers import Qwen3MoeForCausalLM

    auto_threads = str(args.threads) == "auto"
    cur_threads = 2 if auto_threads else int(args.threads)
    torch.set_num_threads(cur_threads)
    run = Path(args.run_dir)
    run.mkdir(parents=True, exist_ok=True)
    stages = parse_stages(args.stages)
    max_len = max(L for L, _ in stages)
    corpora.prepare()
    tok_dir = run / "tokenizer"
    tok = load_tokenizer(tok_dir) if (tok_dir / "tokenizer.json").exists() else train_tokenizer(tok_dir, CONTEXT)
    tokens = encode_corpora(tok, run)
    print({d: len(t) for d, t in tokens.items()}, flush=True)

    torch.manual_seed(args.seed)
    cfg = model_config(len(tok), max(CONTEXT, max_len))
    model = Qwen3MoeForCausalLM(cfg)
    model.set_experts_implementation(args.experts_impl)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.95), weight_decay=0.1, eps=1e-8)
    state = {"step": 0, "tokens": 0, "elapsed": 0.0}
    ckpt = run / "checkpoint.pt"
    if ckpt.exists() and not args.fresh:
        st = torch.load(ckpt, weights_only=False)
        model.load_state_dict(st["model"])
        opt.load_state_dict(st["opt"])
        state = st["state"]
        print(f"resumed from {ckpt} at step {state['step']} ({state['elapsed'] / 60:.1f} min)", flush=True)
    n_params = sum(p.numel() for p in model.parameters())
    print(f"params {n_params / 1e6:.2f} M", flush=True)

    weights = {k: float(v) for k, v in (p.split(":") for p in args.task_weights.split(","))}
    if set(weights) - {"multikey", "vt", "fewshot", "repeat"}:
        raise NpuMoeError(f"--task-weights {args.task_weights!r}: tasks are multikey, vt, fewshot, repeat")
    mix = Mixture(tok, tokens, args.synth_frac, args.seed + state["step"], weights)
    mix.max_queries = args.max_queries
    mix.weight_copies = args.weight_copies
    # fixed validation: calib split (training corpora), 4 x 512-token windows per domain; probe tasks at 512
    vrng = random.Random(99)
    val_tok = {d: np.asarray(tok(corpora.corpus_path(d, "calib").read_text(), add_special_tokens=False)[
        "input_ids"]) for d in corpora.DOMAINS}
    val_windows = {}
    for d, t in val_tok.items():
        starts = [i * 511 for i in range(4)]
        val_windows[d] = torch.tensor([[tok.bos_token_id] + t[s:s + 511].tolist() for s in starts])
    pmix = Mixture(tok, val_tok, 1.0, 4242)
    pmix.hay = Haystack(val_tok, newline_ids(tok))
    probe = {}
    for task in ("multikey", "vt", "fewshot"):
        rows = [pmix.synthetic(args.probe_len, task) for _ in range(12)]
        probe[task] = (torch.tensor([r[0] for r in rows]), torch.tensor([r[1] for r in rows], dtype=torch.float32))
    del vrng

    log_path = run / "training_log.csv"
    fields = ["step", "tokens", "elapsed_s", "seq_len", "lr", "train_loss", "answer_loss", "aux"] + \
             [f"val_{d}" for d in corpora.DOMAINS] + ["acc_multikey", "acc_vt", "acc_fewshot"]
    if not log_path.exists() or args.fresh:
        with open(log_path, "w", newline="") as f:
            csv.writer(f).writerow(fields)

    budget = args.minutes * 60.0
    t0 = time.time() - state["elapsed"]
    last_eval = time.time()
    ema = ans_ema = None
    trial, recent = None, []
    bar = progress(total=int(budget), initial=int(state["elapsed"]), unit="s", desc="train-tiny")
    model.train()

    def save(row=None):
        state["elapsed"] = time.time() - t0
        torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "state": state}, ckpt.with_suffix(".tmp"))
        os.replace(ckpt.with_suffix(".tmp"), ckpt)
        if row is not None:
            with open(log_path, "a", newline="") as f:
                csv.writer(f).writerow([row.get(k, "") for k in fields])
            plot_curve(log_path, run / "loss_curve.png")

    while True:
        elapsed = time.time() - t0
        frac = elapsed / budget
        if frac >= 1.0:
            break
        acc = 0.0
        for L, f in stages:
            acc += f
            if frac < acc:
                break
        B = max(1, args.batch_tokens // L)
        s = state["step"]
        lr = args.lr * min(1.0, (s + 1) / args.warmup) * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(frac, 1.0))))
        for g in opt.param_groups:
            g["lr"] = lr
        ids, mask = mix.batch(B, L)
        t_step = time.time()
        loss, ce, ans, n_ans = lm_loss(model, ids, mask, args.answer_weight)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if auto_threads:  # on a shared CPU, 1 thread can beat 2 (OpenMP barriers): try the other now and then
            rate = B * L / (time.time() - t_step)
            if trial is None:
                recent.append(rate)
                recent[:] = recent[-5:]
                if state["step"] % 100 == 50 and len(recent) == 5:
                    trial = {"threads": 3 - cur_threads, "rates": [], "base": float(np.median(recent))}
                    torch.set_num_threads(trial["threads"])
            else:
                trial["rates"].append(rate)
                if len(trial["rates"]) == 4:
                    new_rate = float(np.median(trial["rates"][1:]))
                    if new_rate > 1.1 * trial["base"]:
                        cur_threads = trial["threads"]
                    torch.set_num_threads(cur_threads)
                    print(f"threads: {3 - trial['threads']} -> {trial['base']:.0f} tok/s, {trial['threads']} -> "
                          f"{new_rate:.0f} tok/s; using {cur_threads}", flush=True)
                    trial, recent = None, []
        state["step"] += 1
        state["tokens"] += B * L
        ema = float(ce) if ema is None else 0.95 * ema + 0.05 * float(ce)
        if n_ans > 0:
            ans_ema = float(ans) if ans_ema is None else 0.9 * ans_ema + 0.1 * float(ans)
        bar.update(int(time.time() - t0) - bar.n)
        bar.set_postfix(step=s, L=L, loss=f"{ema:.3f}", ans=f"{ans_ema or 0:.3f}", lr=f"{lr:.1e}")
        if time.time() - last_eval > args.eval_minutes * 60 or state["step"] == 1:
            ev = evaluate(model, tok, val_windows, probe)
            row = {"step": state["step"], "tokens": state["tokens"], "elapsed_s": round(time.time() - t0, 1),
                   "seq_len": L, "lr": lr, "train_loss": round(ema, 4), "answer_loss": round(ans_ema or 0, 4),
                   "aux": "", **{k: round(v, 4) for k, v in ev.items()}}
            print(json.dumps(row), flush=True)
            save(row)
            last_eval = time.time()
    bar.close()
    ev = evaluate(model, tok, val_windows, probe)
    row = {"step": state["step"], "tokens": state["tokens"], "elapsed_s": round(time.time() - t0, 1),
           "seq_len": L, "lr": lr, "train_loss": round(ema or 0, 4), "answer_loss": round(ans_ema or 0, 4),
           **{k: round(v, 4) for k, v in ev.items()}}
    print(json.dumps(row), flush=True)
    save(row)
    meta = {"steps": state["step"], "tokens": state["tokens"], "train_seconds": round(state["elapsed"], 1),
            "params": n_params, "threads_final": cur_threads, "args": {k: str(v) for k, v in vars(args).items() if k != "func"},
            "final_eval": row}
    if args.export:
        export(model, tok, Path(args.export), run, meta)
        print(f"exported to {args.export}", flush=True)
    return 0
