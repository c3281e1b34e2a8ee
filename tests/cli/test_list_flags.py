"""One command line: list-valued flags take comma lists in every command that has them (one cell of rows per
combination), and every command checks its inputs before a model loads."""
import pandas as pd
import pytest

from npumoe_lab import cli
from npumoe_lab.cli.common import cells, int_list
from npumoe_lab.errors import NpuMoeError
from npumoe_lab.results.store import load_results


def _no_model_load(monkeypatch):
    """Any model load fails the test: the checks must come first."""
    def refuse(*a, **k):
        raise AssertionError("a model was loaded before the inputs were checked")
    import npumoe_lab.experiments.runner as runner
    import npumoe_lab.models.loading as loading
    monkeypatch.setattr(loading, "load_model", refuse)
    monkeypatch.setattr(runner, "load_model", refuse)
    monkeypatch.setattr(runner, "run_experiment", refuse)


def test_int_list_and_cells():
    assert int_list("256,512", "--prompt-len") == [256, 512] and int_list(128, "--chunk") == [128]
    assert cells(a=[1, 2], b=["x", "y"]) == [{"a": 1, "b": "x"}, {"a": 1, "b": "y"}, {"a": 2, "b": "x"},
                                            {"a": 2, "b": "y"}]
    with pytest.raises(NpuMoeError, match=r"--chunk 0 must be an integer >= 1 \(in --chunk 128,0\)"):
        int_list("128,0", "--chunk")


@pytest.mark.parametrize("argv, flag", [(["--n-samples", "0"], "--n-samples"), (["--chunk", "0"], "--chunk"),
                                        (["--chunk", "128,0"], "--chunk"), (["--prompt-len", "2x"], "--prompt-len"),
                                        (["--repeats", "0"], "--repeats"),
                                        (["--prompt-len", "100,512", "--chunk", "128"], "larger than the prompt")])
def test_run_checks_its_inputs_before_any_model_load(argv, flag, monkeypatch, capsys, tmp_path):
    _no_model_load(monkeypatch)
    rc = cli.main(["run", "--workload", "lm-heldout", *argv, "--out", str(tmp_path / "r")])
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert rc == 2 and len(err) == 1 and flag in err[0], err
    assert not (tmp_path / "r").exists()


def test_run_refuses_a_corrupt_plan_before_any_model_load(monkeypatch, capsys, tmp_path):
    _no_model_load(monkeypatch)
    bad = tmp_path / "plan.json"
    bad.write_text('{"layers": [')
    rc = cli.main(["run", "--workload", "lm-heldout", "--plan", str(bad), "--out", str(tmp_path / "r")])
    err = capsys.readouterr().err
    assert rc == 2 and "not valid JSON" in err and str(bad) in err


def test_run_prompt_len_and_chunk_lists_write_one_cell_per_combination(monkeypatch, capsys, tmp_path):
    """`run --prompt-len 256,512 --chunk 128,256` -> 4 cells of rows, the model loaded once for all of them."""
    import npumoe_lab.cli.run as run_cli
    import npumoe_lab.experiments.runner as runner
    loads, calls = [], []
    monkeypatch.setattr(run_cli, "_loaded", lambda name, dtype: loads.append(name) or ("model", "tok"))

    def fake_run(model, workload, prompt_len, chunk, variants, platforms, **kw):
        calls.append((model, workload, prompt_len, chunk))
        return pd.DataFrame([{"model": kw["model_name"], "workload": workload, "variant": v, "platform": "m2-max",
                              "prompt_len": prompt_len, "chunk": chunk, "repeat": 0, "ttft_s": t,
                              "timing_source": "modeled", "energy_source": "modeled", "cycles_source": "modeled"}
                             for v, t in (("cpu-only", 0.2), ("npumoe", 0.1))])
    monkeypatch.setattr(runner, "run_experiment", fake_run)
    out = tmp_path / "r"
    rc = cli.main(["run", "--workload", "lm-heldout", "--prompt-len", "256,512", "--chunk", "128,256",
                   "--platforms", "m2-max", "--variants", "cpu-only,npumoe", "--out", str(out)])
    assert rc == 0 and loads == ["tiny"]
    assert [c[2:] for c in calls] == [(256, 128), (256, 256), (512, 128), (512, 256)]
    assert all(c[0] == ("model", "tok") for c in calls)
    df = load_results(out)
    assert sorted(df.groupby(["prompt_len", "chunk"]).size().items()) == \
        [((256, 128), 2), ((256, 256), 2), ((512, 128), 2), ((512, 256), 2)]
    assert capsys.readouterr().out.count("prompt_len 512, chunk 256") == 1


def test_a_busy_host_gets_one_line_and_fewer_threads_for_every_variant(monkeypatch, capsys, tmp_path):
    """Other processes spinning on every core: `run --platform cpu` says what it did in one line and runs every
    cell with fewer torch threads than it would have (recorded per row as torch_threads by the runner)."""
    import os
    import subprocess
    import sys
    import torch
    import npumoe_lab.cli.run as run_cli
    import npumoe_lab.experiments.runner as runner
    if (os.cpu_count() or 1) < 2:
        pytest.skip("one core: nothing to give back")
    previous = torch.get_num_threads()          # the suite runs one thread (conftest); a run starts with two
    torch.set_num_threads(2)
    seen = []

    def fake_run(model, workload, prompt_len, chunk, variants, platforms, threads=None, **kw):
        seen.append(threads)
        return pd.DataFrame([{"model": "tiny", "workload": workload, "variant": "cpu-only", "platform": "cpu",
                              "prompt_len": prompt_len, "chunk": chunk, "repeat": 0, "ttft_s": 0.1,
                              "timing_source": "measured", "energy_source": "modeled", "cycles_source": "modeled"}])
    monkeypatch.setattr(runner, "run_experiment", fake_run)
    monkeypatch.setattr(run_cli, "_loaded", lambda name, dtype: ("model", "tok"))
    spinners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(os.cpu_count() or 2)]
    try:
        rc = cli.main(["run", "--workload", "lm-heldout", "--platforms", "cpu", "--variants", "cpu-only",
                       "--prompt-len", "256", "--chunk", "128,256", "--out", str(tmp_path / "r")])
    finally:
        for p in spinners:
            p.kill()
            p.wait()
        torch.set_num_threads(previous)
    out = capsys.readouterr().out
    lines = [line for line in out.splitlines() if line.startswith("host busy:")]
    assert rc == 0 and len(lines) == 1 and "--threads 1" in lines[0], out
    assert seen == [1, 1]


def test_given_threads_are_kept_and_modeled_runs_are_not_probed(monkeypatch):
    import argparse
    import npumoe_lab.cli.run as run_cli
    assert run_cli.contended_threads(argparse.Namespace(threads=3, platforms="cpu")) == 3
    import npumoe_lab.devices.hostload as hostload
    monkeypatch.setattr(hostload, "others_cores", lambda: pytest.fail("a modeled run probed the host"))
    assert run_cli.contended_threads(argparse.Namespace(threads=None, platforms="m2-max")) is None
    assert run_cli.contended_threads(argparse.Namespace(threads=2, platforms="m2-max")) == 2


def test_the_cache_is_per_checkout_unless_npumoe_cache_says_otherwise(monkeypatch, tmp_path):
    from npumoe_lab.utils import REPO_ROOT, cache_dir
    monkeypatch.delenv("NPUMOE_CACHE_DIR", raising=False)
    monkeypatch.delenv("NPUMOE_CACHE", raising=False)
    assert cache_dir() == REPO_ROOT / ".cache" / "npumoe-lab"
    monkeypatch.setenv("NPUMOE_CACHE", str(tmp_path))
    assert cache_dir() == tmp_path


def test_measure_coreml_off_macos_refuses_before_importing_torch(tmp_path):
    import subprocess
    import sys
    if sys.platform == "darwin":
        pytest.skip("a Mac runs Core ML")
    code = ("import sys\nfrom npumoe_lab import cli\nrc = cli.main(['measure', '--device', 'coreml', '--out', "
            f"{str(tmp_path / 'm')!r}])\nprint(rc, 'torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.stdout.split() == ["2", "False"] and "needs macOS" in out.stderr, (out.stdout, out.stderr)


def test_accuracy_rows_load_with_load_results(monkeypatch, tmp_path):
    """accuracy writes its curve rows as result rows too (load_results reads no curve.csv)."""
    import npumoe_lab.studies.accuracy_curve as curve
    import npumoe_lab.studies.accuracy_verdict as verdict
    rows = pd.DataFrame([dict(model="tiny", workload="lm-next", variant="npumoe-tg", platform="m2-max",
                              prompt_len=256, chunk=256, saliency="weight", percentile=p, drop_rate=d, ttft_s=0.01,
                              timing_source="modeled", accuracy_delta=-d) for p, d in ((90, 0.02), (100, 0.0))])
    monkeypatch.setattr(curve, "run_curve", lambda out, **kw: (rows, pd.DataFrame()))
    monkeypatch.setattr(verdict, "verdict", lambda r, s: None)
    monkeypatch.setattr(verdict, "verdict_lines", lambda v, r: ["verdict"])
    assert cli.main(["accuracy", "--out", str(tmp_path / "acc")]) == 0
    got = load_results(tmp_path / "acc")
    assert sorted(got["percentile"]) == [90, 100] and set(got["variant"]) == {"npumoe-tg"}


def test_simulate_prints_a_summary_with_intervals_not_every_row(tmp_path, capsys):
    rc = cli.main(["simulate", "--geometry", "phi-tiny-moe", "--prompt-len", "512,1024", "--chunk", "128,256",
                   "--draws", "20", "--out", str(tmp_path / "s")])
    out = capsys.readouterr().out
    df = load_results(tmp_path / "s")
    assert rc == 0 and len(df) > 20 and df.groupby(["prompt_len", "chunk"]).ngroups == 4
    table = out.split("\n\n")[0].splitlines()
    assert len(table) == 1 + 1 + 4 and "90 % interval" in table[0]     # title, header, one line per cell
    r = df[(df.variant == "npumoe") & (df.prompt_len == 512) & (df.chunk == 128)].iloc[0]
    assert f"{r.ttft_s:.3g} [{r.ttft_s_lo:.3g}-{r.ttft_s_hi:.3g}]" in out


def test_terminal_text_wraps_prose_and_keeps_tables_and_words():
    from npumoe_lab.cli.common import terminal_text
    text = "# " + "heading " * 30 + "\n\n- " + "word " * 80 + "\n| a | b |\n|---|---|\n| " + "x" * 200 + " |"
    out = terminal_text(text)
    assert " ".join(out.split()) == " ".join(text.split())
    assert all(len(line) <= 118 for line in out.splitlines() if not line.startswith("|"))
    assert "| " + "x" * 200 + " |" in out.splitlines()


@pytest.mark.parametrize("command, module, handler, extra", [
    ("drift", "drift", "_drift", []), ("tune", "tune", "_tune", ["--budget-drop", "0.05"]),
    ("sensitivity", "sensitivity", "_sensitivity", []), ("accuracy", "accuracy", "_accuracy", [])])
def test_every_command_with_the_flags_takes_the_same_lists(command, module, handler, extra, monkeypatch, tmp_path):
    """`--prompt-len 512,1024 --chunk 128,256` (and --platforms a,b where the command has it) runs one cell per
    combination, each under its own --out subfolder."""
    import importlib
    mod = importlib.import_module(f"npumoe_lab.cli.{module}")
    seen = []
    monkeypatch.setattr(mod, handler, lambda a: seen.append((a.prompt_len, a.chunk, getattr(a, "platform", None),
                                                             a.out)) or 0)
    plats = ["--platforms", "m2-max,m4-max"] if command != "sensitivity" else []
    rc = cli.main([command, *extra, "--prompt-len", "512,1024", "--chunk", "128,256", *plats,
                   "--out", str(tmp_path / "o")])
    n_plat = 2 if plats else 1
    assert rc == 0 and len(seen) == 4 * n_plat
    assert {(p, c) for p, c, _, _ in seen} == {(512, 128), (512, 256), (1024, 128), (1024, 256)}
    assert len({o for *_, o in seen}) == len(seen) and all(o.startswith(str(tmp_path / "o")) for *_, o in seen)


def test_commands_without_lists_say_why():
    """The flags stay single where a command makes one artifact from one choice; everything else takes lists."""
    single = {"calibrate": "one calibration profile per run", "plan": "one plan file",
              "convert": "the graphs of one plan", "fit-device": "one platform's fit",
              "validate-device": "one platform's validation"}
    for command in cli.SUBCOMMANDS:
        parser = cli.build_parser([command])
        sub = next(a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction")
        for action in sub.choices[command]._actions:
            names = set(action.option_strings) & {"--prompt-len", "--chunk", "--variants", "--variant",
                                                  "--platforms", "--platform", "--workload"}
            if names and command not in single:
                assert "comma list" in (action.help or ""), (command, names, action.help)


def test_convert_writes_only_under_out(tmp_path, monkeypatch):
    from tests.graphs.test_graphs import tiny_plan
    from tests.model_zoo import tiny_model
    from npumoe_lab.utils import REPO_ROOT
    monkeypatch.delenv("NPUMOE_GRAPH_CACHE", raising=False)
    model = tiny_model("qwen3_moe")
    model.save_pretrained(tmp_path / "model")
    plan_path = tiny_plan(model).save(tmp_path / "plan.json")
    before = sorted(p.name for p in REPO_ROOT.iterdir())
    monkeypatch.chdir(tmp_path / "model")           # nothing lands in the working folder either
    assert cli.main(["convert", "--plan", str(plan_path), "--target", "onnx", "--out", str(tmp_path / "out"),
                     "--model", str(tmp_path / "model"), "--context", "32", "--no-attention"]) == 0
    assert sorted(p.name for p in REPO_ROOT.iterdir()) == before
    assert (tmp_path / "out" / ".graph-cache").is_dir() and (tmp_path / "out" / "manifest.json").is_file()
    assert not [p for p in (tmp_path / "model").iterdir() if p.name not in ("config.json", "model.safetensors",
                                                                           "generation_config.json")]
