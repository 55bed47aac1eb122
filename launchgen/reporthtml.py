"""`launchgen report`'s page: the RunReport drawn with plotly, in one HTML file that needs no network to view.

plotly is the `report` extra (`pip install 'launchgen[report]'`) and is imported only here, only by `report`:
check, render and plan never load it. plotly.js is embedded in the page (`include_plotlyjs=True`), MathJax is
not used, and no font or script is fetched, so the file can be copied off a cluster and opened anywhere.
"""

from __future__ import annotations

import html
import time
from typing import Any

from launchgen.runreport import Curve, Lane, RunReport

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


def _go() -> Any:
    try:
        import plotly.graph_objects as go
    except ImportError:
        raise ReportDependencyError(INSTALL_HINT) from None
    return go


def _when(t: float) -> str:
    """Unix seconds -> the date string plotly reads, in UTC (the events log's zone)."""
    return time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(t)) + f".{round((t % 1) * 1000) % 1000:03d}"


def _colour(lane: Lane) -> str:
    return _ROLE_COLOURS["server" if lane.role.startswith("server") else lane.role]


def timeline_figure(rep: RunReport) -> Any:
    go = _go()
    fig = go.Figure()
    lanes = [ln for ln in rep.lanes if ln.start is not None and ln.end is not None]
    names = [ln.name for ln in lanes]
    if lanes:
        fig.add_trace(go.Bar(
            name="role running", orientation="h", y=names,
            base=[_when(ln.start or 0.0) for ln in lanes],
            x=[max(((ln.end or 0.0) - (ln.start or 0.0)) * 1000.0, 1.0) for ln in lanes],
            marker={"color": [_colour(ln) for ln in lanes], "opacity": 0.45,
                    "line": {"color": ["#d62728" if ln.first_to_end else _colour(ln) for ln in lanes],
                             "width": [3 if ln.first_to_end else 1 for ln in lanes]}},
            hovertext=[f"{ln.name}: {(ln.end or 0) - (ln.start or 0):.1f} s"
                       + (f"; {ln.how}" if ln.how else "") + ("; ENDED FIRST" if ln.first_to_end else "")
                       for ln in lanes],
            hoverinfo="text",
        ))
    for kind, (legend, symbol, colour) in _MARKS.items():
        pts = [(m, ln) for ln in lanes for m in ln.marks if m.kind == kind]
        if not pts:
            continue
        fig.add_trace(go.Scatter(
            name=legend, mode="markers", x=[_when(m.t) for m, _ in pts], y=[ln.name for _, ln in pts],
            marker={"symbol": symbol, "color": colour, "size": 7 if kind == "step" else 11,
                    "line": {"width": 1, "color": "#ffffff"}},
            hovertext=[f"{ln.name}<br>{html.escape(m.label)}" for m, ln in pts], hoverinfo="text",
        ))
    fig.update_layout(
        title={"text": "Timeline (UTC): each role per node per attempt; red outline = the role that ended first"},
        barmode="overlay", height=max(300, 110 + 34 * len(lanes)), margin={"l": 10, "r": 10, "t": 50, "b": 60},
        xaxis={"type": "date", "title": None}, yaxis={"categoryorder": "array", "categoryarray": names[::-1],
                                                      "automargin": True},
        legend={"orientation": "h", "y": -0.15}, template="plotly_white",
    )
    return fig


def _add_lines(fig: Any, go: Any, curves: list[Curve], row: int, col: int) -> None:
    for c in curves:
        fig.add_trace(go.Scatter(name=c.title, x=c.steps, y=c.values, mode="lines+markers",
                                 legendgroup=f"{row}-{col}", showlegend=len(curves) > 1), row=row, col=col)


def curves_figure(rep: RunReport) -> Any:
    go = _go()
    from plotly.subplots import make_subplots

    panels = list(rep.curves.items())
    titles = [panels[0][0], panels[1][0], panels[2][0], "step time split (s)", panels[3][0], panels[4][0]]
    fig = make_subplots(rows=3, cols=2, subplot_titles=titles, horizontal_spacing=0.08, vertical_spacing=0.1)
    cells = [(1, 1), (1, 2), (2, 1), (2, 2), (3, 1), (3, 2)]
    content: list[list[Curve]] = [panels[0][1], panels[1][1], panels[2][1], rep.phases, panels[3][1], panels[4][1]]
    for i, ((row, col), curves) in enumerate(zip(cells, content, strict=True)):
        if i == 3:
            for c in curves:
                fig.add_trace(go.Bar(name=c.title, x=c.steps, y=c.values, legendgroup="phases"), row=row, col=col)
        else:
            _add_lines(fig, go, curves, row, col)
        if not curves:
            # in paper coordinates at the panel's centre: plotly.js does not resolve an `x<n> domain` reference
            # to an axis that holds no trace
            axis = "" if i == 0 else str(i + 1)
            xd, yd = fig.layout[f"xaxis{axis}"].domain, fig.layout[f"yaxis{axis}"].domain
            fig.add_annotation(text="not recorded by this run", showarrow=False, font={"color": "#888"},
                               xref="paper", yref="paper", x=(xd[0] + xd[1]) / 2, y=(yd[0] + yd[1]) / 2)
        fig.update_xaxes(title_text="step", row=row, col=col)
    fig.update_layout(barmode="stack", height=900, template="plotly_white",
                      title={"text": f"Training curves ({rep.steps} logged step(s))"},
                      margin={"l": 10, "r": 10, "t": 70, "b": 40})
    return fig


_PAGE = """<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<title>launchgen report: {title}</title>
<style>
body {{ font-family: system-ui, -apple-system, "Segoe UI", sans-serif; margin: 1.5em; color: #222; }}
h1 {{ font-size: 1.4em; margin-bottom: .2em; }}
.summary {{ font-size: 1.05em; margin: .3em 0 1em; }}
.notes li {{ color: #666; }}
table {{ border-collapse: collapse; font-size: .9em; margin: 1em 0; }}
td, th {{ border: 1px solid #ddd; padding: .25em .6em; text-align: left; }}
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
    timeline = timeline_figure(rep).to_html(full_html=False, include_plotlyjs=True, config=_PLOT_CONFIG,
                                            div_id="timeline-plot")
    curves = curves_figure(rep).to_html(full_html=False, include_plotlyjs=False, config=_PLOT_CONFIG,
                                        div_id="curves-plot")
    notes = "".join(f"<li>{html.escape(n)}</li>" for n in rep.notes)
    return _PAGE.format(title=html.escape(rep.title), summary=html.escape(rep.summary),
                        job_dir=html.escape(rep.job_dir), notes=f'<ul class="notes">{notes}</ul>' if notes else "",
                        timeline=timeline, curves=curves, rows="\n".join(_lane_row(ln) for ln in rep.lanes))
