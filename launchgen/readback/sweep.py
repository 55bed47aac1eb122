"""`launchgen status` of a sweep: one row per point (its state, steps, last reward and loss, attempts).

A sweep is found two ways: a SLURM job array (`scontrol show job -o <array id>` lists its tasks, each with its
own job id, whose directory `jobfiles.locate_job_dir` finds as for any job), or a directory whose children are
point job directories (`render --bash`, or an array the controller forgot: `--job-dir`). Either way each point's
directory holds the sweep's record (`shared.jobdir.SWEEP_FILE`): the names of every point, started or not.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field
from pathlib import Path

from launchgen.readback.jobfiles import locate_job_dir, read_job_dir, read_metrics
from launchgen.readback.postmortem import analyse
from launchgen.readback.slurmquery import (
    Runner,
    parse_scontrol_oneliner,
    run_command,
    scheduler_info_from_scontrol,
)
from launchgen.shared import jobdir as J

#: the metrics the table shows, as the trainers log them (`trainers/reporting.LINE_METRICS`)
REWARD, LOSS = "reward", "loss"


@dataclass
class PointRow:
    index: int
    name: str
    task: str | None  # the array task's own job id
    state: str
    steps: int | None
    reward: float | None
    loss: float | None
    attempts: int
    job_dir: str | None
    failed: bool
    over: bool


@dataclass
class SweepStatus:
    sweep: str  # the array's job id, or the sweep's directory
    rows: list[PointRow]
    notes: list[str] = field(default_factory=list)

    @property
    def failed(self) -> bool:
        """Every point is over and one did not complete (`status` exits 3)."""
        return all(r.over for r in self.rows) and any(r.failed for r in self.rows)

    def to_dict(self) -> dict[str, object]:
        return {"sweep": self.sweep, "failed": self.failed, "points": [asdict(r) for r in self.rows],
                "notes": self.notes}


def task_ids(spec: str) -> list[int]:
    """`ArrayTaskId` of one scontrol record: `3`, or a pending record's `3-5`, `1,4`, `[3-5]%2`."""
    out: list[int] = []
    for part in spec.strip("[]").split("%")[0].strip("[]").split(","):
        a, _, b = part.partition("-")
        if a.isdigit() and (not b or b.isdigit()):
            out.extend(range(int(a), int(b or a) + 1))
    return out


def _record(job_dir: Path) -> J.SweepRecord | None:
    try:
        return J.SweepRecord.from_text((job_dir / J.SWEEP_FILE).read_text())
    except OSError:
        return None


def _row(index: int, name: str, task: str | None, job_dir: Path | None, state: str, failed: bool, over: bool
         ) -> PointRow:
    steps = reward = loss = None
    attempts = 0
    if job_dir is not None:
        contents = read_job_dir(job_dir, over)
        metrics, _notes = read_metrics(job_dir, contents.record)
        if metrics:
            steps, reward, loss = metrics[-1].step, metrics[-1].values.get(REWARD), metrics[-1].values.get(LOSS)
        attempts = _attempts(job_dir)
    return PointRow(index, name, task, state, steps, reward, loss, attempts, str(job_dir) if job_dir else None,
                    failed, over)


def _attempts(job_dir: Path) -> int:
    """How many attempts the point's job directory has (`logs/attempt-<N>` folders: a requeue adds one)."""
    root = job_dir / J.DEFAULT_LAYOUT.logs_root()
    try:
        return sum(1 for d in root.iterdir() if d.is_dir() and J.attempt_of(d.name) is not None)
    except OSError:
        return 0


def _local_state(job_dir: Path) -> tuple[str, bool, bool]:
    """(state, failed, over) of a point run without a scheduler, from its job directory alone."""
    st = analyse(J.LOCAL_JOB_ID, None, "not used", [], job_dir, 0)
    record = read_job_dir(job_dir, None).record
    out = (record.layout_value("trainer_output_dir") if record else None) or J.DEFAULT_LAYOUT.trainer_output_dir
    if (job_dir / out / J.COMPLETE_MARKER).is_file():
        return "COMPLETED", False, True
    if st.failed:
        return "FAILED", True, True
    return ("RUNNING", False, False) if not st.over else ("STOPPED", False, True)


def is_sweep_dir(path: Path) -> bool:
    return path.is_dir() and not J.is_job_dir(path) and any((c / J.SWEEP_FILE).is_file() for c in _children(path))


def _children(path: Path) -> list[Path]:
    try:
        return sorted(c for c in path.iterdir() if c.is_dir())
    except OSError:
        return []


def from_dir(path: Path) -> SweepStatus:
    """A sweep's directory (its points' job directories below it, by name)."""
    found = {c.name: (c, rec) for c in _children(path) if (rec := _record(c)) is not None}
    table = next((rec.points for _c, rec in found.values()), ())
    rows = []
    for index, name, _values in table:
        job_dir = found[name][0] if name in found else None
        if job_dir is None:
            rows.append(PointRow(index, name, None, "NOT STARTED", None, None, None, 0, None, False, False))
            continue
        state, failed, over = _local_state(job_dir)
        rows.append(_row(index, name, None, job_dir, state, failed, over))
    return SweepStatus(str(path), rows)


def array_records(array_id: str, run: Runner = run_command) -> list[dict[str, str]]:
    """scontrol's records of the tasks of job array `array_id` (empty when it is not one, or is forgotten)."""
    if not re.fullmatch(r"\d+", array_id):
        return []
    rc, out, _err = run(["scontrol", "show", "job", "-o", array_id])
    if rc != 0:
        return []
    return [r for r in parse_scontrol_oneliner(out) if r.get("ArrayJobId") == array_id and r.get("ArrayTaskId")]


def from_array(array_id: str, records: list[dict[str, str]], run: Runner = run_command) -> SweepStatus:
    """A job array's points: each task's scheduler state, and what its job directory says."""
    rows: dict[int, PointRow] = {}
    names: dict[int, str] = {}
    pending: list[tuple[int, str]] = []
    for rec in records:
        info = scheduler_info_from_scontrol(rec)
        state = (info.state or "?").split()[0]
        tasks = task_ids(rec.get("ArrayTaskId", ""))
        if len(tasks) != 1 or (state == "PENDING" and not info.restarts):
            pending += [(t, state) for t in tasks]
            continue
        job_dir = locate_job_dir(info.job_id, info, None, run)
        st = analyse(info.job_id, info, "not read", [], job_dir, 0)
        record = _record(job_dir) if job_dir is not None else None
        if record is not None:
            names.update({i: n for i, n, _v in record.points})
        rows[tasks[0]] = _row(tasks[0], "", info.job_id, job_dir, state, st.failed, info.finished)
    for t, state in pending:
        rows[t] = PointRow(t, "", None, state, None, None, None, 0, None, False, False)
    for t, row in rows.items():
        row.name = names.get(t, f"task {t}")
    notes = [] if names else ["no point's job directory found yet: names appear once a task has started"]
    return SweepStatus(array_id, [rows[t] for t in sorted(rows)], notes)
