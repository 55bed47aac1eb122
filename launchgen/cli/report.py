"""`launchgen report JOB|DIR`: the run as one self-contained HTML page (timeline and training curves)."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import click

from launchgen.cli.errors import fail
from launchgen.shared import jobdir as J

HELP = """\
Write one HTML page about a job: its timeline (each role per node per attempt:
start, health, training steps, weight syncs, restarts, requeues, who ended
first and how) and its training curves (reward, KL, loss, step time split,
tokens/s, staleness), from what the job directory records. The page embeds
everything it needs (no network to view it). Needs plotly:
pip install 'launchgen[report]'.

JOB is a SLURM job id (its directory is found as `launchgen status` finds it),
`local` for a `render --bash` run, or the job directory itself.

\b
Examples:
  launchgen report 12345                # -> <job dir>/launchgen-report.html
  launchgen report launchgen-runs/local -o run.html
"""

REPORT_FILE = "launchgen-report.html"


def _resolve(job: str, job_dir: str | None) -> tuple[str, Path, object]:
    """(job id, job directory, its post-mortem)."""
    from launchgen.readback import postmortem, status

    path = Path(job)
    if job_dir is None and path.is_dir() and job != J.LOCAL_JOB_ID:
        if not J.is_job_dir(path):
            raise status.StatusError(f"{job} is not a launchgen job directory (no {J.PLAN_FILE} or logs)")
        from launchgen.readback.jobfiles import read_job_dir

        record = read_job_dir(path, True).record
        job_id = (record.job_id if record is not None else None) or path.name
        return job_id, path, postmortem.analyse(job_id, None, "not used", [], path, lines=0)
    if job_dir is None and not path.exists() and ("/" in job or job.startswith(".")):
        raise status.StatusError(f"{job}: no such directory")
    st = status.collect(job, job_dir, lines=0)
    if st.job_dir is None:
        raise status.StatusError(f"job {job}: its job directory was not found; pass --job-dir")
    return st.job_id, Path(st.job_dir), st


@click.command("report", help=HELP)
@click.argument("job", metavar="JOB|DIR")
@click.option("-o", "--output", type=click.Path(dir_okay=False, path_type=str), default=None,
              help=f"Write the page here (default: {REPORT_FILE} in the job directory).")
@click.option("--job-dir", type=click.Path(file_okay=False), default=None,
              help="The job's output directory, when the scheduler no longer knows the job.")
def command(job: str, output: str | None, job_dir: str | None) -> None:
    from launchgen.readback import postmortem, runreport
    from launchgen.readback.reporthtml import ReportDependencyError, render_page
    from launchgen.readback.status import StatusError

    try:
        job_id, directory, st = _resolve(job, job_dir)
        assert isinstance(st, postmortem.JobStatus)
        page = render_page(runreport.build(job_id, directory, st))
    except (StatusError, ReportDependencyError) as e:
        fail(str(e))
    target = Path(output) if output else directory / REPORT_FILE
    # written whole or not at all: a page cut short by a full disk would still open, showing less than was run
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", dir=target.parent or Path("."))
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(page)
        os.chmod(tmp, 0o644)
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    click.echo(f"wrote {target} ({len(page) // 1024} KiB)", err=True)
