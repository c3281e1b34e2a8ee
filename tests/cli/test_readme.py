"""README's commands paste and run as written: every bash block's command lines (continuations joined, comments
stripped) tokenise with shlex into no shell operators (`A|B` alternatives would become pipes, `[--x]` a glob), and
each `npumoe-lab` line parses with the real parser (nothing runs); every repository file README names exists."""
import re
import shlex

import pytest

from npumoe_lab import cli
from npumoe_lab.utils import REPO_ROOT

README = (REPO_ROOT / "README.md").read_text()
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


def test_readme_has_the_workflow():
    assert len(CLI_LINES) >= 15
    firsts = [c.split()[1] for c in CLI_LINES]
    assert firsts.index("calibrate") < firsts.index("plan") < firsts.index("run")
    run = next(c for c in CLI_LINES if c.split()[1] == "run")
    assert "--plan results/plan.json" in run          # the calibrate -> plan -> run --plan workflow


@pytest.mark.parametrize("line", COMMANDS)
def test_no_shell_operator_or_glob_in_a_command(line):
    lexer = shlex.shlex(line, posix=True, punctuation_chars=True)
    tokens = list(lexer)
    assert not {"|", "||", "&", "&&", ";", "<", ">"} & set(tokens), f"shell operator in README command: {line}"
    assert not any(t.startswith("[") or t.endswith("]") for t in tokens), f"[optional] part in: {line}"


@pytest.mark.parametrize("line", CLI_LINES)
def test_every_npumoe_lab_command_parses(line, capsys):
    argv = shlex.split(line)[1:]
    args = cli.build_parser(argv).parse_args(argv)        # argparse exits 2 on an unknown flag or value
    assert getattr(args, "func", None) is not None, line


def test_every_file_readme_names_exists():
    names = set(re.findall(r"(?<![\w/<.-])((?:[\w.-]+/)+[\w.-]+\.(?:yaml|yml|py|ipynb|md|json|txt|csv|parquet))",
                           README))
    for line in COMMANDS:                                  # and every file argument of the commands
        names |= {f for t in shlex.split(line) for f in t.split(",") if re.search(r"\.(ya?ml|py|ipynb)$", f)}
    missing = sorted(n for n in names if not n.startswith(PRODUCED) and not (REPO_ROOT / n).exists())
    assert not missing, f"README names files that are not in the repository: {missing}"


def test_every_sweep_readme_names_loads():
    from npumoe_lab.experiments.sweep_spec import load_spec
    sweeps = sorted(set(re.findall(r"sweeps/[\w.-]+\.yaml", README)))
    assert "sweeps/ablation.yaml" in sweeps
    for name in sweeps:
        spec = load_spec(REPO_ROOT / name)
        assert spec.cells(), name
    ablation = load_spec(REPO_ROOT / "sweeps" / "ablation.yaml")
    assert ablation.parameters["variants"] == "npumoe-base,npumoe-t,npumoe-tg,npumoe" and len(ablation.cells()) == 4
