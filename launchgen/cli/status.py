"""`launchgen status JOBID`: role-aware post-mortem (or live view) of a rendered job."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

import click
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from launchgen import tables
from launchgen.cli.errors import fail
from launchgen.readback.status import JobStatus, SchedulerInfo, StatusError, collect
from launchgen.shared.jobdir import EXIT_STATUS_JOB_FAILED, LOCAL_JOB_ID
from launchgen.shared.visible import log_line, visible
from launchgen.tables import print_table, print_text

if TYPE_CHECKING:
    from launchgen.readback.sweep import SweepStatus

#: exit status of `launchgen status` for a job that is over and did not complete (2 is bad usage)
EXIT_JOB_FAILED = EXIT_STATUS_JOB_FAILED


def _ts(v: float | None) -> str:
    return time.strftime("%H:%M:%S", time.localtime(v)) if v is not None else ""


def _rel(path: str | None, job_dir: str | None) -> str:
    """Log paths relative to the job directory (printed above the tables), so the tables stay readable."""
    if not path:
        return ""
    if job_dir and path.startswith(job_dir.rstrip("/") + "/"):
        return path[len(job_dir.rstrip("/")) + 1 :]
    return path


def _scheduler_line(sch: SchedulerInfo) -> str:
    bits = [f"state {sch.state}", f"exit {sch.exit_code}:{sch.exit_signal}"]
    if sch.reason:
        bits.append(f"reason {sch.reason}")
    if sch.run_time:
        bits.append(f"ran {sch.run_time} of {sch.time_limit}")
    if sch.restarts is not None:
        bits.append(f"restarts {sch.restarts}")
    if sch.node_list:
        bits.append(f"nodes {sch.node_list}")
    return f"scheduler ({sch.source}): " + ", ".join(bits)


def _header(con: Console, st: JobStatus) -> None:
    sch = st.scheduler
    name = f" ({sch.job_name})" if sch and sch.job_name else ""
    print_text(con, f"job {st.job_id}{name}" + (": FAILED" if st.failed else ""))
    print_text(con, st.summary)
    if sch is not None:
        print_text(con, _scheduler_line(sch))
    print_text(con, f"accounting (sacct): {st.accounting}")
    print_text(con, f"job dir: {st.job_dir or '(not found: pass --job-dir)'}")
    if st.batch_log:
        print_text(con, f"batch log: {st.batch_log}")
    if st.attempt is not None:
        print_text(con, f"attempt: {st.attempt}" + (f" (attempts seen: {', '.join(map(str, st.attempts))})"
                                                      if len(st.attempts) > 1 else ""))
    if st.last_health is not None:
        h = st.last_health
        print_text(con, f"last health check: {'ok' if h.ok else 'FAILED'} at {_ts(h.at)}"
                   + (f" ({h.message})" if h.message else ""))


def _tables(st: JobStatus) -> list[Table]:
    t = Table(title="roles (this attempt)")
    for col in ("role", "nodes", "state", "how", "exit", "ended", "log"):
        t.add_column(col)
    for r in st.roles:
        first = " (first)" if st.first_to_end == r.role else ""
        t.add_row(r.role + first, ", ".join(r.nodes), r.state, escape(visible(r.how)),
                  "" if r.exit_code is None else str(r.exit_code), _ts(r.ended_at),
                  escape(visible(_rel(r.log, st.job_dir))))
    tables = [t]
    if st.steps:
        s = Table(title="steps (sacct)")
        for col in ("step", "name", "role", "state", "exit", "end", "nodes"):
            s.add_column(col)
        for x in st.steps:
            s.add_row(x.step_id, escape(x.name), x.role or "", x.state, f"{x.exit_code}:{x.exit_signal}", x.end or "",
                      x.node_list or "")
        tables.append(s)
    if st.logs:
        lt = Table(title="logs")
        for col in ("attempt", "role", "node", "bytes", "path"):
            lt.add_column(col)
        for lg in st.logs:
            lt.add_row(str(lg.attempt), lg.name, lg.node, str(lg.size), escape(_rel(lg.path, st.job_dir)))
        tables.append(lt)
    return tables


def _print_rich(st: JobStatus) -> None:
    con = tables.console()
    _header(con, st)
    for table in _tables(st):
        # piped (a mail, a grep, a CI log): one record a line, whatever the width
        print_table(con, table, records_only=not con.is_terminal)
    for n in st.notes:
        print_text(con, f"note: {n}")
    if st.failed_log:
        print_text(con, f"last {len(st.failed_log_tail)} lines of {st.failed_log}:")
        for line in st.failed_log_tail:
            con.print(log_line(line), markup=False, highlight=False, soft_wrap=True)


def _sweep(job_id: str, job_dir: str | None) -> SweepStatus | None:
    """A job array's (or a sweep directory's) status; None for one job."""
    from launchgen.readback import sweep as sweeps

    if job_dir is not None:
        return sweeps.from_dir(Path(job_dir)) if sweeps.is_sweep_dir(Path(job_dir)) else None
    job_id = job_id.strip()
    records = [] if job_id == LOCAL_JOB_ID else sweeps.array_records(job_id)
    if records:
        return sweeps.from_array(job_id, records)
    # a --bash sweep, or an array the controller forgot: the default output_dir below where this is run from
    cands = (Path.cwd(), Path.cwd() / "launchgen-runs" / job_id) if job_id == LOCAL_JOB_ID else \
        (Path.cwd() / "launchgen-runs" / job_id,)
    here = next((p for p in cands if sweeps.is_sweep_dir(p)), None)
    return sweeps.from_dir(here) if here is not None else None


def _num(v: float | None) -> str:
    return "" if v is None else f"{v:.4g}"


def _print_sweep(sw: SweepStatus, fmt: str) -> None:
    if fmt == "json":
        click.echo(json.dumps(sw.to_dict(), indent=2))
        return
    con = tables.console()
    over = sum(r.over for r in sw.rows)
    print_text(con, f"sweep {sw.sweep}: {len(sw.rows)} points, {over} over" + (": FAILED" if sw.failed else ""))
    t = Table(title="points")
    for col in ("#", "point", "task", "state", "steps", "reward", "loss", "attempts"):
        t.add_column(col)
    for r in sw.rows:
        t.add_row(str(r.index), escape(visible(r.name)), r.task or "", r.state, "" if r.steps is None else str(r.steps),
                  _num(r.reward), _num(r.loss), str(r.attempts))
    print_table(con, t, records_only=not con.is_terminal)
    for n in sw.notes:
        print_text(con, f"note: {n}")
    if any(r.task for r in sw.rows):
        print_text(con, "one point: launchgen status <its task's job id> (the task column)")
    else:
        print_text(con, f"one point: launchgen status local --job-dir {sw.sweep}/<point>")


@click.command("status")
@click.argument("job_id")
@click.option("--job-dir", type=click.Path(file_okay=False), default=None,
              help="The job's output directory, when the scheduler no longer knows the job.")
@click.option("--format", "fmt", type=click.Choice(["table", "json"]), default="table", show_default=True)
@click.option("-n", "--lines", type=click.IntRange(min=0), default=20, show_default=True,
              help="Lines of the failed role's log to show.")
def command(job_id: str, job_dir: str | None, fmt: str, lines: int) -> None:
    """Which role ended first and how, the last health check, the attempt, every log; for a failed job the log
    that explains it (the batch log when no step log does).

    JOB_ID is the SLURM job id, or `local` for a `render --bash` run (run it in the job directory, or in the
    directory above launchgen-runs/local, or pass --job-dir). Exit status: 0 running or completed, 3 the job is
    over and did not complete (FAILED, TIMEOUT, CANCELLED, ...; a local run that exited non-zero), 2 bad usage.
    Tables that do not fit the terminal (or a pipe's 80 columns) are printed one record a line.

    Works while the job runs and after it ends. Examples:

      launchgen status 1234

      launchgen status 1234 --format json | jq .summary

      launchgen status 1234 --job-dir launchgen-runs/1234

      launchgen status local
    """
    sweep = _sweep(job_id, job_dir)
    if sweep is not None:
        _print_sweep(sweep, fmt)
        if sweep.failed:
            sys.exit(EXIT_JOB_FAILED)
        return
    try:
        st = collect(job_id, job_dir, lines)
    except StatusError as e:
        fail(str(e))
    if fmt == "json":
        click.echo(json.dumps(st.to_dict(), indent=2))
    else:
        _print_rich(st)
    if st.failed:
        sys.exit(EXIT_JOB_FAILED)
