"""The targets over several rounds (`make bench-rounds`): is a ratio on its line, or past it?

One `make bench` run gives one ratio per target, and on a shared 2-core VM HF eager's own time moves by 10-20 %
between runs (bench/RESULTS.md: the layer at 2048 tokens read 1.20-1.36x over six runs). This runs
`moe_layer.py --json` N times, each in a fresh process (its own allocator, caches and thread pool), one after the
other, and prints per target every round's value, the median, the range and how many rounds met it. A target is
read as holding when its median round meets it; "k of N" says how firmly. Rows marked info are not targets (the
same ratio at equal work, beside the target's).

    .venv/bin/python bench/rounds.py --rounds 5 [--keep DIR] [moe_layer.py options]
    .venv/bin/python bench/rounds.py --from DIR [DIR ...]   # summarise kept rounds; several folders: one pooled
                                                            # verdict over every batch (rounds numbered in order)
    (defaults: --only layer,policy --variants static-3tier,static-3tier-cpu --repeats 3; ~2.5 min a round quiet)
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tqdm import tqdm

HERE = Path(__file__).resolve().parent
DEFAULT = ["--only", "layer,policy", "--variants", "static-3tier,static-3tier-cpu", "--repeats", "3"]


def _fmt(v: float) -> str:
    return f"{v:.2e}" if 0 < abs(v) < 0.01 else f"{v:.2f}"


def summarise(rounds: list[dict]) -> str:
    """Markdown: one row per check seen in any round (in first-seen order), every round's value, median, range,
    rounds meeting it, verdict. `rounds`: moe_layer.py --json documents, plus `loadavg` where measured."""
    names, by = [], {}
    for i, doc in enumerate(rounds):
        for c in doc["checks"]:
            if c["check"] not in by:
                names.append(c["check"])
                by[c["check"]] = {}
            by[c["check"]][i] = c
    n = len(rounds)
    lines = [f"| check | target | {' | '.join(f'round {i + 1}' for i in range(n))} | median | range | rounds "
             "meeting it | verdict |", "|" + "---|" * (n + 6)]
    for name in names:
        got = by[name]
        vals = [got[i]["value"] for i in sorted(got)]
        thr = statistics.median(got[i]["threshold"] for i in got)     # a bound can move a little with the routing
        op = next(iter(got.values()))["op"]
        med = statistics.median(vals)
        met = sum(got[i]["holds"] for i in got)
        info = next(iter(got.values())).get("info", False)
        holds = med >= thr if op == ">=" else med <= thr
        verdict = "info" if info else ("holds" if holds else "**misses**")
        cells = " | ".join(_fmt(got[i]["value"]) if i in got else "-" for i in range(n))
        lines.append(f"| {name} | {op} {_fmt(thr)} | {cells} | {_fmt(med)} | {_fmt(min(vals))}-{_fmt(max(vals))} | "
                     f"{met} of {len(got)} | {verdict} |")
    loads = [f"{d['loadavg'][0]:.1f}/{d['loadavg'][1]:.1f}" for d in rounds if d.get("loadavg")]
    head = [rounds[0]["cpu"] if rounds else "no rounds",
            f"{n} rounds, {rounds[0]['provenance'] if rounds else ''} .. "
            f"{rounds[-1]['provenance'].split(',')[0] if rounds else ''}"]
    head.append("Every value is measured on this host: wall-time ratios of runs side by side in one process (the fp16 "
                "error row: a numerical error against float64), nothing modeled.")
    commits = list(dict.fromkeys(part for d in rounds for part in d["provenance"].split(", ")
                                 if part.startswith("commit ")))
    if len(commits) > 1:                 # pooled batches (--from DIR DIR ...) of more than one checkout
        head.append("rounds of several checkouts: " + "; ".join(commits))
    if loads:
        head.append("load average (1 / 5 min) after each round: " + ", ".join(loads))
    return "\n".join(head + ["", *lines])


def run_rounds(n: int, bench_args: list[str], keep: Path | None = None) -> list[dict]:
    out = keep or Path(tempfile.mkdtemp(prefix="npumoe-rounds-"))
    out.mkdir(parents=True, exist_ok=True)
    docs = []
    for i in tqdm(range(n), desc="bench rounds", unit="round"):
        path = out / f"round{i + 1}.json"
        cmd = [sys.executable, str(HERE / "moe_layer.py"), *bench_args, "--json", str(path),
               "--out", str(out / f"round{i + 1}.md")]
        env = dict(os.environ, NPUMOE_NO_PROGRESS="1")
        t0 = time.perf_counter()
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
        if proc.returncode != 0 or not path.is_file():
            tail = (proc.stderr or proc.stdout)[-2000:]
            raise SystemExit(f"round {i + 1} failed (exit {proc.returncode}); rounds so far are kept in {out}.\n"
                             f"{tail}")
        doc = json.loads(path.read_text())
        doc["loadavg"], doc["wall_s"] = list(os.getloadavg()), time.perf_counter() - t0
        path.write_text(json.dumps(doc, indent=1) + "\n")
        docs.append(doc)
    return docs


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--keep", default="", help="folder for each round's report and JSON (default: a temp folder)")
    p.add_argument("--from", dest="from_dirs", nargs="+", default=[], metavar="DIR",
                   help="summarise the round*.json already in these folders (several: pooled, in the order given)")
    args, rest = p.parse_known_args(argv)
    if args.rounds < 1:
        p.error(f"--rounds {args.rounds}: give at least 1")
    if args.from_dirs:
        docs = []
        for d in args.from_dirs:
            files = sorted((f for f in Path(d).glob("round*.json") if f.stem[5:].isdigit()),
                           key=lambda f: int(f.stem[5:]))       # round1.json, round2.json, ... (--keep's names)
            if not files:
                p.error(f"no round*.json in {d}: run bench/rounds.py --keep {d} first")
            for f in files:
                try:
                    docs.append(json.loads(f.read_text()))
                except (OSError, ValueError) as e:
                    p.error(f"{f}: not a readable round ({e}); delete it or run that round again")
    else:
        sys.path.insert(0, str(HERE))
        import moe_layer                 # its options checked here, before any round runs (exit 2 on a bad one)
        moe_layer.parse_args(rest or DEFAULT)
        docs = run_rounds(args.rounds, rest or DEFAULT, Path(args.keep) if args.keep else None)
    print(summarise(docs))


if __name__ == "__main__":
    main()
