"""What `check`, `plan` and `render` do with a sweep (a `sweep:` section or `--sweep`): every point checked as a
full spec, issues merged (one a point alone has names it), and the points' shapes, plans and scripts."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import click

from launchgen.checks import has_errors, sort_issues
from launchgen.cli.common import (
    EXIT_SPEC_ERROR,
    collect,
    emit_json,
    issue_dict,
    print_issues,
    spec_estimate,
    summary,
)
from launchgen.cli.errors import fail
from launchgen.input.loader import LoadedSpec
from launchgen.input.sweep import Point, Sweep, merge_issues
from launchgen.shared.issues import Issue
from launchgen.shared.visible import visible

if TYPE_CHECKING:
    from launchgen.planning.estimate_spec import Measured
    from launchgen.planning.plan import Plan
    from launchgen.script.schedulers import SchedulerName


@dataclass
class CheckedPoint:
    point: Point
    loaded: LoadedSpec | None
    plan: Plan | None
    issues: list[Issue]


def check_points(sw: Sweep, *, strict: bool = False, files: bool = False, live: bool = False
                 ) -> list[CheckedPoint]:
    """Every point through the checks one spec gets (`check`'s `collect`, --live included)."""
    out = []
    for ps in sw.points:
        if ps.loaded is None:
            out.append(CheckedPoint(ps.point, None, None, ps.issues))
            continue
        _loaded, plan, issues = collect(sw.file, strict=strict, live=live, files=files, loaded=ps.loaded)
        out.append(CheckedPoint(ps.point, ps.loaded, plan, issues))
    return out


def shapes_issue(sw: Sweep, checked: list[CheckedPoint]) -> Issue:
    """LG023: the points, and which of them share a job array (the same #SBATCH lines, no hetjob)."""
    from launchgen.script.sweep import shapes

    planned = [(c.point, c.plan) for c in checked if c.plan is not None]
    if len(planned) < len(checked):
        text = f"{len(checked)} points; the array shapes follow once every point checks"
    else:
        groups = shapes(planned)
        arrays = sum(1 for g in groups if not g[0][1].slurm.het_directives)
        text = f"{len(checked)} points: " + "; ".join(
            (f"points {', '.join(p.name for p, _ in g)} share a job array" if not g[0][1].slurm.het_directives
             else f"point {g[0][0].name} is a heterogeneous job (a script of its own)") for g in groups)
        if arrays > 1:
            text += " (their #SBATCH lines differ: one script each)"
    return Issue("LG023", "sweep", text, "", "info", sw.line, sw.file)


def merged(sw: Sweep, checked: list[CheckedPoint]) -> list[Issue]:
    issues = merge_issues([(c.point, c.issues) for c in checked])
    return sort_issues([*issues, shapes_issue(sw, checked)])


def check(sw: Sweep, *, strict: bool, files: bool, fmt: str, explain: bool, live: bool = False) -> dict[str, Any]:
    """`check` of a sweep: the result object of one spec, with `points`."""
    checked = check_points(sw, strict=strict, files=files, live=live)
    issues = merged(sw, checked)
    failed = has_errors(issues) or any(c.plan is None for c in checked)
    if fmt == "text":
        print_issues(issues)
        counts = summary(issues)
        click.echo(f"{visible(sw.file)}: {'FAILED' if failed else 'ok'} ({len(checked)} points; "
                   f"{counts['error']} error(s), {counts['warning']} warning(s), {counts['info']} info)", err=True)
        if explain:
            print_points(checked)
    return {"spec": sw.file, "ok": not failed, "summary": summary(issues), "issues": [issue_dict(i) for i in issues],
            "points": [{"index": c.point.index, "name": c.point.name, "values": dict(c.point.values),
                        "ok": c.plan is not None} for c in checked]}


def checked_or_exit(sw: Sweep, *, strict: bool) -> list[CheckedPoint]:
    """For plan and render: every point must plan; issues on stderr (infos left out), exit 2 otherwise."""
    checked = check_points(sw, strict=strict)
    issues = merged(sw, checked)
    print_issues(issues, infos=False)
    if has_errors(issues) or any(c.plan is None for c in checked):
        raise click.exceptions.Exit(EXIT_SPEC_ERROR)
    return checked


def print_points(checked: list[CheckedPoint], gpu_hours: dict[int, float | None] | None = None) -> None:
    from rich.table import Table

    from launchgen import tables

    t = Table(title="sweep points")
    for col in ("#", "point", "values", *(("GPU-hours",) if gpu_hours is not None else ())):
        t.add_column(col)
    for c in checked:
        extra: tuple[str, ...] = ()
        if gpu_hours is not None:
            h = gpu_hours.get(c.point.index)
            extra = ("?" if h is None else f"{h:.1f}",)
        t.add_row(str(c.point.index), c.point.name, visible(c.point.describe()), *extra)
    con = tables.console()
    tables.print_table(con, t, records_only=not con.is_terminal)


def render(sw: Sweep, scheduler: SchedulerName, *, strict: bool) -> list[str]:
    """The sweep's scripts (every point checked first; exit 2 on an error), with render's notes on stderr."""
    from launchgen.planning.plan import bash_issues
    from launchgen.script.sweep import notes, render_sweep

    checked = checked_or_exit(sw, strict=strict)
    planned = [(c.point, c.plan) for c in checked if c.plan is not None]
    if scheduler == "bash":
        problems = merge_issues([(p, bash_issues(plan)) for p, plan in planned])
        if problems:
            print_issues(problems)
            raise click.exceptions.Exit(EXIT_SPEC_ERROR)
    scripts = render_sweep(sw, planned, scheduler)
    print_issues(notes(scripts, sw.file, sw.line))
    return [s.text for s in scripts]


def plan(sw: Sweep, *, strict: bool, fmt: str, measured: Measured | None, point: str | None
         ) -> LoadedSpec | None:
    """`plan` of a sweep: the points and the sweep's GPU-hours; with `point`, that point's spec for its full plan."""
    checked = checked_or_exit(sw, strict=strict)
    if point is not None:
        found = next((c.loaded for c in checked if c.point.name == point), None)
        if found is None:
            fail(f"--point {point}: the sweep's points are {', '.join(c.point.name for c in checked)}")
        return found
    hours = {c.point.index: spec_estimate(c.loaded, measured).gpu_hours for c in checked if c.loaded is not None}
    total = None if any(h is None for h in hours.values()) else sum(h for h in hours.values() if h is not None)
    if fmt == "json":
        emit_json({"sweep": {"points": [{"index": c.point.index, "name": c.point.name, "values": dict(c.point.values),
                                         "gpu_hours": hours.get(c.point.index)} for c in checked],
                             "gpu_hours": total}})
        return None
    print_points(checked, hours)
    con_text = (f"sweep: {len(checked)} points, " + (f"{total:.1f} GPU-hours in all" if total is not None else
                "GPU-hours need a step time (`plan --from-run JOBDIR` or estimate.step_time_s)"))
    click.echo(con_text)
    click.echo("one point's plan: launchgen plan SPEC --point NAME")
    return None
