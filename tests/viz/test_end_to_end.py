"""The stacked e2e figure: per variant prefill + decode bars summing to e2e_s, the policy in the title."""
import matplotlib
import pytest

matplotlib.use("Agg")

from npumoe_lab.errors import NpuMoeError  # noqa: E402
from npumoe_lab.sim.run import simulate  # noqa: E402
from npumoe_lab.viz.end_to_end import plot_e2e  # noqa: E402


def test_stacked_bars_sum_to_e2e_and_title_names_the_policy():
    df = simulate(geometry="phi-tiny-moe", variants="cpu-only,npumoe", prompt_len=512, chunk=256,
                  decode_tokens=4, decode_policy="npu-decode")
    fig = plot_e2e(df)
    ax = fig.axes[0]
    assert "policy npu-decode" in ax.get_title() and "4 decode tokens" in ax.get_title()
    bars = ax.patches
    n = len(df)
    ends = sorted(b.get_x() + b.get_width() for b in bars[n:])
    assert ends == pytest.approx(sorted(df.e2e_s))
    with pytest.raises(NpuMoeError, match="--decode-tokens"):
        plot_e2e(df.drop(columns=["e2e_s"]))
