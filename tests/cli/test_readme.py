"""The commands of README and of every guide under docs/ paste and run as written: every bash block's command lines
(continuations joined, comments stripped) tokenise with shlex into no shell operators (`A|B` alternatives would become
pipes, `[--x]` a glob), and each `npumoe-lab` line parses with the real parser (nothing runs); every repository file
they name exists. README stays a page (<= 250 lines) and no document cites an issue number."""
import re
import shlex

import pytest

from npumoe_lab import cli
from npumoe_lab.utils import REPO_ROOT

README = (REPO_ROOT / "README.md").read_text()
DOCS = sorted([REPO_ROOT / "README.md", REPO_ROOT / "notebooks" / "README.md", *(REPO_ROOT / "docs").rglob("*.md")])
TEXTS = {str(p.relative_to(REPO_ROOT)): p.read_text() for p in DOCS}
PRODUCED = ("results/", "graphs/", "DIR/", ".venv/", "data/cache/")       # written by the commands themselves


def bash_commands(text: str) -> list[str]:
    lines = []
    for block in re.findall(r"```bash\n(.*?)```", text, flags=re.S):
        joined = re.sub(r"\\\n\s*", " ", block)
        for line in joined.splitlines():
            code = line.split(" #", 1)[0].strip() if not line.lstrip().startswith("#") else ""
            if code:
                lines.append(code)
    return lines


COMMANDS = bash_commands(README)
CLI_LINES = [c for c in COMMANDS if c.startswith("npumoe-lab ")]
ALL_COMMANDS = sorted({c for text in TEXTS.values() for c in bash_commands(text)})
ALL_CLI_LINES = [c for c in ALL_COMMANDS if c.startswith("npumoe-lab ")]


def test_readme_has_the_workflow():
    assert len(CLI_LINES) >= 15
    firsts = [c.split()[1] for c in CLI_LINES]
    assert firsts.index("calibrate") < firsts.index("plan") < firsts.index("run")
    run = next(c for c in CLI_LINES if c.split()[1] == "run")
    assert "--plan results/plan.json" in run          # the calibrate -> plan -> run --plan workflow


def test_readme_is_a_page_and_points_to_the_guides():
    assert len(README.splitlines()) <= 250
    for guide in re.findall(r"`(docs/[\w/.-]+\.md)`", README):
        assert (REPO_ROOT / guide).is_file(), guide
    assert len(ALL_CLI_LINES) > len(CLI_LINES)          # the guides' commands are checked too


@pytest.mark.parametrize("name", sorted(TEXTS))
def test_no_issue_numbers_in_docs(name):
    # this project's issues rot; an external source's "issue #N" (another repository) is a citation and stays
    found = re.findall(r"\b[Ii]ssues? \d+", TEXTS[name])
    assert not found, f"{name} cites issue numbers: {found}"


@pytest.mark.parametrize("line", ALL_COMMANDS)
def test_no_shell_operator_or_glob_in_a_command(line):
    lexer = shlex.shlex(line, posix=True, punctuation_chars=True)
    tokens = list(lexer)
    assert not {"|", "||", "&", "&&", ";", "<", ">"} & set(tokens), f"shell operator in README command: {line}"
    assert not any(t.startswith("[") or t.endswith("]") for t in tokens), f"[optional] part in: {line}"


@pytest.mark.parametrize("line", ALL_CLI_LINES)
def test_every_npumoe_lab_command_parses(line, capsys):
    argv = shlex.split(line)[1:]
    args = cli.build_parser(argv).parse_args(argv)        # argparse exits 2 on an unknown flag or value
    assert getattr(args, "func", None) is not None, line


# the guides written for users; the other notes (DESIGN, sources) also cite files of external repositories
USER_DOCS = sorted(n for n in TEXTS if n in ("README.md", "notebooks/README.md", "docs/FINDINGS.md")
                   or n.startswith("docs/guide/"))


@pytest.mark.parametrize("name", sorted(TEXTS))
def test_every_file_a_document_names_exists(name):
    text = TEXTS[name]
    names = set() if name not in USER_DOCS else set(re.findall(r"(?<![\w/<.-])((?:[\w.-]+/)+[\w.-]+\.(?:yaml|yml|py|ipynb|md|json|txt|csv|parquet))",
                           text))
    for line in bash_commands(text):                      # and every file argument of the commands
        names |= {f for t in shlex.split(line) for f in t.split(",") if re.search(r"\.(ya?ml|py|ipynb)$", f)}
    here = (REPO_ROOT / name).parent
    missing = sorted(n for n in names if not n.startswith(PRODUCED) and not (REPO_ROOT / n).exists()
                     and not (here / n).exists())
    assert not missing, f"{name} names files that are not in the repository: {missing}"


def test_every_sweep_readme_names_loads():
    from npumoe_lab.experiments.sweep_spec import load_spec
    sweeps = sorted(set(re.findall(r"sweeps/[\w.-]+\.yaml", README)))
    assert "sweeps/ablation.yaml" in sweeps
    for name in sweeps:
        spec = load_spec(REPO_ROOT / name)
        assert spec.cells(), name
    ablation = load_spec(REPO_ROOT / "sweeps" / "ablation.yaml")
    assert ablation.parameters["variants"] == "npumoe-base,npumoe-t,npumoe-tg,npumoe" and len(ablation.cells()) == 4
