"""`launchgen report`'s page: the RunReport drawn with plotly, in one HTML file that needs no network to view.

plotly is the `report` extra (`pip install 'launchgen[report]'`) and is imported only here, only by `report`:
check, render and plan never load it. plotly.js is embedded in the page (`include_plotlyjs=True`), MathJax is
not used, and no font or script is fetched, so the file can be copied off a cluster and opened anywhere.
"""

from __future__ import annotations

import html
import time
from typing import Any

from launchgen.readback.runreport import COMPARED, Comparison, Curve, Lane, RunReport

INSTALL_HINT = "launchgen report draws with plotly: pip install 'launchgen[report]'"

#: lane colour by role (a replica's server lanes share the server's), and each mark's symbol and colour
_ROLE_COLOURS = {"job": "#9aa0a6", "server": "#4c78a8", "trainer": "#54a24b"}
_MARKS: dict[str, tuple[str, str, str]] = {  # kind -> (legend name, symbol, colour)
    "healthy": ("server healthy", "star", "#2ca02c"),
    "step": ("training step", "circle", "#1b5e20"),
    "sync": ("weight sync", "diamond", "#ff7f0e"),
    "restart": ("replica restart", "x", "#d62728"),
    "end": ("role ended", "square", "#111111"),
    "signal": ("signal", "triangle-down", "#9467bd"),
    "requeue": ("requeue", "triangle-right", "#8c564b"),
    "requeue_cap": ("no requeue (cap)", "triangle-left", "#8c564b"),
    "complete": ("training complete", "star-diamond", "#17becf"),
    "exit": ("script exit", "square-open", "#111111"),
}
_PLOT_CONFIG = {"displaylogo": False, "responsive": True}


class ReportDependencyError(RuntimeError):
    """plotly is not installed (the `report` extra)."""


def _pio() -> Any:
    try:
        import plotly.io as pio
    except ImportError:
        raise ReportDependencyError(INSTALL_HINT) from None
    return pio


def _when(t: float) -> str:
    """Unix seconds -> the date string plotly reads, in UTC (the events log's zone)."""
    return time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(t)) + f".{round((t % 1) * 1000) % 1000:03d}"


def _colour(lane: Lane) -> str:
    return _ROLE_COLOURS["server" if lane.role.startswith("server") else lane.role]


# The figures are plotly figure specs (plain dicts, plotly.js's own schema) handed to plotly.io unvalidated:
# building them as plotly.graph_objects runs plotly's Python validators, which took most of `report`'s time.
# tests/test_report.py renders them in Chromium, where plotly.js would refuse what is malformed.
Figure = dict[str, Any]


def timeline_figure(rep: RunReport) -> Figure:
    lanes = [ln for ln in rep.lanes if ln.start is not None and ln.end is not None]
    names = [ln.name for ln in lanes]
    data: list[dict[str, Any]] = []
    if lanes:
        data.append({
            "type": "bar", "name": "role running", "orientation": "h", "y": names,
            "base": [_when(ln.start or 0.0) for ln in lanes],
            "x": [max(((ln.end or 0.0) - (ln.start or 0.0)) * 1000.0, 1.0) for ln in lanes],
            "marker": {"color": [_colour(ln) for ln in lanes], "opacity": 0.45,
                       "line": {"color": ["#d62728" if ln.first_to_end else _colour(ln) for ln in lanes],
                                "width": [3 if ln.first_to_end else 1 for ln in lanes]}},
            "hovertext": [f"{html.escape(ln.name)}: {(ln.end or 0) - (ln.start or 0):.1f} s"
                          + (f"; {html.escape(ln.how)}" if ln.how else "")
                          + ("; ENDED FIRST" if ln.first_to_end else "") for ln in lanes],
            "hoverinfo": "text",
        })
    for kind, (legend, symbol, colour) in _MARKS.items():
        pts = [(m, ln) for ln in lanes for m in ln.marks if m.kind == kind]
        if pts:
            data.append({
                "type": "scatter", "name": legend, "mode": "markers", "x": [_when(m.t) for m, _ in pts],
                "y": [ln.name for _, ln in pts],
                "marker": {"symbol": symbol, "color": colour, "size": 7 if kind == "step" else 11,
                           "line": {"width": 1, "color": "#ffffff"}},
                "hovertext": [f"{html.escape(ln.name)}<br>{html.escape(m.label)}" for m, ln in pts],
                "hoverinfo": "text",
            })
    layout = {
        "title": {"text": "Timeline (UTC): each role per node per attempt; red outline = the role that ended first",
                  "x": 0.01, "xanchor": "left"},
        "barmode": "overlay", "height": max(300, 110 + 34 * len(lanes)),
        "margin": {"l": 10, "r": 10, "t": 50, "b": 60},
        "xaxis": {"type": "date"}, "yaxis": {"categoryorder": "array", "categoryarray": names[::-1],
                                             "automargin": True},
        "legend": {"orientation": "h", "y": -0.15},
    }
    return {"data": data, "layout": layout}


#: the curves' 3 x 2 grid: (x domain, y domain) per panel, row by row
_COLS = ((0.0, 0.44), (0.56, 1.0))
_ROWS = ((0.76, 1.0), (0.38, 0.62), (0.0, 0.24))


def _panel(layout: dict[str, Any], i: int, title: str, xd: tuple[float, float], yd: tuple[float, float]) -> str:
    """Panel `i` of a grid: its axes over the paper domains `xd` x `yd` (x is the step), its title above it; the
    axes' suffix (`""`, `"2"`, ...) its traces name."""
    n = "" if i == 0 else str(i + 1)
    layout[f"xaxis{n}"] = {"domain": list(xd), "anchor": f"y{n}", "title": {"text": "step"}}
    layout[f"yaxis{n}"] = {"domain": list(yd), "anchor": f"x{n}", "automargin": True}
    layout["annotations"].append({"text": title, "showarrow": False, "xref": "paper", "yref": "paper",
                                  "x": sum(xd) / 2, "y": yd[1], "xanchor": "center", "yanchor": "bottom",
                                  "font": {"size": 15}})
    return n


def curves_figure(rep: RunReport) -> Figure:
    panels = list(rep.curves.items())
    titles = [panels[0][0], panels[1][0], panels[2][0], "step time split (s)", panels[3][0], panels[4][0]]
    content: list[list[Curve]] = [panels[0][1], panels[1][1], panels[2][1], rep.phases, panels[3][1], panels[4][1]]
    data: list[dict[str, Any]] = []
    layout: dict[str, Any] = {"barmode": "stack", "height": 900,
                              "title": {"text": f"Training curves ({rep.steps} logged step(s))", "x": 0.01,
                                        "xanchor": "left"},
                              "margin": {"l": 10, "r": 10, "t": 70, "b": 40}, "annotations": []}
    for i, (title, curves) in enumerate(zip(titles, content, strict=True)):
        xd, yd = _COLS[i % 2], _ROWS[i // 2]
        n = _panel(layout, i, title, xd, yd)
        if not curves:
            layout["annotations"].append({"text": "not recorded by this run", "showarrow": False,
                                          "font": {"color": "#888"}, "xref": "paper", "yref": "paper",
                                          "x": sum(xd) / 2, "y": sum(yd) / 2})
        for c in curves:
            trace: dict[str, Any] = {"name": c.title, "x": c.steps, "y": c.values, "xaxis": f"x{n}",
                                     "yaxis": f"y{n}"}
            if i == 3:
                trace.update(type="bar", legendgroup="phases")
            else:
                trace.update(type="scatter", mode="lines+markers", legendgroup=f"panel{i}",
                             showlegend=len(curves) > 1)
            data.append(trace)
    return {"data": data, "layout": layout}


#: what both pages look like (a format argument: its braces are CSS's)
_STYLE = """body { font-family: system-ui, -apple-system, "Segoe UI", sans-serif; margin: 1.5em; color: #222; }
h1 { font-size: 1.4em; margin-bottom: .2em; }
.notes li { color: #666; }
table { border-collapse: collapse; font-size: .9em; margin: 1em 0; }
td, th { border: 1px solid #ddd; padding: .25em .6em; text-align: left; }"""

_PAGE = """<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<title>launchgen report: {title}</title>
<style>
{style}
.summary {{ font-size: 1.05em; margin: .3em 0 1em; }}
td:nth-child(-n+2), th {{ white-space: nowrap; }}
.first {{ color: #d62728; font-weight: bold; }}
</style></head><body>
<h1>launchgen report: {title}</h1>
<div class="summary">{summary}</div>
<div>job directory: <code>{job_dir}</code></div>
{notes}
<div id="timeline" class="figure">{timeline}</div>
<table id="lanes"><tr><th>lane</th><th>ran (s)</th><th>how it ended</th></tr>
{rows}
</table>
<div id="curves" class="figure">{curves}</div>
</body></html>
"""


def _lane_row(ln: Lane) -> str:
    ran = f"{ln.end - ln.start:.1f}" if ln.start is not None and ln.end is not None else "?"
    how = html.escape(ln.how or "(stopped with the attempt)")
    if ln.first_to_end:
        how = f'<span class="first">ended first: {how}</span>'
    return f"<tr><td>{html.escape(ln.name)}</td><td>{ran}</td><td>{how}</td></tr>"


def render_page(rep: RunReport) -> str:
    """The whole page, plotly.js inlined once."""
    pio = _pio()
    timeline = pio.to_html(timeline_figure(rep), full_html=False, include_plotlyjs=True, config=_PLOT_CONFIG,
                           div_id="timeline-plot", validate=False)
    curves = pio.to_html(curves_figure(rep), full_html=False, include_plotlyjs=False, config=_PLOT_CONFIG,
                         div_id="curves-plot", validate=False)
    notes = "".join(f"<li>{html.escape(n)}</li>" for n in rep.notes)
    return _PAGE.format(style=_STYLE, title=html.escape(rep.title), summary=html.escape(rep.summary),
                        job_dir=html.escape(rep.job_dir), notes=f'<ul class="notes">{notes}</ul>' if notes else "",
                        timeline=timeline, curves=curves, rows="\n".join(_lane_row(ln) for ln in rep.lanes))


def comparison_figure(cmp: Comparison) -> Figure:
    """One panel per compared metric (2 x 2), one line per run; a run keeps its colour and legend entry across
    the panels (clicking it hides the run everywhere)."""
    data: list[dict[str, Any]] = []
    layout: dict[str, Any] = {"height": 700, "margin": {"l": 10, "r": 10, "t": 40, "b": 40}, "annotations": []}
    runs = [name for name, _step, _final in cmp.final]
    palette = ("#4c78a8", "#f58518", "#54a24b", "#e45756", "#72b7b2", "#b279a2", "#ff9da6", "#9d755d", "#bab0ac")
    for i, (title, curves) in enumerate(cmp.curves.items()):
        n = _panel(layout, i, title, _COLS[i % 2], ((0.58, 1.0), (0.0, 0.42))[i // 2])
        for c in curves:
            k = runs.index(c.title)
            data.append({"type": "scatter", "mode": "lines+markers", "name": c.title, "x": c.steps, "y": c.values,
                         "xaxis": f"x{n}", "yaxis": f"y{n}", "legendgroup": c.title, "showlegend": i == 0,
                         "line": {"color": palette[k % len(palette)]}})
    return {"data": data, "layout": layout}


_COMPARISON_PAGE = """<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<title>launchgen report: {title}</title>
<style>
{style}
</style></head><body>
<h1>launchgen report: {title}</h1>
{notes}
<table id="final"><tr><th>run</th><th>steps</th>{heads}</tr>
{rows}
</table>
<div id="curves" class="figure">{curves}</div>
</body></html>
"""


def _final_cell(v: float | None) -> str:
    return "" if v is None else f"{v:.4g}"


def render_comparison(cmp: Comparison) -> str:
    """Several runs' curves overlaid and their final metrics in a table, plotly.js inlined once."""
    curves = _pio().to_html(comparison_figure(cmp), full_html=False, include_plotlyjs=True, config=_PLOT_CONFIG,
                            div_id="comparison-plot", validate=False)
    notes = "".join(f"<li>{html.escape(n)}</li>" for n in cmp.notes)
    rows = "\n".join(f"<tr><td>{html.escape(name)}</td><td>{step}</td>"
                     + "".join(f"<td>{_final_cell(final[key])}</td>" for _t, key in COMPARED) + "</tr>"
                     for name, step, final in cmp.final)
    return _COMPARISON_PAGE.format(style=_STYLE, title=html.escape(cmp.title), notes=f'<ul class="notes">{notes}</ul>' if notes
                                   else "", heads="".join(f"<th>{html.escape(t)}</th>" for t, _k in COMPARED),
                                   rows=rows, curves=curves)
