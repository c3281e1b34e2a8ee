"""`npumoe-lab card`: measure the bundled model's card (card_metrics.json + README.md in the model folder)."""
from __future__ import annotations

from npumoe_lab.utils import DATA_DIR


def _card(a) -> int:
    from npumoe_lab.train.card import write_card      # lazy: torch loads only when it runs, not at --help
    write_card(a.model_dir, a.n, a.lens, a.threads, a.skip_workloads)
    return 0


def register_cli(sub) -> None:
    p = sub.add_parser("card", help="measure what the tiny model's card states; write README.md + "
                                    "card_metrics.json in the model folder")
    p.add_argument("--model-dir", default=str(DATA_DIR / "models" / "npumoe-tiny"), help="the exported model")
    p.add_argument("--n", type=int, default=24, help="samples per workload and prompt length")
    p.add_argument("--lens", default="1024,2048", help="prompt lengths, optionally LEN:N (e.g. 1024:32,2048:16)")
    p.add_argument("--threads", type=int, default=2, help="torch threads")
    p.add_argument("--skip-workloads", action="store_true", help="only perplexity, probe and routing")
    p.set_defaults(func=_card)
