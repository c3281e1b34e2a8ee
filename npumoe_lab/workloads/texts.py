"""The bundled text samples: the four domains and their committed calibration / held-out text.

One definition for calibration, the workloads and the training recipe (train/corpora.py builds these files from
the full corpora; nothing here touches the network)."""
from __future__ import annotations

from npumoe_lab.errors import NpuMoeError
from npumoe_lab.utils import DATA_DIR

DOMAINS = ("scripture", "drama", "pydocs", "code")
TEXT_DIR = DATA_DIR / "text"


def bundled_text(domain: str, split: str) -> str:
    """The committed sample data/text/<domain>/<split>.txt (split: calib | heldout)."""
    if domain not in DOMAINS:
        raise NpuMoeError(f"unknown domain {domain!r}; valid: {', '.join(DOMAINS)}")
    p = TEXT_DIR / domain / f"{split}.txt"
    if not p.exists():
        raise NpuMoeError(f"{p} is missing; run `python -m npumoe_lab.train.corpora` to create it")
    return p.read_text(encoding="utf-8")
