"""figcheck's overlap rule: a text or legend inside a panel must not cover data (bars, whiskers, points, data
lines). Reference: hand-built figures with a known overlap, among them the ablation's old label placement (a
step's "drop x %" written inside its bar, at its foot, when it did not fit beyond the bar's end)."""
from matplotlib.figure import Figure

from npumoe_lab.viz.figcheck import audit_figure


def _panel():
    fig = Figure(figsize=(4, 3))
    ax = fig.add_axes([0.08, 0.08, 0.9, 0.8])
    fig.suptitle("a figure")
    return fig, ax


def test_the_old_ablation_label_placement_fails():
    fig, ax = _panel()
    ax.barh([0, 1, 2, 3], [1.0, 1.04, 4.74, 11.26], height=0.7)
    ax.set_xlim(0, 11.8)
    # the old rule: a label that does not fit right of its bar goes inside it, at the bar's foot
    ax.text(0.3, 3, "drop 3.7%", va="center", ha="left", fontsize=5)
    problems = audit_figure(fig)
    assert problems == ["text 'drop 3.7%' covers a bar in panel ''"]


def test_a_label_beyond_the_bar_passes():
    fig, ax = _panel()
    ax.barh([0, 1], [1.0, 2.0], height=0.7)
    ax.set_xlim(0, 4)
    ax.text(2.2, 1, "drop 3.7%", va="center", ha="left", fontsize=5)
    assert audit_figure(fig) == []


def test_a_legend_over_whiskers_fails_and_one_beside_them_passes():
    fig, ax = _panel()
    ax.errorbar([1.0, 2.0, 3.0], [0, 1, 2], xerr=[[0.5, 0.5, 0.5], [2.0, 2.0, 2.0]], fmt="none")
    ax.plot([1.0], [0], "o", label="a point")
    ax.set_xlim(0, 6)
    ax.legend(loc="center")
    assert any("the legend covers a whisker" in p for p in audit_figure(fig))
    fig2, ax2 = _panel()
    ax2.errorbar([1.0], [0], xerr=[[0.5], [0.5]], fmt="none")
    ax2.plot([1.0], [0], "o", label="a point")
    ax2.set_xlim(0, 6)
    ax2.set_ylim(-1, 3)
    ax2.legend(loc="upper right")
    assert audit_figure(fig2) == []


def test_a_text_over_a_point_fails_but_reference_lines_do_not_count():
    fig, ax = _panel()
    ax.plot([2.0], [2.0], "o")
    ax.axvline(1.0)                                   # a guide across the panel is not data
    ax.set_xlim(0, 4)
    ax.set_ylim(0, 4)
    ax.text(1.0, 0.5, "guide note", fontsize=6)
    assert audit_figure(fig) == []
    ax.text(2.0, 2.0, "on the point", fontsize=6, ha="center", va="center")
    assert audit_figure(fig) == ["text 'on the point' covers a point in panel ''"]
