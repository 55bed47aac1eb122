"""`launchgen logs JOBID --role server|trainer|batch`: print one role's log of one attempt (or the batch log)."""

from __future__ import annotations

import click

from launchgen.cli.errors import fail
from launchgen.readback.follow import Target, follow
from launchgen.readback.status import (
    BATCH_ROLE,
    ROLES,
    StatusError,
    collect,
    planned_server_ranks,
    select_log,
    tail,
)
from launchgen.shared.visible import log_line


@click.command("logs")
@click.argument("job_id")
@click.option("--role", type=click.Choice([*ROLES, BATCH_ROLE]), required=True,
              help=f"A step's log, or {BATCH_ROLE}: the batch script's own output (sbatch --output).")
@click.option("--node", default=None, help="Node name (e.g. node2) or position among the role's nodes (0, 1, ...).")
@click.option("--rank", type=click.IntRange(min=0), default=None,
              help="--role server: rank K of a server over several nodes (its node's log); a one-node server "
              "is rank 0.")
@click.option("--attempt", type=click.IntRange(min=0), default=None, help="Attempt number; default: the latest.")
@click.option("-n", "--lines", type=click.IntRange(min=0), default=50, show_default=True, help="0 prints the whole log.")
@click.option("--job-dir", type=click.Path(file_okay=False), default=None,
              help="The job's output directory, when the scheduler no longer knows the job.")
@click.option("--path-only", is_flag=True, help="Print the log's path instead of its lines.")
@click.option("-f", "--follow", "follow_", is_flag=True,
              help="Keep printing what is appended until the job is over (a requeued job's next attempt is "
              "followed too, unless --attempt is given); Ctrl-C stops.")
def command(job_id: str, role: str, node: str | None, rank: int | None, attempt: int | None, lines: int,
            job_dir: str | None, path_only: bool, follow_: bool) -> None:
    """Print the last lines of a role's log (one file per role, node and attempt).

    Examples:

      launchgen logs 1234 --role server

      launchgen logs 1234 --role trainer --node node2 --attempt 0 -n 200

      launchgen logs 1234 --role trainer -f          # follow while it runs

      launchgen logs 1234 --role server --rank 1 -f  # a multi-node server's rank 1

      launchgen logs local --role trainer -f         # a `render --bash` run, from its job directory
    """
    if rank is not None and (node is not None or role != "server"):
        fail(f"--rank {rank}: a server rank, so with --role server and without --node")
    if follow_ and not path_only:
        _follow(job_id, job_dir, role, node, rank, attempt, lines)
        return
    try:
        st = collect(job_id, job_dir, lines=0)
        lg = select_log(st, role, node, attempt, rank)
    except StatusError as e:
        fail(str(e))
    if path_only:
        click.echo(lg.path)
        return
    who = lg.role if rank is None else f"{lg.role} rank {rank}"
    click.echo(f"==> {lg.path} (attempt {lg.attempt}, {who} on {lg.node}) <==", err=True)
    for line in tail(lg.path, lines):
        click.echo(log_line(line))


def _target(job_id: str, job_dir: str | None, role: str, node: str | None, rank: int | None,
            attempt: int | None, first: bool) -> Target:
    """The log to follow now; None while the role has no log yet (an error then only if the job is over)."""
    st = collect(job_id, job_dir, lines=0)
    try:
        return Target(select_log(st, role, node, attempt, rank).path, st.over)
    except StatusError:
        # a planned rank of a running job that has not recorded its node (or written its log) yet is waited for
        waits = rank is not None and not st.over and rank < planned_server_ranks(st)
        if first and not waits and (st.over or any(lg.role == role for lg in st.logs) or role == BATCH_ROLE):
            raise
        return Target(None, st.over)


def _follow(job_id: str, job_dir: str | None, role: str, node: str | None, rank: int | None, attempt: int | None,
            lines: int) -> None:
    try:
        first = _target(job_id, job_dir, role, node, rank, attempt, first=True)
    except StatusError as e:
        fail(str(e))

    def state() -> Target:
        try:
            return _target(job_id, job_dir, role, node, rank, attempt, first=False)
        except StatusError:
            return Target(None, True)

    if first.path:
        click.echo(f"==> {first.path} (following; Ctrl-C stops) <==", err=True)
    follow(first, state, emit=lambda line: click.echo(log_line(line)), note=lambda m: click.echo(f"==> {m} <==", err=True), lines=lines)
    click.echo("==> the job is over <==", err=True)
