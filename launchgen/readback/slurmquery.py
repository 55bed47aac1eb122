"""What the scheduler says about a job: `scontrol show job -o` while the controller remembers it, else `sacct`
(only when accounting storage is on). Parsing is pure; the queries take the command runner as an argument, so
tests and callers choose how commands run.

Nothing here reads the job directory (`launchgen.readback.jobfiles`) or judges the job (`launchgen.readback.postmortem`).
"""

from __future__ import annotations

import re
import shutil
import subprocess
from collections.abc import Callable
from dataclasses import dataclass

#: runs a command: argv -> (status, stdout, stderr)
Runner = Callable[[list[str]], tuple[int, str, str]]
# `Key=value` pairs of `scontrol -o`; values may contain spaces (Command=, WorkDir=), so a pair ends only
# where the next ` Key=` begins. Keys include `/` and `:` (`CPUs/Task`, `ReqB:S:C:T`).
_SCONTROL_PAIR_RE = re.compile(r"(?:^| )([A-Za-z][A-Za-z0-9_/:]*)=(.*?)(?= [A-Za-z][A-Za-z0-9_/:]*=|$)")
FINISHED_STATES = frozenset(
    {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "PREEMPTED",
     "BOOT_FAIL", "DEADLINE", "REVOKED", "SPECIAL_EXIT"}
)


@dataclass
class SchedulerInfo:
    source: str  # "scontrol" or "sacct"
    job_id: str
    job_name: str | None = None
    state: str | None = None
    reason: str | None = None
    exit_code: int | None = None
    exit_signal: int | None = None
    restarts: int | None = None
    run_time: str | None = None
    time_limit: str | None = None
    start_time: str | None = None
    end_time: str | None = None
    node_list: str | None = None
    batch_host: str | None = None
    work_dir: str | None = None
    std_out: str | None = None
    std_err: str | None = None

    @property
    def finished(self) -> bool:
        return (self.state or "").split()[0] in FINISHED_STATES if self.state else False


@dataclass
class StepInfo:
    """One row of `sacct` for a step of the job (accounting only)."""

    step_id: str
    name: str
    state: str
    exit_code: int | None
    exit_signal: int | None
    start: str | None
    end: str | None
    node_list: str | None
    role: str | None = None


def parse_scontrol_oneliner(text: str) -> list[dict[str, str]]:
    """`scontrol show job -o` output -> one dict per line (a het job prints one line per component)."""
    records = []
    for line in text.splitlines():
        line = line.strip()
        if not line.startswith("JobId="):
            continue
        records.append({k: v for k, v in _SCONTROL_PAIR_RE.findall(line)})
    return records


def _split_exit(value: str | None) -> tuple[int | None, int | None]:
    if not value or ":" not in value:
        return None, None
    a, _, b = value.partition(":")
    try:
        return int(a), int(b)
    except ValueError:
        return None, None


def _null(v: str | None) -> str | None:
    return None if v in (None, "", "(null)", "None", "Unknown", "N/A") else v


def scheduler_info_from_scontrol(rec: dict[str, str]) -> SchedulerInfo:
    code, sig = _split_exit(rec.get("ExitCode"))
    restarts = rec.get("Restarts")
    return SchedulerInfo(
        source="scontrol",
        job_id=rec.get("JobId", ""),
        job_name=_null(rec.get("JobName")),
        state=_null(rec.get("JobState")),
        reason=_null(rec.get("Reason")),
        exit_code=code,
        exit_signal=sig,
        restarts=int(restarts) if restarts and restarts.isdigit() else None,
        run_time=_null(rec.get("RunTime")),
        time_limit=_null(rec.get("TimeLimit")),
        start_time=_null(rec.get("StartTime")),
        end_time=_null(rec.get("EndTime")),
        node_list=_null(rec.get("NodeList")),
        batch_host=_null(rec.get("BatchHost")),
        work_dir=_null(rec.get("WorkDir")),
        std_out=_null(rec.get("StdOut")),
        std_err=_null(rec.get("StdErr")),
    )


SACCT_FIELDS = ("JobID", "JobName", "State", "ExitCode", "Start", "End", "NodeList", "WorkDir")


def parse_sacct(text: str, job_id: str) -> tuple[SchedulerInfo | None, list[StepInfo]]:
    """`sacct -P -n --format=<SACCT_FIELDS>` -> the job's allocation row (latest run) and its steps.

    With `-D` a requeued job has one allocation row per run; the last one is the current run, and the
    count of rows before it is the number of restarts.
    """
    alloc_rows: list[list[str]] = []
    steps: list[StepInfo] = []
    for line in text.splitlines():
        cols = line.split("|")
        if len(cols) < len(SACCT_FIELDS):
            continue
        jid, name, state, exit_code, start, end, nodes, work_dir = cols[: len(SACCT_FIELDS)]
        base, _, step = jid.partition(".")
        if base.split("+")[0] != job_id:
            continue
        if not step:
            alloc_rows.append(cols)
            steps = []  # steps listed after this row belong to this run
            continue
        code, sig = _split_exit(exit_code)
        steps.append(
            StepInfo(step_id=step, name=name, state=state, exit_code=code, exit_signal=sig,
                     start=_null(start), end=_null(end), node_list=_null(nodes))
        )
    if not alloc_rows:
        return None, steps
    jid, name, state, exit_code, start, end, nodes, work_dir = alloc_rows[-1][: len(SACCT_FIELDS)]
    code, sig = _split_exit(exit_code)
    info = SchedulerInfo(
        source="sacct", job_id=job_id, job_name=_null(name), state=_null(state), exit_code=code,
        exit_signal=sig, restarts=len(alloc_rows) - 1, start_time=_null(start), end_time=_null(end),
        node_list=_null(nodes), work_dir=_null(work_dir),
    )
    return info, steps


def run_command(cmd: list[str], timeout: float = 20.0) -> tuple[int, str, str]:
    """-> (status, stdout, stderr); 127 when the command is missing, 124 when it timed out."""
    if shutil.which(cmd[0]) is None:
        return 127, "", f"{cmd[0]}: command not found"
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        return 124, "", f"{' '.join(cmd)} timed out after {timeout:.0f}s"
    return p.returncode, p.stdout, p.stderr


def query_scontrol(job_id: str, run: Runner = run_command) -> SchedulerInfo | None:
    rc, out, _err = run(["scontrol", "show", "job", "-o", job_id])
    if rc != 0:
        return None
    recs = parse_scontrol_oneliner(out)
    if not recs:
        return None
    # a het job: the leader's line carries the batch script's ExitCode/StdOut
    return scheduler_info_from_scontrol(recs[0])


def query_sacct(job_id: str, run: Runner = run_command) -> tuple[SchedulerInfo | None, list[StepInfo], str | None]:
    """-> (job row, steps, why accounting gave nothing or None)."""
    rc, out, err = run(["sacct", "-j", job_id, "-D", "-P", "-n", f"--format={','.join(SACCT_FIELDS)}"])
    if rc != 0 or "accounting storage is disabled" in (err + out):
        msg = (err or out).strip().splitlines()
        return None, [], msg[0] if msg else f"sacct exited {rc}"
    info, steps = parse_sacct(out, job_id)
    if info is None:
        return None, steps, f"sacct has no record of job {job_id}"
    return info, steps, None


def batch_script(job_id: str, run: Runner = run_command) -> str | None:
    """The job's batch script (`scontrol write batch_script`), while the controller knows the job."""
    rc, out, _ = run(["scontrol", "write", "batch_script", job_id, "-"])
    return out if rc == 0 else None
