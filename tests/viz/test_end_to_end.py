"""The stacked e2e figure: per variant prefill + decode bars summing to e2e_s, the policy in the title."""
import matplotlib
import pytest

matplotlib.use("Agg")

from npumoe_lab.errors import NpuMoeError  # noqa: E402
from npumoe_lab.sim.run import simulate  # noqa: E402
from npumoe_lab.viz.figcheck import audit_figure  # noqa: E402
from npumoe_lab.viz.end_to_end import interval_note, plot_e2e, points_outside  # noqa: E402


def test_stacked_bars_sum_to_e2e_and_title_names_the_policy():
    df = simulate(geometry="phi-tiny-moe", variants="cpu-only,npumoe", prompt_len=512, chunk=256,
                  decode_tokens=4, decode_policy="npu-decode")
    fig = plot_e2e(df)
    ax = fig.axes[0]
    title = ax.get_title().replace("\n", " ")
    assert "policy npu-decode" in title and "4 decode tokens" in title
    bars = ax.patches
    n = len(df)
    ends = sorted(b.get_x() + b.get_width() for b in bars[n:])
    assert ends == pytest.approx(sorted(df.e2e_s))
    with pytest.raises(NpuMoeError, match="--decode-tokens"):
        plot_e2e(df.drop(columns=["e2e_s"]))


@pytest.mark.parametrize("policy", ["pipeline", "cpu", "npu-decode"])
def test_every_point_lies_inside_its_own_interval(policy):
    """The handbook's rule for modeled numbers, on every interval column of the rows (TTFT, e2e, tpot, energy,
    cycles), every variant; the figure's caption says it and why the whisker sits above the bar."""
    df = simulate(geometry="phi-tiny-moe", platforms="m2-max,m2-ultra", variants="all", prompt_len=512, chunk=256,
                  decode_policy=policy, draws=100)
    cols = [c[:-3] for c in df.columns if c.endswith("_lo") and c[:-3] in df.columns]
    assert {"ttft_s", "e2e_s", "tpot_s", "energy_e2e_mj", "cpu_cycles_e2e"} <= set(cols)
    for c in cols:
        assert points_outside(df, c).empty, (c, points_outside(df, c)[["variant", "platform", c, f"{c}_lo"]])
    assert (df.e2e_s_hi / df.e2e_s > df.e2e_s / df.e2e_s_lo).mean() > 0.5     # mostly above: what the caption says
    fig = plot_e2e(df)
    caption = " ".join(t.get_text() for t in fig.texts).replace("\n", " ")
    assert "Every point lies inside its own interval" in caption and "reaches further above" in caption
    assert audit_figure(fig) == []              # legible: titled, sourced, legend and caption off the bars


def test_a_point_outside_its_interval_is_said():
    df = simulate(geometry="phi-tiny-moe", variants="cpu-only,npumoe", prompt_len=512, chunk=256, draws=20)
    bad = df.assign(e2e_s_lo=df.e2e_s * 1.1)
    assert list(points_outside(bad).variant) == ["cpu-only", "npumoe"]
    assert "2 row(s) have their point OUTSIDE" in interval_note(bad)
    assert interval_note(df.drop(columns=["e2e_s_lo", "e2e_s_hi"])) == ""
