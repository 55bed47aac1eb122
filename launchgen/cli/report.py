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
`local` for a `render --bash` run, or the job directory itself. A sweep (a job
array's id, or a sweep's directory), or several JOBs, give one page that
overlays the runs' curves and tabulates their final metrics.

\b
Examples:
  launchgen report 12345                # -> <job dir>/launchgen-report.html
  launchgen report launchgen-runs/local -o run.html
  launchgen report 12345 12350          # two runs compared on one page
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


def _sweep_runs(job: str, job_dir: str | None) -> tuple[str, Path, list[tuple[str, Path]]] | None:
    """(title, where the page goes, (point, job directory) of each point that started) of a sweep; None for one job."""
    from launchgen.readback import sweep as sweeps

    home = next((p for p in (Path(job_dir or job), Path("launchgen-runs") / job) if sweeps.is_sweep_dir(p)), None)
    if home is not None:
        st = sweeps.from_dir(home)
    elif job_dir is None and (records := sweeps.array_records(job)):
        st = sweeps.from_array(job, records)
        found = [Path(r.job_dir) for r in st.rows if r.job_dir]
        home = found[0].parent if found else Path(".")
    else:
        return None
    return f"sweep {st.sweep}", home, [(r.name, Path(r.job_dir)) for r in st.rows if r.job_dir]


def _write(target: Path, page: str) -> None:
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


@click.command("report", help=HELP)
@click.argument("jobs", metavar="JOB|DIR...", nargs=-1, required=True)
@click.option("-o", "--output", type=click.Path(dir_okay=False, path_type=str), default=None,
              help=f"Write the page here (default: {REPORT_FILE} in the job directory).")
@click.option("--job-dir", type=click.Path(file_okay=False), default=None,
              help="The job's output directory, when the scheduler no longer knows the job.")
def command(jobs: tuple[str, ...], output: str | None, job_dir: str | None) -> None:
    from launchgen.readback import postmortem, runreport
    from launchgen.readback.reporthtml import ReportDependencyError, render_comparison, render_page
    from launchgen.readback.status import StatusError

    try:
        sweep = _sweep_runs(jobs[0], job_dir) if len(jobs) == 1 else None
        if sweep is not None or len(jobs) > 1:
            if sweep is None:
                runs = [(job_id, directory) for job_id, directory, _st in (_resolve(j, None) for j in jobs)]
                sweep = (f"{len(runs)} runs", Path("."), runs)
            title, home, runs = sweep
            if not runs:
                raise StatusError(f"{title}: no point has a job directory yet")
            _write(Path(output) if output else home / REPORT_FILE,
                   render_comparison(runreport.compare(title, runs)))
            return
        job_id, directory, st = _resolve(jobs[0], job_dir)
        assert isinstance(st, postmortem.JobStatus)
        page = render_page(runreport.build(job_id, directory, st))
    except (StatusError, ReportDependencyError) as e:
        fail(str(e))
    _write(Path(output) if output else directory / REPORT_FILE, page)
