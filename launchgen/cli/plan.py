"""`launchgen plan SPEC`: the resolved plan as tables (node x GPU map, ports, addresses, env, commands) and the
memory / weight-sync / GPU-hour estimate."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

import click

from launchgen.cli.common import (
    check_or_exit,
    load_any,
    spec_argument,
    spec_estimate,
    strict_option,
    sweep_option,
)
from launchgen.cli.errors import fail
from launchgen.input.loader import LoadedSpec

if TYPE_CHECKING:
    from launchgen.planning.estimate_spec import Measured

HELP = """\
Print the plan SPEC resolves to: which role runs on which node and GPU (TP rank, trainer rank), every port and
the node that binds it, the addresses each side reaches, the environment per role and the exact commands; then
the estimate: memory per GPU of the server and the trainer, bytes and seconds per weight sync, and GPU-hours
(from a step time: --from-run or estimate.step_time_s).

Runs the same checks as `launchgen check` first and refuses (exit 2) when there is an error.

\b
Examples:
  launchgen plan topology.yaml
  launchgen plan topology.yaml --from-run launchgen-runs/12345  # GPU-hours
  launchgen plan topology.yaml --format json | jq '.estimate.trainer'
"""


def _measured(job_dir: str) -> Measured:
    from launchgen.planning.estimate_spec import Measured
    from launchgen.readback.jobfiles import StatusError, read_job_dir, read_step_times

    path = Path(job_dir)
    try:
        times = read_step_times(path, read_job_dir(path, None).record)
    except StatusError as exc:
        fail(f"--from-run: {exc}")
    return Measured(times.median, len(times.seconds), times.source)


@click.command("plan", help=HELP)
@spec_argument
@strict_option
@click.option("--format", "fmt", type=click.Choice(["text", "json"]), default="text", show_default=True,
              help="json: the static plan (what the job saves as launchgen-plan.json, before run-time values) "
              "with the estimate under `estimate`.")
@click.option("--from-run", "from_run", metavar="JOBDIR", default=None,
              type=click.Path(file_okay=False, path_type=str),
              help="A previous run's job directory: its trainer's step times (metrics.jsonl) give the GPU-hours.")
@sweep_option
@click.option("--point", "point_name", metavar="NAME", default=None,
              help="With a sweep: the full plan of this point (its name, as the points table shows it).")
def command(spec: str, strict: bool, fmt: str, from_run: str | None, sweeps: tuple[str, ...],
            point_name: str | None) -> None:
    measured = _measured(from_run) if from_run is not None else None
    loaded = load_any(spec, sweeps)
    if not isinstance(loaded, LoadedSpec):
        from launchgen.cli import sweeps as sweep_verbs

        found = sweep_verbs.plan(loaded, strict=strict, fmt=fmt, measured=measured, point=point_name)
        if found is None:
            return
        loaded = found
    elif point_name is not None:
        fail("--point: the spec is not a sweep (no sweep: section or --sweep)")
    _loaded, plan = check_or_exit(loaded, strict=strict)
    est = spec_estimate(loaded, measured)
    if fmt == "json":
        click.echo(json.dumps({**plan.to_json(), "estimate": est.to_json()}, indent=2, sort_keys=True))
        return
    from launchgen import tables
    from launchgen.planning.estimate_view import print_estimate
    from launchgen.planning.view import print_plan

    console = tables.console()  # the terminal's width, COLUMNS, else 80: as every table of the plan
    print_plan(plan, console)
    print_estimate(est, console)

