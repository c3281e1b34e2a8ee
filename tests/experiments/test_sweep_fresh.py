"""`sweep --fresh` (and `demo --fresh`, which passes it on): a re-run re-measures every done cell that times a
measured platform, instead of silently reusing rows taken on a busy host; modeled-only cells are kept. Without it
the reuse is said in one line."""
import pytest

from npumoe_lab import cli
from npumoe_lab.experiments.sweep import run_sweep
from npumoe_lab.results.store import load_results

# the "host" is busy while the flag file exists: the row records it as a measured run would (host_busy)
NOTEBOOK = '''# %% tags=["parameters"]
platforms = "m2-max"
flag = ""
out_dir = None

# %%
import pathlib
from npumoe_lab.experiments import write_rows
busy = pathlib.Path(flag).exists()
write_rows([dict(model="fixture", workload="w", variant="v", platform=platforms, prompt_len=8, chunk=8, repeat=0,
                 ttft_s=2.0 if busy else 0.1, host_busy=busy and platforms == "cpu",
                 timing_source="measured" if platforms == "cpu" else "modeled")], out_dir)
'''


@pytest.mark.slow
def test_fresh_remeasures_measured_cells_and_keeps_modeled_ones(tmp_path, capfd):
    flag = tmp_path / "busy"
    flag.write_text("")
    (tmp_path / "nb.py").write_text(NOTEBOOK)
    spec = tmp_path / "s.yaml"
    spec.write_text(f"notebook: nb.py\nparameters:\n  flag: {flag}\ngrid:\n  platforms: [cpu, m2-max]\n")
    out = tmp_path / "out"
    first = run_sweep(spec, out, warm=False)
    assert first.ok and len(first.done) == 2
    assert load_results(out).set_index("platform").host_busy.to_dict() == {"cpu": True, "m2-max": False}

    flag.unlink()                                                   # the host is quiet now
    capfd.readouterr()
    again = run_sweep(spec, out, warm=False)                        # resume: reuses, and says so
    assert len(again.skipped) == 2 and not again.done
    assert "1 of the 2 cells already done hold measured rows flagged host_busy" in capfd.readouterr().err
    assert bool(load_results(out).set_index("platform").host_busy["cpu"])

    fresh = run_sweep(spec, out, warm=False, fresh=True)
    assert [c.params["platforms"] for c in fresh.done] == ["cpu"] and fresh.remeasured == 1
    assert [c.params["platforms"] for c in fresh.skipped] == ["m2-max"]
    assert "1 re-measured" in fresh.summary()
    df = load_results(out)
    assert len(df) == 2, "the busy attempt is archived, not loaded beside the new rows"
    row = df.set_index("platform").loc["cpu"]
    assert not bool(row.host_busy) and row.ttft_s == pytest.approx(0.1)
    cpu_cell = fresh.done[0].dir
    assert (cpu_cell / "_attempts" / "001" / "DONE.json").exists()


def test_fresh_is_a_flag_of_sweep_and_demo():
    args = cli.build_parser(["sweep", "s.yaml", "--out", "o", "--fresh"]).parse_args(["sweep", "s.yaml", "--out",
                                                                                     "o", "--fresh"])
    assert args.fresh
    args = cli.build_parser(["demo", "--fresh"]).parse_args(["demo", "--fresh"])
    assert args.fresh and cli.build_parser(["demo"]).parse_args(["demo"]).fresh is False
