"""A sweep's scripts: one sbatch job array per resource shape, a plain script per heterogeneous point, or one
`--bash` driver that runs the points one after the other.

Each point's script is exactly what `render_script` writes for the point's plan, plus the sweep's record
(`shared.jobdir.SWEEP_FILE`, how `status` finds the siblings); the array script only picks one by
`SLURM_ARRAY_TASK_ID` and hands it the batch shell (`exec`), so USR2, requeue and the job directory work as in
a one-job script. Points share an array only where SLURM allows: the same `#SBATCH` lines (one resource
request per array) and no heterogeneous job (those cannot be arrays).
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from dataclasses import dataclass

from launchgen import __version__
from launchgen.input.sweep import Point, Sweep
from launchgen.planning.plan import Plan
from launchgen.script.render import environment, heredoc_delimiter, render_script
from launchgen.script.schedulers import SBATCH_MAX_SCRIPT_SIZE, SchedulerName
from launchgen.shared import jobdir
from launchgen.shared.issues import Issue


@dataclass(frozen=True)
class SweepScript:
    """One script of a sweep: its text, the points it runs, and whether it is a job array."""

    text: str
    points: tuple[Point, ...]
    array: bool


def shapes(planned: Sequence[tuple[Point, Plan]]) -> list[list[tuple[Point, Plan]]]:
    """Points grouped by what SLURM must share in an array: identical `#SBATCH` lines; a heterogeneous job's
    point stands alone. In point order."""
    groups: dict[tuple[str, ...], list[tuple[Point, Plan]]] = {}
    alone: list[list[tuple[Point, Plan]]] = []
    for point, plan in planned:
        if plan.slurm.het_directives:
            alone.append([(point, plan)])
        else:
            groups.setdefault(plan.slurm.directives, []).append((point, plan))
    return sorted([*groups.values(), *alone], key=lambda g: g[0][0].index)


def gpus_per_point(plan: Plan) -> int:
    """How many of a machine's GPUs one point's plan takes (its highest GPU position + 1; 0 on CPU): the slice the
    `--bash` driver gives each point it runs side by side."""
    used = [g for n in plan.nodes for g in (*n.server_gpus, *n.trainer_gpus)]
    return max(used) + 1 if used else 0


def array_range(indices: Sequence[int], max_parallel: int | None) -> str:
    """`--array`'s value: ranges of the point indices (`0-2`, `0,2,4-6`), `%K` when limited."""
    parts, start = [], indices[0]
    for prev, cur in zip(indices, [*indices[1:], None], strict=True):
        if cur is not None and cur == prev + 1:
            continue
        parts.append(str(start) if start == prev else f"{start}-{prev}")
        if cur is not None:
            start = cur
    return ",".join(parts) + (f"%{max_parallel}" if max_parallel else "")


def regenerate_line(sweep: Sweep, scheduler: SchedulerName) -> str:
    words = ["launchgen", "render", sweep.file, *(w for s in sweep.cli for w in ("--sweep", s))]
    if scheduler == "bash":
        words.append("--bash")
    return shlex.join([*words, "-o", "FILE", "--force"])


def _point_script(sweep: Sweep, point: Point, plan: Plan, scheduler: SchedulerName) -> str:
    """The point's own script, with the sweep's record among the files it writes into its job directory."""
    table = tuple((p.point.index, p.point.name, dict(p.point.values)) for p in sweep.points)
    record = jobdir.SweepRecord(point.index, table)
    return render_script(plan, scheduler, {jobdir.SWEEP_FILE: record.to_text()})


def _point_scripts(sweep: Sweep, group: Sequence[tuple[Point, Plan]], scheduler: SchedulerName
                   ) -> list[tuple[Point, str, str]]:
    texts = [(point, _point_script(sweep, point, plan, scheduler)) for point, plan in group]
    return [(point, text, heredoc_delimiter(text)) for point, text in texts]


def render_sweep(sweep: Sweep, planned: Sequence[tuple[Point, Plan]], scheduler: SchedulerName
                 ) -> list[SweepScript]:
    """The sweep's scripts: `--bash` one driver; sbatch one per shape (an array, or a plain script for a
    heterogeneous point)."""
    env = environment()
    ctx = {"version": __version__, "source": sweep.file, "regenerate": regenerate_line(sweep, scheduler),
           "total": len(sweep.points)}
    if scheduler == "bash":
        points = tuple(p for p, _ in planned)
        text = env.get_template("sweep_bash.j2").render(
            {**ctx, "points": points, "scripts": _point_scripts(sweep, planned, scheduler),
             "max_parallel": sweep.max_parallel or 1, "gpus": max(gpus_per_point(plan) for _p, plan in planned)})
        return [SweepScript(text, points, False)]
    out = []
    for group in shapes(planned):
        points = tuple(p for p, _ in group)
        if group[0][1].slurm.het_directives:
            (point, plan), = group
            out.append(SweepScript(_point_script(sweep, point, plan, scheduler), points, False))
            continue
        text = env.get_template("sweep_sbatch.j2").render({
            **ctx, "points": points, "directives": group[0][1].slurm.directives,
            "array": array_range([p.index for p in points], sweep.max_parallel),
            "scripts": _point_scripts(sweep, group, scheduler)})
        out.append(SweepScript(text, points, True))
    return out


def notes(scripts: Sequence[SweepScript], file: str, line: int | None = None) -> list[Issue]:
    """What render says about a sweep's scripts: why there are several (LG025), a script sbatch may refuse (LG024)."""
    out = []
    if len(scripts) > 1:
        for k, s in enumerate(scripts, 1):
            names = ", ".join(p.name for p in s.points)
            why = ("a job array of the points with these #SBATCH lines" if s.array else
                   "a heterogeneous job, which SLURM cannot run as an array task")
            out.append(Issue("LG025", "sweep", f"script {k}: {why}: {names}", "Submit each script.", "info",
                             line, file))
    for s in scripts:
        if len(s.text.encode()) > SBATCH_MAX_SCRIPT_SIZE:
            out.append(Issue("LG024", "sweep", f"the array script of {len(s.points)} points is "
                             f"{len(s.text.encode()) // 1024} KiB; sbatch refuses scripts over 4 MiB unless the "
                             "cluster raises max_script_size", "Split the sweep (sweep.points, or several "
                             "specs), or ask for a larger SchedulerParameters=max_script_size.", "warning", line,
                             file))
    return out
