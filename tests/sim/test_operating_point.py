"""The paper operating point (sim/operating_point.py) and the feasibility columns of simulated rows."""
from types import SimpleNamespace

import numpy as np
import pytest

from npumoe_lab import cli
from npumoe_lab.errors import NpuMoeError
from npumoe_lab.sim.operating_point import PAPER_DROP_BAND, bisect_percentile, plan_drop_rate
from npumoe_lab.sim.run import simulate


def test_bisection_finds_the_hand_computed_percentile():
    # drop(p) = (100 - p) / 200 falls with p; 16 % at p = 68 exactly
    p = bisect_percentile(lambda q: (100 - q) / 200, 0.16)
    assert abs(p - 68) < 0.5
    assert bisect_percentile(lambda q: 0.05, 0.16) == 0.5       # never reaches: the lowest percentile is closest
    assert bisect_percentile(lambda q: 0.5, 0.16) == 100.0


def test_plan_drop_rate_by_hand():
    """Two experts of capacity 8 and 16, routed 10 and 4 in one chunk, 12 and 20 in another: the first drops 2 + 4
    of the 46 routed when both are resident, none when it runs on the CPU (cold experts drop nothing)."""
    lp = {"layer": 0, "n_experts": 2, "capacity": [8, 16]}
    real = np.array([[[10, 4]], [[12, 20]]])        # [chunks, layers, experts]
    for resident, want in (([True, True], (2 + 4 + 4) / 46), ([False, True], 4 / 46), ([False, False], 0.0)):
        plan = SimpleNamespace(layer_plan=lambda layer: lp, resident_mask=lambda layer, r=resident: np.array(r))
        assert plan_drop_rate(plan, real, [0]) == pytest.approx(want)


def test_the_paper_point_lands_in_the_band_and_rows_say_it():
    kw = dict(geometry="phi-tiny-moe", platforms="m2-max", variants="npumoe,npumoe-spill,anemll",
              prompt_len=1024, chunk=512, draws=0)
    default = simulate(**kw).set_index("variant")
    paper = simulate(**kw, operating_point="paper").set_index("variant")
    lo, hi = PAPER_DROP_BAND
    assert default.at["npumoe", "drop_rate"] < lo                       # the shipped knobs drop far less
    r = paper.loc["npumoe"]
    assert lo <= r.drop_rate <= hi and r.op_in_band
    assert r.drop_rate == pytest.approx(r.op_drop_rate)                # the solve's accounting = the stream's
    assert r.percentile < 90 and paper.at["npumoe-spill", "percentile"] == r.percentile
    assert (paper.operating_point == "paper").all() and (default.operating_point == "default").all()
    assert paper.at["npumoe-spill", "drop_rate"] == 0


def test_an_unreachable_band_is_one_line_exit_2(capsys, tmp_path):
    # one program: the attention graphs take it, no group stays resident, npumoe drops nothing at any percentile
    with pytest.raises(NpuMoeError, match="no percentile puts npumoe's drop in 10%-22%: the closest is 0.0%"):
        simulate("phi-tiny-moe", platforms="m2-max[npu_max_resident_programs=1]", variants="npumoe",
                 draws=0, operating_point="paper")
    rc = cli.main(["simulate", "--geometry", "phi-tiny-moe", "--platforms", "m2-max[npu_max_resident_programs=1]",
                   "--variants", "npumoe", "--draws", "0", "--operating-point", "paper", "--out", str(tmp_path / "o")])
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert rc == 2 and len(err) == 1 and "the closest is" in err[0]
    assert not (tmp_path / "o").exists()


def test_forced_plans_over_the_budget_are_rows_that_say_infeasible():
    df = simulate("phi-tiny-moe", platforms="m2-max", variants="npumoe,npumoe-tg,naive-npu", draws=0)
    off = simulate("phi-tiny-moe", platforms="m2-max", variants="npumoe", draws=0, npu_program_budget="off")
    r = df.set_index("variant")
    assert r.at["npumoe", "feasible"] and r.at["npumoe", "infeasible_reason"] == ""
    assert r.at["npumoe", "npu_programs"] <= 119
    for v in ("npumoe-tg", "naive-npu"):          # all resident by definition: priced, and said infeasible
        assert not r.at[v, "feasible"]
        assert r.at[v, "infeasible_reason"].startswith(f"infeasible: resident programs {r.at[v, 'npu_programs']} >")
    o = off.iloc[0]
    assert o.npu_program_budget_used == "off" and o.n_npu_groups >= r.at["npumoe", "n_npu_groups"]
    assert o.feasible == (o.npu_programs <= 119)


def test_the_cli_lists_the_operating_points_of_the_simulation():
    from npumoe_lab.cli.operating_point import OPERATING_POINTS as CLI_POINTS
    from npumoe_lab.sim.operating_point import OPERATING_POINTS
    assert CLI_POINTS == OPERATING_POINTS


def test_paper_check_at_both_points_writes_the_chosen_percentiles():
    from npumoe_lab.sim.operating_point import both_points_markdown, chosen_percentiles
    from npumoe_lab.sim.papercheck import paper_check
    grid = dict(geometry="phi-tiny-moe", platforms="m2-max", prompt_len="1024", chunk="512")
    tables, grids = {}, {}
    for op in ("default", "paper"):
        tables[op], _, grids[op] = paper_check(sensitivity=False, grid=grid, draws=5, operating_point=op)
    cp = chosen_percentiles(grids["paper"])
    assert len(cp) == 1 and cp.in_band.iloc[0]
    paper = tables["paper"].set_index("quantity")
    lo, hi = PAPER_DROP_BAND
    assert lo * 100 <= paper.at["npumoe drop rate, lowest (%)", "modeled"] <= hi * 100
    assert tables["default"].set_index("quantity").at["npumoe drop rate, highest (%)", "modeled"] < lo * 100
    text = both_points_markdown(tables, grids)
    assert "| phi-tiny-moe | m2-max | 512 |" in text and "default: P(holds)" in text
