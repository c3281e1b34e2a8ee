"""The command line lives in npumoe_lab/cli/ (one module per command): no domain module holds argparse; every
command's `--help` parses without torch/pandas in well under a second and documents every flag; the constants the
cli modules mirror (to stay light) equal the domain's; the script entry points still answer."""
import ast
import contextlib
import io
import subprocess
import sys
from pathlib import Path

import pytest

from npumoe_lab import cli
from npumoe_lab.utils import REPO_ROOT

PKG = REPO_ROOT / "npumoe_lab"


def test_no_domain_module_imports_argparse_or_registers_a_command():
    offenders = []
    for path in PKG.rglob("*.py"):
        if path.is_relative_to(PKG / "cli"):
            continue
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Import) and any(a.name == "argparse" for a in node.names) or \
                    isinstance(node, ast.ImportFrom) and node.module == "argparse":
                offenders.append(f"{path.relative_to(REPO_ROOT)}:{node.lineno} imports argparse")
            if isinstance(node, ast.FunctionDef) and node.name in ("register_cli", "add_args", "add_knob_arguments"):
                offenders.append(f"{path.relative_to(REPO_ROOT)}:{node.lineno} defines {node.name}")
    assert not offenders, "argparse wiring outside npumoe_lab/cli/:\n" + "\n".join(offenders)


def test_every_command_has_its_cli_module():
    for command, module in cli.SUBCOMMANDS.items():
        assert (PKG / "cli" / f"{module}.py").is_file(), command
        parser = cli.build_parser([command])
        sub = next(a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction")
        assert list(sub.choices) == [command]


def test_every_command_help_is_fast_light_and_documents_every_flag():
    code = ("import contextlib, io, sys, time\nfrom npumoe_lab import cli\nfor c in cli.SUBCOMMANDS:\n"
            "    t = time.perf_counter()\n    buf = io.StringIO()\n"
            "    with contextlib.redirect_stdout(buf):\n        try:\n            cli.main([c, '--help'])\n"
            "        except SystemExit as e:\n            assert e.code == 0, c\n"
            "    print(c, time.perf_counter() - t, 'usage:' in buf.getvalue())\n"
            "print('HEAVY', sorted(m for m in ('torch', 'pandas', 'transformers', 'matplotlib') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=REPO_ROOT)
    assert out.returncode == 0, out.stderr[-2000:]
    lines = out.stdout.splitlines()
    assert lines[-1] == "HEAVY []", lines[-1]
    times = {line.split()[0]: float(line.split()[1]) for line in lines[:-1]}
    assert set(times) == set(cli.SUBCOMMANDS) and all(line.endswith("True") for line in lines[:-1])
    assert max(times.values()) < 0.5, times
    undocumented = []
    for command in cli.SUBCOMMANDS:
        parser = cli.build_parser([command])
        sub = next(a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction")
        for action in sub.choices[command]._actions:
            if action.dest != "help" and not action.help:
                undocumented.append(f"{command} {'/'.join(action.option_strings) or action.dest}")
    assert not undocumented, "flags without help text: " + ", ".join(undocumented)


def test_the_constants_the_cli_mirrors_equal_the_domains():
    from npumoe_lab.cli import convert, decode_flags, demo, run, simulate, sweep, train_tiny
    from npumoe_lab.execution.decode_policy import DECODE_POLICIES
    from npumoe_lab.experiments import demo as demo_domain, runner, sweep as sweep_domain
    from npumoe_lab.graphs.build import DECODE_POLICIES as GRAPH_POLICIES, TARGETS
    from npumoe_lab.sim import run as sim_run
    from npumoe_lab.sim.geometries import list_geometries
    from npumoe_lab.train import trainer
    from npumoe_lab.workloads import list_workloads
    assert run.MEASURED_REPEATS == runner.MEASURED_REPEATS
    assert list(run.WORKLOADS) == list_workloads()
    assert sweep.EXECUTORS == sweep_domain.EXECUTORS
    assert convert.TARGETS == TARGETS
    assert decode_flags.DECODE_POLICIES == GRAPH_POLICIES == DECODE_POLICIES
    assert simulate.WEIGHT_FORMATS == tuple(sim_run.WEIGHT_FORMATS)
    assert simulate.bundled_geometries() == list_geometries()
    assert (train_tiny.DEFAULT_RUN, train_tiny.DEFAULT_EXPORT) == (trainer.DEFAULT_RUN, trainer.DEFAULT_EXPORT)
    assert demo.DEMO_SWEEP == demo_domain.DEMO_SWEEP


@pytest.mark.parametrize("module", ["npumoe_lab.cli", "npumoe_lab"])
def test_script_entry_points_still_answer(module):
    argv = [sys.executable, "-m", module, "--help"] if module not in ("npumoe_lab.cli", "npumoe_lab") else \
        [sys.executable, "-m", module, "run", "--help"]
    out = subprocess.run(argv, capture_output=True, text=True, timeout=120, cwd=REPO_ROOT)
    assert out.returncode == 0 and "usage:" in out.stdout, out.stderr[-1500:]


def test_no_domain_module_runs_as_a_script_through_the_cli():
    """Domain modules hold no `__main__` block reaching up into cli/ (the layering holds in code, not only on
    paper): their commands are `npumoe-lab demo | train-tiny | card`."""
    offenders = [str(p.relative_to(REPO_ROOT)) for p in PKG.rglob("*.py")
                 if not p.is_relative_to(PKG / "cli") and p.name != "__main__.py"
                 and ("npumoe_lab.cli" in p.read_text() and "importlib" in p.read_text())]
    assert not offenders, offenders


def test_an_unknown_command_is_refused_by_argparse():
    with contextlib.redirect_stderr(io.StringIO()) as err, pytest.raises(SystemExit) as exc:
        cli.main(["no-such-command"])
    assert exc.value.code == 2 and "invalid choice: 'no-such-command'" in err.getvalue()


@pytest.mark.parametrize("argv,expected", [
    (["run", "--workload", "lm-heldout", "--variant", "npumoe", "--platform", "cpu", "--samples", "3"],
     {"variants": "npumoe", "platforms": "cpu", "n_samples": 3, "out": "results/run"}),
    (["run", "--workload", "lm-heldout", "--variants", "npumoe", "--platforms", "cpu", "--n-samples", "3"],
     {"variants": "npumoe", "platforms": "cpu", "n_samples": 3}),
    (["simulate", "--variant", "npumoe", "--platform", "m2-ultra"], {"variants": "npumoe", "platforms": "m2-ultra"}),
    (["calibrate", "--model", "tiny", "--calib-tokens", "512", "--calib-workload", "drama"],
     {"tokens": 512, "workload": "drama", "out": "results/profile"}),
    (["calibrate", "--model", "tiny", "--tokens", "512"], {"tokens": 512}),
])
def test_one_name_per_concept_with_the_old_names_as_aliases(argv, expected):
    """The CLI's names are the API's and the sweep YAML's (variants, platforms, n_samples, calib_tokens); the
    earlier spellings still parse to the same value."""
    args = cli.build_parser(argv).parse_args(argv)
    assert {k: getattr(args, k) for k in expected} == expected
