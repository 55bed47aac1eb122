"""`launchgen plan SPEC`: the resolved plan as tables (node x GPU map, ports, addresses, env, commands) and the
memory / weight-sync / GPU-hour estimate."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

import click

from launchgen.cli.common import load_and_check, spec_argument, strict_option
from launchgen.cli.errors import fail

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
def command(spec: str, strict: bool, fmt: str, from_run: str | None) -> None:
    measured = _measured(from_run) if from_run is not None else None
    loaded, plan = load_and_check(spec, strict=strict)
    from launchgen.checks.context import Ctx
    from launchgen.planning.estimate_spec import estimate

    ctx = Ctx(loaded)
    est = estimate(ctx.spec, ctx.model_config, ctx.trainer_cfg, ctx.layout, measured=measured)
    if fmt == "json":
        click.echo(json.dumps({**plan.to_json(), "estimate": est.to_json()}, indent=2, sort_keys=True))
        return
    from launchgen import tables
    from launchgen.planning.estimate_view import print_estimate
    from launchgen.planning.view import print_plan

    console = tables.console()  # the terminal's width, COLUMNS, else 80: as every table of the plan
    print_plan(plan, console)
    print_estimate(est, console)
