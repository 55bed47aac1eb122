"""Role-aware post-mortem of a launchgen job: `launchgen status JOBID` and `launchgen logs JOBID`.

Sources, best first, all optional except a way to find the job directory:

* the scheduler (`launchgen.readback.slurmquery`): `scontrol show job -o` while the controller still remembers the job,
  else `sacct` (only when accounting storage is on; the report says when it is not);
* the job directory the rendered script writes (`launchgen.readback.jobfiles`, in the format `launchgen.shared.jobdir` owns),
  found through the job's StdOut/WorkDir, or `--job-dir`.

`launchgen.readback.postmortem` judges what they say. This module puts them together for the CLI verbs; the names the
verbs and tests use are re-exported here. Nothing here imports torch or any trainer code: it runs on a login
node.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from launchgen.readback.jobfiles import RoleLog as RoleLog
from launchgen.readback.jobfiles import StatusError as StatusError
from launchgen.readback.jobfiles import local_job_dir, locate_job_dir, read_server_ranks
from launchgen.readback.jobfiles import parse_events_text as parse_events_text
from launchgen.readback.jobfiles import tail as tail
from launchgen.readback.postmortem import JobStatus as JobStatus
from launchgen.readback.postmortem import analyse as analyse
from launchgen.readback.slurmquery import SchedulerInfo as SchedulerInfo
from launchgen.readback.slurmquery import parse_sacct as parse_sacct
from launchgen.readback.slurmquery import parse_scontrol_oneliner as parse_scontrol_oneliner
from launchgen.readback.slurmquery import query_sacct, query_scontrol, run_command
from launchgen.readback.slurmquery import scheduler_info_from_scontrol as scheduler_info_from_scontrol
from launchgen.shared import jobdir as J
from launchgen.shared.jobdir import DEFAULT_LAYOUT
from launchgen.shared.jobdir import LOCAL_JOB_ID as LOCAL_JOB_ID
from launchgen.shared.jobdir import ROLES as ROLES

#: `launchgen logs --role batch`: the batch script's own output
BATCH_ROLE = "batch"
#: how scheduler commands run (one place to replace them)
_run = run_command


def collect(job_id: str, job_dir: str | Path | None = None, lines: int = 20) -> JobStatus:
    """Everything `launchgen status` shows, from whatever sources answer."""
    job_id = job_id.strip()
    if job_id == LOCAL_JOB_ID:
        return _collect_local(job_dir, lines)
    if not re.fullmatch(r"\d+(?:_\d+)?", job_id):
        raise StatusError(f"JOBID {job_id!r}: expected a numeric SLURM job id (as printed by sbatch), or "
                          f"{LOCAL_JOB_ID!r} for a `render --bash` run")
    info = query_scontrol(job_id, _run)
    sacct_info, steps, why_not = query_sacct(job_id, _run)
    accounting = "on" if why_not is None else f"off or empty: {why_not}"
    if info is None:
        info = sacct_info
    jd = locate_job_dir(job_id, info, job_dir, _run)
    if info is None and jd is None:
        raise StatusError(
            f"job {job_id} is unknown to scontrol (finished more than MinJobAge ago?) and sacct "
            f"({why_not or 'no record'}); pass --job-dir with the job's output directory"
        )
    st = analyse(job_id, info, accounting, steps, jd, lines)
    if jd is None:
        st.notes.insert(0, "job directory not found from the job's StdOut/WorkDir; pass --job-dir")
    return st


def _collect_local(job_dir: str | Path | None, lines: int) -> JobStatus:
    return analyse(LOCAL_JOB_ID, None, "not used (a local --bash run)", [], local_job_dir(job_dir), lines)


def select_log(st: JobStatus, role: str, node: str | None, attempt: int | None, rank: int | None = None) -> RoleLog:
    """The log `launchgen logs` prints: role, then node (name or position) or the server's rank, then attempt
    (default: latest). `batch` is the batch script's own output (sbatch --output), the one record of a script
    that died early."""
    if role == BATCH_ROLE:
        if st.batch_log is None:
            raise StatusError(f"no batch log found for job {st.job_id} (a --bash run prints to its terminal)")
        size = Path(st.batch_log).stat().st_size if Path(st.batch_log).is_file() else 0
        host = st.scheduler.batch_host if st.scheduler and st.scheduler.batch_host else "batch host"
        return RoleLog(BATCH_ROLE, host, st.attempt or 0, st.batch_log, size, 0.0)
    if role not in ROLES:
        raise StatusError(f"--role {role!r}: use server, trainer or {BATCH_ROLE}")
    cands = [lg for lg in st.logs if lg.role == role]
    if not cands:
        where = st.job_dir or "(job directory not found; pass --job-dir)"
        batch = f"; the batch log ({st.batch_log}) may say why: --role {BATCH_ROLE}" if st.batch_log else ""
        raise StatusError(f"no {role} log under {where}/{DEFAULT_LAYOUT.log_dir.format(attempt='*')}/{batch}")
    atts = sorted({lg.attempt for lg in cands})
    want = attempt if attempt is not None else atts[-1]
    cands = [lg for lg in cands if lg.attempt == want]
    if not cands:
        raise StatusError(f"--attempt {attempt}: {role} logs exist for attempts {', '.join(map(str, atts))}")
    if rank is not None:
        return _rank_log(st, role, rank, want, cands)
    if node is None:
        return cands[0]
    named = [lg for lg in cands if lg.node == node]
    if named:
        return named[0]
    if node.isdigit() and int(node) < len(cands):
        return cands[int(node)]
    raise StatusError(f"--node {node}: {role} ran on {', '.join(lg.node for lg in cands)} in attempt {want}")


def planned_server_ranks(st: JobStatus) -> int:
    """The ranks of the first server replica in the job's run record: its nodes (1 where it has no record)."""
    try:
        record = J.RunRecord.from_json(json.loads(Path(st.plan_file or "").read_text()))
        return max(1, len(record.plan["server"]["replicas"][0]["positions"]))
    except (OSError, ValueError, KeyError, IndexError, TypeError):
        return 1


def _rank_log(st: JobStatus, role: str, rank: int, attempt: int, cands: list[RoleLog]) -> RoleLog:
    """The log of the first replica's server rank `rank`: its node from the attempt's rank files (a server
    on one node records none, and is rank 0)."""
    first = [lg for lg in cands if lg.replica == 0]
    if role != "server":
        raise StatusError(f"--rank {rank}: only the server has ranks (use --node for the {role})")
    ranks = [r for r in read_server_ranks(Path(st.job_dir), attempt) if r.role == role] if st.job_dir else []
    if not ranks and planned_server_ranks(st) == 1:
        if rank == 0 and first:
            return first[0]
        raise StatusError(f"--rank {rank}: the server ran on one node in attempt {attempt}: it has rank 0 only")
    mine = next((r for r in ranks if r.rank == rank), None)
    if mine is None or mine.node is None:
        known = ", ".join(f"{r.rank} ({r.node})" for r in ranks if r.node)
        raise StatusError(f"--rank {rank}: the server's ranks in attempt {attempt} are {known or 'none yet'}")
    log = next((lg for lg in first if lg.node == mine.node), None)
    if log is None:
        raise StatusError(f"--rank {rank}: it ran on {mine.node}, but its log is not there: "
                          f"{st.job_dir}/{DEFAULT_LAYOUT.role_log(role, attempt, mine.node)}")
    return log
