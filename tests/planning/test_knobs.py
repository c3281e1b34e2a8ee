"""Plan knobs defined once: PlanKnobs validates, and the `plan`, `run` and `simulate` flags come from it."""
import argparse
from dataclasses import fields

import pytest

from npumoe_lab import cli
from npumoe_lab.errors import NpuMoeError
from npumoe_lab.cli.knob_flags import add_knob_arguments, knobs_from_args
from npumoe_lab.planning.knobs import PlanKnobs


def test_every_knob_is_a_flag_of_plan_run_and_simulate():
    for command in ("plan", "run", "simulate"):
        sub = next(a for a in cli.build_parser([command])._actions if isinstance(a, argparse._SubParsersAction))
        dests = {a.dest for a in sub.choices[command]._actions}
        assert set(PlanKnobs.names()) <= dests, command


def test_flags_parse_to_the_knobs_given_and_defaults_come_from_the_dataclass():
    p = argparse.ArgumentParser()
    add_knob_arguments(p, with_defaults=False)
    given = knobs_from_args(p.parse_args(["--group-size", "4", "--multipliers", "4,2,1", "--renormalize",
                                          "--npu-memory-budget", "1000"]))
    assert given == {"group_size": 4, "multipliers": (4.0, 2.0, 1.0), "renormalize": True,
                     "npu_memory_budget_bytes": 1000}
    q = argparse.ArgumentParser()
    add_knob_arguments(q)
    defaults = vars(q.parse_args([]))
    for f in fields(PlanKnobs):      # a switch not given is None: the dataclass default (False) then applies
        assert defaults[f.name] == (None if f.default is False else f.default), f.name


@pytest.mark.parametrize("kw,message", [({"tiers": 0}, "tiers=0 must be a number >= 1"),
                                        ({"percentile": 120}, r"percentile=120 must be in \(0, 100\]"),
                                        ({"residency": "hot"}, "residency='hot' is not one of threshold"),
                                        ({"group_size": None}, "group_size cannot be None")])
def test_bad_knobs_name_what_is_wrong(kw, message):
    with pytest.raises(NpuMoeError, match=message):
        PlanKnobs(**kw)


def test_unknown_knob_lists_the_valid_ones():
    with pytest.raises(NpuMoeError, match=r"unknown plan knob\(s\) \['grup_size'\]; valid: tiers, percentile"):
        PlanKnobs.check_names({"grup_size": 4})


def test_every_command_has_a_one_line_summary_for_the_fast_help():
    """The top-level --help lists commands without importing them: each needs its line in cli.SUMMARIES."""
    assert sorted(cli.SUBCOMMANDS) == sorted(cli.SUMMARIES)


def test_knob_notebooks_take_their_run_arguments_from_their_parameters_cell():
    from npumoe_lab.experiments import notebook_helpers as nb
    with pytest.raises(NpuMoeError, match=r"parameters cell lacks \['workload', 'variants'"):
        nb.knob_sweep({"model": "tiny"}, "tiers", [1])
    for name in ("02_static_tiers", "03_grouping", "04_residency"):   # each declares them all
        text = (cli.__file__.rsplit("/npumoe_lab/", 1)[0] + f"/notebooks/{name}.py")
        cell = open(text).read().split('# %% tags=["parameters"]')[1].split("# %%")[0]
        assert all(f"\n{p} = " in cell for p in nb.RUN_PARAMETERS), name
