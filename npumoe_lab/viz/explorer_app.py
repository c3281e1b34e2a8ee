"""The explorer's widgets: knob controls, a metrics table and four figure panels in tabs.

A knob change re-evaluates the plan (explorer.PlanLab.evaluate: modeled, the prompt's op stream as arrays), rewrites
the metrics table and redraws the panel on screen (the baselines panel in place: its bars' data set, not a new
figure); the other panels are redrawn when their tab is opened (a figure costs more
than the evaluation itself). Figures are PNG bytes in ipywidgets Image widgets (no pyplot, no backend state). The
metrics table carries stable CSS classes (`npumoe-metrics`, `npumoe-ttft`) that tests and users can read.
"""
from __future__ import annotations

import html
import io
import time
from dataclasses import replace

import ipywidgets as W
import numpy as np
import pandas as pd

from npumoe_lab.devices import get_platform, list_platforms
from npumoe_lab.viz import figcheck
from npumoe_lab.viz.explorer import Knobs, PlanLab, summary_rows
from npumoe_lab.viz.plan import METRICS, SOURCE_GID, capacity_vs_load, group_map, metrics_vs_baselines
from npumoe_lab.viz.timeline import timeline
from npumoe_lab.planning.residency import RESIDENCY_MODES
from npumoe_lab.execution.timeline import to_frame

DPI = 100
GROUP_SIZES = (1, 2, 4, 8, 16, 32)


PANELS = ("baselines", "timeline", "capacity", "groups")
TITLES = ("vs baselines", "timeline (modeled)", "capacity vs load", "groups & residency")


def png(fig) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=DPI)
    return buf.getvalue()


class LayoutCache:
    """Constrained layout costs a second full draw. A panel keeps its shape while knobs move, so the axes
    positions solved on its first render are reused until its shape key (figure size, axes, lane/row labels)
    changes."""

    def __init__(self):
        self.positions = {}

    def png(self, name: str, fig) -> bytes:
        key = (name, tuple(fig.get_size_inches()),
               tuple(tuple(t.get_text() for t in ax.get_yticklabels()) for ax in fig.axes))
        if key in self.positions:
            fig.set_layout_engine("none")
            for ax, pos in zip(fig.axes, self.positions[key]):
                ax.set_position(pos)
            return png(fig)
        data = png(fig)
        self.positions[key] = [ax.get_position() for ax in fig.axes]
        return data


class BaselinesPanel:
    """The "vs baselines" figure kept between updates and redrawn by blitting: the axes, ticks and labels are drawn
    once into a background; a knob move sets the bars' widths and the value labels of the existing artists, restores
    the background and draws only those artists (no new figure, no layout, no tick text). A value past the axis
    range (or far inside it), or another set of configurations, draws the whole figure again."""

    def __init__(self):
        self.fig, self.names, self.canvas, self.background, self.limits = None, None, None, None, None

    def png(self, rows: pd.DataFrame, source: str) -> bytes:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        names = list(rows["configuration"])
        vals = [rows[col].to_numpy(dtype=float) * scale for col, _, scale, _ in METRICS]
        if self.fig is None or names != self.names or source != self.source:
            self.fig, self.names, self.source = metrics_vs_baselines(rows, source, width=9.0), names, source
            self.canvas = FigureCanvasAgg(self.fig)
            self.fig.canvas.draw()                                   # solves the constrained layout once
            self.fig.set_layout_engine("none")
            for ax in self.fig.axes:
                for a in self._dynamic(ax):
                    a.set_animated(True)
            self.background = None
        if self.background is not None and not all(_inside(v, lim) for v, lim in zip(vals, self.limits)):
            self.background = None
        i = names.index("this plan")
        for ax, v in zip(self.fig.axes, vals):
            for bar, x in zip(ax.patches, v):
                bar.set_width(x)
            for t in self._dynamic(ax)[len(ax.patches):]:
                t.set_position((v[i], i))
                t.set_text(f" {v[i]:.3g}")
            if self.background is None:
                ax.set_xlim(0, max(v.max(), 1e-12) * 1.35)
        if self.background is None:
            self.canvas.draw()                                       # axes without the animated artists
            self.background = self.canvas.copy_from_bbox(self.fig.bbox)
            self.limits = [ax.get_xlim()[1] for ax in self.fig.axes]
        else:
            self.canvas.restore_region(self.background)
        for ax in self.fig.axes:
            for a in self._dynamic(ax):
                ax.draw_artist(a)
        return _encode(self.canvas)

    @staticmethod
    def _dynamic(ax) -> list:
        """The bars and the current plan's value label (the source label stays in the background)."""
        return list(ax.patches) + [t for t in ax.texts if t.get_gid() != SOURCE_GID]


def _inside(values, limit) -> bool:
    top = max(float(values.max()), 1e-12) * 1.35
    return top <= limit and top >= 0.5 * limit


def _encode(canvas) -> bytes:
    """PNG bytes of an Agg canvas's pixels (fast zlib level: the panel changes on every knob move)."""
    from PIL import Image
    buf = io.BytesIO()
    Image.fromarray(np.asarray(canvas.buffer_rgba())[..., :3]).save(buf, format="png", compress_level=1)
    return buf.getvalue()


class Explorer(W.VBox):
    """explore(...)'s app. `.lab` (PlanLab), `.evaluation` (the latest), `.set(**knobs)` moves knobs in code."""

    def __init__(self, lab: PlanLab, knobs: Knobs, layer: int | None = None):
        self.lab, self.knobs = lab, knobs
        modeled = [p for p in list_platforms() if get_platform(p).kind != "measured"]
        spec = lab.specs[0]
        style, lay = {"description_width": "140px"}, W.Layout(width="390px")
        c = dict(continuous_update=False, style=style, layout=lay)
        self.controls = {
            "tiers": W.IntSlider(knobs.tiers, min=1, max=4, description="capacity tiers", **c),
            "percentile": W.FloatSlider(knobs.percentile, min=50, max=100, step=5, description="load percentile",
                                        **c),
            "group_size": W.SelectionSlider(options=[g for g in GROUP_SIZES if g <= spec.n_experts],
                                            value=knobs.group_size, description="group size", **c),
            "residency": W.Dropdown(options=RESIDENCY_MODES, value=knobs.residency, description="residency rule",
                                    style=style, layout=lay),
            "hot_scale": W.FloatSlider(knobs.hot_scale, min=0, max=4, step=0.25,
                                       description="hot threshold (×fair)", **c),
            "platform": W.Dropdown(options=modeled, value=knobs.platform, description="platform", style=style,
                                   layout=lay),
            "chunk": W.Dropdown(options=lab.chunk_options(), value=knobs.chunk, description="chunk (tokens)",
                                style=style, layout=lay),
        }
        self.controls["hot_scale"].tooltip = "hot threshold in units of one balanced expert's load (chunk·k/E)"
        layers = [s.layer for s in lab.specs]
        self.layer = W.Dropdown(options=layers, value=layer if layer in layers else layers[0],
                                description="layer (capacity tab)", style=style, layout=lay)
        self.metrics = W.HTML().add_class("npumoe-metrics")
        self.status = W.HTML().add_class("npumoe-status")
        # full notebook width: beside the sliders a 9-inch panel was squeezed to ~590 px (6 px text in JupyterLab)
        self.images = {k: W.Image(format="png", layout=W.Layout(width="100%", max_width=f"{int(9.0 * DPI)}px"))
                       .add_class(f"npumoe-{k}") for k in PANELS}
        self.tabs = W.Tab(children=[self.images[k] for k in PANELS], titles=TITLES)
        self._stale, self._layouts, self._baselines = set(PANELS), LayoutCache(), BaselinesPanel()
        self.real = W.Button(description="run real numerics", button_style="info", disabled=lab.model is None,
                             tooltip="prefill the prompt through this plan for real (weights, numerics)")
        self.real_out = W.HTML().add_class("npumoe-real")
        for w in self.controls.values():
            w.observe(self._on_knob, names="value")
        self.layer.observe(self._on_layer, names="value")
        self.tabs.observe(lambda _: self._draw_visible(), names="selected_index")
        self.real.on_click(self._on_real)
        left = W.VBox([W.HTML(f"<b>{html.escape(lab.name)}</b> · prompt {lab.prompt_len} tokens"),
                       *self.controls.values(), self.layer, self.real, self.real_out],
                      layout=W.Layout(width="410px", flex="0 0 auto"))    # the sliders keep their readouts
        right = W.VBox([self.metrics, self.tabs, self.status], layout=W.Layout(width="100%"))
        super().__init__([left, right])      # controls above, panels below at the notebook's full width
        self.evaluation = None
        self.update()

    # -- events ------------------------------------------------------------------------------------------------
    def set(self, **knobs):
        """Move knobs from code (the same path as the widgets)."""
        for k, v in knobs.items():
            self.controls[k].value = v

    def _on_knob(self, change):
        self.update()

    def _on_layer(self, change):
        t0 = time.perf_counter()
        self._stale.add("capacity")
        self.tabs.selected_index = PANELS.index("capacity")     # show what the layer picker changes
        self._draw_visible()
        self._status(time.perf_counter() - t0, "layer panel")

    def _on_real(self, _):
        self.real_out.value = "<i>running the plan on the weights...</i>"
        try:
            r = self.lab.real_prefill(self.knobs)
        except Exception as exc:   # noqa: BLE001 - shown in the app; the knobs stay usable
            self.real_out.value = f"<span style='color:#b00'>{html.escape(str(exc))}</span>"
            return
        self.real_out.value = (
            f"<div class='npumoe-real-result'>real numerics, timing {r['timing_source']} "
            f"(platform {html.escape(self.knobs.platform)}): TTFT {1e3 * r['ttft_s']:.3g} ms · drop "
            f"{100 * r['drop_rate']:.2f} % · top-1 agreement with the dropless reference {r['top1_agree']:.3f} · "
            f"KL {r['kl']:.2e} · took {r['wall_s']:.1f} s</div>")

    # -- one update ----------------------------------------------------------------------------------------
    def update(self):
        t0 = time.perf_counter()
        k = {name: w.value for name, w in self.controls.items()}
        self.knobs = replace(self.knobs, **k)
        self.controls["hot_scale"].disabled = self.knobs.residency != "threshold"   # only that rule reads it
        try:
            ev = self.lab.evaluate(self.knobs)
        except Exception as exc:   # noqa: BLE001 - e.g. a group over the platform's graph limit: say so, keep going
            self.metrics.value = f"<span style='color:#b00'>this setting has no plan: {html.escape(str(exc))}</span>"
            return
        self.evaluation, self._stale = ev, set(PANELS)
        self.metrics.value = _metrics_html(pd.DataFrame(summary_rows(ev)), self._source(), ev, self.lab.routing_label)
        self._draw_visible()
        self._status(time.perf_counter() - t0, f"plan + replay {ev.seconds:.2f} s")

    def _source(self) -> str:
        return f"modeled (platform {self.knobs.platform})"

    def _draw_visible(self):
        name = PANELS[self.tabs.selected_index or 0]
        if name not in self._stale or self.evaluation is None:
            return
        ev = self.evaluation
        if name == "baselines":
            self.images[name].value = self._baselines.png(pd.DataFrame(summary_rows(ev)), self._source())
            self._stale.discard(name)
            return
        elif name == "timeline":
            frame = to_frame(ev.result.events).assign(platform=self.knobs.platform)
            fig = timeline(frame, title="this plan", platform=self.knobs.platform, width=9.0)
        elif name == "capacity":
            fig = capacity_vs_load(ev.plan, ev.profile, self.layer.value, width=9.0)
        else:
            fig = group_map(ev.plan, width=9.0)
        figcheck.record(f"explorer-{name}", fig)
        self.images[name].value = self._layouts.png(name, fig)
        self._stale.discard(name)

    def _status(self, seconds, what):
        self.last_update_s = seconds
        self.status.value = f"<small>updated in {seconds:.2f} s ({what}; simulated timing, no model forward)</small>"


def _metrics_html(rows: pd.DataFrame, source: str, ev, routing: str) -> str:
    cur = rows.iloc[0]
    head = (f"<div><b class='npumoe-ttft'>TTFT {1e3 * cur.ttft_s:.4g} ms</b> · energy "
            f"{cur.energy_per_token_mj:.3g} mJ/token · CPU {cur.cpu_cycles / 1e6:.3g} M cycles · drop "
            f"{100 * cur.drop_rate:.2f} % · padding {100 * cur.pad_rate:.1f} % · {int(cur.n_npu_calls)} NPU calls "
            f"<small>({html.escape(source)}; calibration: {html.escape(ev.calibration)}; routing: "
            f"{html.escape(routing)})</small></div>")
    t = rows.assign(ttft_ms=rows.ttft_s * 1e3, cpu_mcycles=rows.cpu_cycles / 1e6, drop_pct=rows.drop_rate * 100,
                    pad_pct=rows.pad_rate * 100)
    t = t[["configuration", "ttft_ms", "energy_per_token_mj", "cpu_mcycles", "drop_pct", "pad_pct", "n_npu_calls"]]
    t.columns = ["", "TTFT (ms)", "energy (mJ/token)", "CPU (10⁶ cycles)", "dropped (%)", "padding (%)",
                 "NPU calls"]
    return head + _table_html(t)


def _table_html(t: pd.DataFrame) -> str:
    """DataFrame.to_html(index=False, border=0, classes="npumoe-table", floats as .4g), written directly: pandas'
    writer took a fifth of a knob move."""
    def cell(v):
        return f"{v:.4g}" if isinstance(v, float) else html.escape(str(v))
    head = "".join(f"<th>{html.escape(str(c))}</th>" for c in t.columns)
    body = "".join("<tr>" + "".join(f"<td>{cell(v)}</td>" for v in row) + "</tr>"
                   for row in t.itertuples(index=False, name=None))
    return (f'<table border="0" class="dataframe npumoe-table"><thead><tr style="text-align: right;">{head}</tr>'
            f"</thead><tbody>{body}</tbody></table>")


__all__ = ["Explorer", "png"]
