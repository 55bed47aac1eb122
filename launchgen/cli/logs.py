"""`launchgen logs JOBID --role server|trainer`: print one role's log of one attempt."""

from __future__ import annotations

import sys

import click

from launchgen.status import StatusError, collect, select_log, tail


@click.command("logs")
@click.argument("job_id")
@click.option("--role", type=click.Choice(["server", "trainer"]), required=True)
@click.option("--node", default=None, help="Node name (e.g. node2) or position among the role's nodes (0, 1, ...).")
@click.option("--attempt", type=click.IntRange(min=0), default=None, help="Attempt number; default: the latest.")
@click.option("-n", "--lines", type=click.IntRange(min=0), default=50, show_default=True, help="0 prints the whole log.")
@click.option("--job-dir", type=click.Path(file_okay=False), default=None,
              help="The job's output directory, when the scheduler no longer knows the job.")
@click.option("--path-only", is_flag=True, help="Print the log's path instead of its lines.")
def command(job_id: str, role: str, node: str | None, attempt: int | None, lines: int, job_dir: str | None,
            path_only: bool) -> None:
    """Print the last lines of a role's log (one file per role, node and attempt).

    Examples:

      launchgen logs 1234 --role server

      launchgen logs 1234 --role trainer --node node2 --attempt 0 -n 200
    """
    try:
        st = collect(job_id, job_dir, lines=0)
        lg = select_log(st, role, node, attempt)
    except StatusError as e:
        click.echo(f"error: {e}", err=True)
        sys.exit(2)
    if path_only:
        click.echo(lg.path)
        return
    click.echo(f"==> {lg.path} (attempt {lg.attempt}, {lg.role} on {lg.node}) <==", err=True)
    for line in tail(lg.path, lines):
        click.echo(line)
