"""The TTFT-vs-drop figure on hand-made rows: the paper's band, one line per baseline and platform, npumoe's curve
through its points in drop order, and a legible figure (figcheck)."""
import numpy as np
import pandas as pd

from npumoe_lab.viz.drop_curve import plot_ttft_vs_drop
from npumoe_lab.viz.figcheck import audit_figure


def _rows():
    rows = []
    for plat, scale in (("m2-max", 1.0), ("m2-ultra", 0.6)):
        for v, t, d, ok in (("cpu-only", 2.0, 0.0, True), ("anemll", 1.5, 0.0, True), ("naive-npu", 9.0, 0.02, False)):
            rows.append(dict(model="m", platform=plat, variant=v, ttft_s=t * scale, drop_rate=d, feasible=ok,
                             sweep_percentile=np.nan, timing_source="modeled", prompt_len=1024, chunk=512,
                             routing_source="synthetic:gini=0.6"))
        for p, d, t in ((90, 0.01, 1.2), (50, 0.12, 1.0), (10, 0.30, 0.9)):
            rows.append(dict(model="m", platform=plat, variant="npumoe", ttft_s=t * scale, drop_rate=d, feasible=True,
                             sweep_percentile=float(p), timing_source="modeled", prompt_len=1024, chunk=512,
                             routing_source="synthetic:gini=0.6"))
    return pd.DataFrame(rows)


def test_band_baselines_and_the_curve():
    fig = plot_ttft_vs_drop(_rows())
    (ax,) = fig.axes
    band = [p for p in ax.patches if p.get_label() == "paper's drop band"]
    assert len(band) == 1
    x0, x1 = band[0].get_x(), band[0].get_x() + band[0].get_width()
    assert (x0, x1) == (10.0, 22.0)
    flat = [ln for ln in ax.lines if len(set(ln.get_ydata())) == 1 and len(ln.get_xdata()) == 2]
    assert sorted(round(ln.get_ydata()[0], 3) for ln in flat) == sorted([2.0, 1.5, 9.0, 1.2, 0.9, 5.4])
    curve = next(ln for ln in ax.lines if ln.get_label() == "npumoe, m2-max")
    assert list(curve.get_xdata()) == [1.0, 12.0, 30.0] and list(curve.get_ydata()) == [1.2, 1.0, 0.9]
    assert ax.get_yscale() == "log"              # naive-npu is 10x above the rest
    assert audit_figure(fig) == []
