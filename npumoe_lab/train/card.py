"""Model card of the bundled tiny model: measures what the card states and writes README.md + card_metrics.json.

`python -m npumoe_lab.train.card [--model-dir data/models/npumoe-tiny] [--n 24] [--lens 1024,2048]`

Procedures (a test recomputes them, tests/test_tiny_model.py):
- perplexity per domain: the first 4 non-overlapping windows of `data/text/<domain>/heldout.txt`, each
  `[bos] + 1023 tokens` (the `lm-heldout` windows at prompt_len 1024); ppl = exp(token-weighted mean NLL over the
  4 x 1023 predicted tokens), fp32 weights upcast from the fp16 file.
- routing: the first 4 such 1024-token windows of `data/text/<domain>/calib.txt` for each domain (16,384 tokens);
  per layer, softmax over the router logits (`output_router_logits=True`), top-4 experts per token; counts of
  assignments per expert. Gini over the 32 counts, top-1 share (busiest expert's share of assignments), the
  smallest number of experts covering 50 % / 80 % of assignments; per-domain hot set = the 8 busiest experts of
  that domain; Jaccard of hot sets between domains.
- workloads: `npumoe_lab.workloads.scoring.evaluate` with the default prefill, seed 0.
"""
from __future__ import annotations

import itertools
import json
import math
import time
from pathlib import Path

import numpy as np

from npumoe_lab.utils import DATA_DIR
from npumoe_lab.workloads import get_workload
from npumoe_lab.workloads.scoring import evaluate
from npumoe_lab.train.card_text import write_readme

MODEL_DIR = DATA_DIR / "models" / "npumoe-tiny"
DOMAINS = ("scripture", "drama", "pydocs", "code")
N_WIN, WIN = 4, 1024


def windows(tok, text: str, n: int = N_WIN, length: int = WIN) -> list[list[int]]:
    ids = tok.encode(text, add_special_tokens=False)
    body = length - 1
    return [[tok.bos_token_id] + ids[i * body:(i + 1) * body] for i in range(n)]


def gini(counts) -> float:
    x = np.sort(np.asarray(counts, dtype=np.float64))
    n = len(x)
    if x.sum() == 0:
        return 0.0
    return float(((2 * np.arange(1, n + 1) - n - 1) * x).sum() / (n * x.sum()))


def cover(counts, frac: float) -> int:
    x = np.sort(np.asarray(counts, dtype=np.float64))[::-1]
    return int(np.searchsorted(np.cumsum(x) / x.sum(), frac - 1e-12) + 1)


def routing_stats(model, tok, text_dir: Path = DATA_DIR / "text", hot: int = 8) -> dict:
    import torch
    cfg = model.config
    E, K = cfg.num_experts, cfg.num_experts_per_tok
    per_dom = {}
    with torch.no_grad():
        for d in DOMAINS:
            ids = torch.tensor(windows(tok, (text_dir / d / "calib.txt").read_text(encoding="utf-8")))
            out = model(input_ids=ids, output_router_logits=True)
            per_dom[d] = []
            for logits in out.router_logits:
                top = torch.softmax(logits.float(), -1).topk(K, dim=-1).indices
                per_dom[d].append(torch.bincount(top.reshape(-1), minlength=E).numpy())
    layers = []
    for l in range(cfg.num_hidden_layers):
        counts = sum(per_dom[d][l] for d in DOMAINS)
        hot_sets = {d: sorted(np.argsort(-per_dom[d][l], kind="stable")[:hot].tolist()) for d in DOMAINS}
        jac = {f"{a}/{b}": len(set(hot_sets[a]) & set(hot_sets[b])) / len(set(hot_sets[a]) | set(hot_sets[b]))
               for a, b in itertools.combinations(DOMAINS, 2)}
        layers.append({"layer": l, "gini": gini(counts), "top1_share": float(counts.max() / counts.sum()),
                       "experts_50": cover(counts, 0.5), "experts_80": cover(counts, 0.8),
                       "dead_experts": int((counts == 0).sum()), "counts": counts.tolist(),
                       "hot_sets": hot_sets, "jaccard": jac, "mean_jaccard": float(np.mean(list(jac.values())))})
    return {"n_tokens": int(sum(N_WIN * WIN for _ in DOMAINS)), "top_k": K, "n_experts": E, "layers": layers}


def heldout_ppl(model, tok, text_dir: Path = DATA_DIR / "text") -> dict:
    import torch
    import torch.nn.functional as F
    out = {}
    with torch.no_grad():
        for d in DOMAINS:
            ids = torch.tensor(windows(tok, (text_dir / d / "heldout.txt").read_text(encoding="utf-8")))
            logits = model(input_ids=ids).logits[:, :-1].float()
            nll = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1))
            out[d] = {"nll": float(nll), "ppl": math.exp(float(nll)), "n_tokens": int(ids[:, 1:].numel())}
    return out


def induction_probe(model, tok, n: int = 8, length: int = 100, seed: int = 0) -> dict:
    """NLL of a random token sequence and of its exact repetition ([bos] X X): a model with induction heads
    predicts the repetition almost perfectly; without them both halves stay near ln(vocab)."""
    import torch
    import torch.nn.functional as F
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(10, len(tok), (n, length), generator=g)
    ids = torch.cat([torch.full((n, 1), tok.bos_token_id), x, x], 1)
    with torch.no_grad():
        lp = F.log_softmax(model(input_ids=ids).logits[:, :-1].float(), -1)
    nll = -lp.gather(2, ids[:, 1:, None]).squeeze(-1)
    return {"first_half_nll": float(nll[:, :length].mean()), "repeat_nll": float(nll[:, length + 1:].mean()),
            "n": n, "length": length}


def workload_scores(model, tok, lens, n, names=("ruler-multikey", "ruler-vt", "fewshot-cls", "lm-heldout")):
    """lens: [prompt_len] (n samples each) or [(prompt_len, n)]."""
    res = []
    for L in lens:
        L, n = L if isinstance(L, tuple) else (L, n)
        for name in names:
            w = get_workload(name)
            t = time.time()
            r = evaluate(model, tok, w, L, n, seed=0)
            row = {"workload": name, "prompt_len": L, "n": n, "metric": w.metric, "mean": r["mean"],
                   "chance": None if w.chance != w.chance else w.chance, "seconds": round(time.time() - t, 1)}
            if w.kind != "perplexity":
                row["stderr"] = math.sqrt(max(r["mean"] * (1 - r["mean"]), 0) / n)
                row["scores"] = [x["score"] for x in r["rows"]]  # per sample, for tests to recompute a prefix
            else:
                row["ppl"] = r["ppl"]
            if name == "ruler-vt":
                row["recall"] = float(np.mean([x["recall"] for x in r["rows"]]))
            res.append(row)
            print(json.dumps(row), flush=True)
    return res


def load(model_dir: Path):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    tok = AutoTokenizer.from_pretrained(str(model_dir))
    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32).eval()
    return model, tok


def write_card(model_dir=MODEL_DIR, n: int = 24, lens: str = "1024,2048", threads: int = 2,
               skip_workloads: bool = False) -> dict:
    """Measure the card's metrics of the model in `model_dir` and write card_metrics.json + README.md there."""
    import torch
    torch.set_num_threads(threads)
    d = Path(model_dir)
    model, tok = load(d)
    metrics_path = d / "card_metrics.json"
    metrics = json.loads(metrics_path.read_text()) if metrics_path.exists() else {}
    metrics["heldout_ppl"] = heldout_ppl(model, tok)
    print(json.dumps(metrics["heldout_ppl"]), flush=True)
    metrics["induction_probe"] = induction_probe(model, tok)
    print(json.dumps(metrics["induction_probe"]), flush=True)
    metrics["routing"] = routing_stats(model, tok)
    print([round(l["gini"], 3) for l in metrics["routing"]["layers"]], flush=True)
    metrics_path.write_text(json.dumps(metrics, indent=1))
    if not skip_workloads:
        lens = [tuple(map(int, x.split(":"))) if ":" in x else (int(x), n) for x in lens.split(",")]
        metrics["workloads"] = workload_scores(model, tok, lens, n)
    metrics["params"] = int(sum(p.numel() for p in model.parameters()))
    metrics_path.write_text(json.dumps(metrics, indent=1))
    write_readme(d, metrics)
    return metrics
