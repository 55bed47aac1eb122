"""Reading a job directory for `launchgen status` / `logs`: finding it, its run record, its events and logs.

Every name and format comes from `launchgen.shared.jobdir` (the contract); this module turns what it reads into the
post-mortem's vocabulary (`Event`, `RoleLog`). Nothing here asks the scheduler except through the runner a
caller passes (`locate_job_dir`), nor judges the job (`launchgen.readback.postmortem`).
"""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

from launchgen.readback.slurmquery import Runner, SchedulerInfo, batch_script, run_command
from launchgen.shared import jobdir as J


class StatusError(Exception):
    """A post-mortem cannot be made; the message says what to pass instead."""


# ------------------------------------------------------------------------------------------------ events ---


class Seen:
    """What the post-mortem knows happened: the script's events (`launchgen.shared.jobdir.Ev`) mapped onto these."""

    ATTEMPT_START = "attempt_start"
    STEP_START = "step_start"
    HEALTH_OK = "health_ok"
    HEALTH_TIMEOUT = "health_timeout"
    SERVER_DIED = "server_died"
    STEP_EXIT = "step_exit"
    SIGNAL = "signal"
    REQUEUE = "requeue"
    REQUEUE_REFUSED = "requeue_refused"
    JOB_END = "job_end"
    PREFLIGHT = "preflight"  # the in-allocation preflight's verdict (status, codes, seconds)
    REPLICA_RESTART = "replica_restart"  # a replica died and the script starts it again (vllm.restart_replicas)


@dataclass
class Event:
    ts: float | None
    event: str
    role: str | None
    node: str | None
    attempt: int | None
    exit_code: int | None
    signal: str | None
    message: str | None
    raw: dict[str, Any]


def _as_int(v: Any) -> int | None:
    if isinstance(v, bool):
        return None
    if isinstance(v, int):
        return v
    if isinstance(v, str) and re.fullmatch(r"-?\d+", v.strip()):
        return int(v)
    return None


def _str_or_none(v: Any) -> str | None:
    return v if isinstance(v, str) else None


def _server_failed(e: J.EventLine) -> tuple[str, str | None, dict[str, Any]]:
    rank, node = e.fields.get("rank"), e.fields.get("node")
    if rank is not None:  # a replica over several nodes: the rank that ended first or never joined
        what = "never joined the engine" if J.Ev.HEALTH_TIMEOUT in e.words else f"exited ({e.fields.get('exit', '?')})"
        return Seen.SERVER_DIED, "server", {"exit_code": e.fields.get("exit"),
                                           "message": f"server rank {rank} on node {node} {what}"}
    if J.Ev.HEALTH_TIMEOUT in e.words:
        return Seen.HEALTH_TIMEOUT, "server", {}
    if J.Ev.HEALTH_LOST in e.words:
        return Seen.SERVER_DIED, "server", {"message": "stopped answering /health after it was healthy (hung): "
                                                       "the supervisor stopped everything"}
    if J.Ev.UNHEALTHY in e.words:
        return Seen.SERVER_DIED, "server", {"message": "answered /health with an error status after it was healthy "
                                                       "(vLLM: its engine died): the supervisor stopped everything"}
    return Seen.SERVER_DIED, "server", {"exit_code": e.fields.get("exit")}


#: the script's event -> (what it means, the role it is about, extra fields)
_MEANING = {
    J.Ev.START: lambda e: (Seen.ATTEMPT_START, "job", {}),
    J.Ev.SERVER_START: lambda e: (Seen.STEP_START, "server", {"nodes": e.fields.get("nodes")}),
    J.Ev.TRAINER_START: lambda e: (Seen.STEP_START, "trainer", {"nodes": e.fields.get("nodes")}),
    J.Ev.SERVER_HEALTHY: lambda e: (Seen.HEALTH_OK, "server",
                                    {"message": f"healthy after {e.fields.get('after', '?')}"}),
    J.Ev.SERVER_FAILED: _server_failed,
    J.Ev.REPLICA_RESTART: lambda e: (Seen.REPLICA_RESTART, "server",
                                     {"exit_code": e.fields.get("exit"),
                                      "message": f"replica {e.fields.get('replica', '?')} died (exit "
                                                 f"{e.fields.get('exit', '?')}) and is restarted "
                                                 f"(restart {e.fields.get('restart', '?')})"}),
    J.Ev.TRAINER_EXIT: lambda e: (Seen.STEP_EXIT, "trainer", {"exit_code": e.fields.get("status")}),
    J.Ev.USR2: lambda e: (Seen.SIGNAL, "job", {"signal": "USR2"}),
    J.Ev.SIGNAL: lambda e: (Seen.SIGNAL, "job", {"signal": e.words[0] if e.words else None}),
    J.Ev.REQUEUE: lambda e: (Seen.REQUEUE, "job", {"restart_count": e.fields.get("restart")}),
    J.Ev.REQUEUE_CAP: lambda e: (Seen.REQUEUE_REFUSED, "job", {"message": "slurm.max_restarts reached"}),
    J.Ev.EXIT: lambda e: (Seen.JOB_END, "job", {"exit_code": e.fields.get("status")}),
    J.Ev.PREFLIGHT: lambda e: (Seen.PREFLIGHT, "job", {"message": e.fields.get("status")}),
}


def _event_from_line(e: J.EventLine, attempt: int | None) -> Event:
    meaning = _MEANING.get(e.name)
    name, role, extra = meaning(e) if meaning else (e.name, None, {})
    raw: dict[str, Any] = {"event": name, "ts": e.text.split()[0], "role": role, "attempt": attempt,
                           "text": e.text, **e.fields, **{k: v for k, v in extra.items() if v is not None}}
    # a multi-node server's failure names its rank's node (server_failed ... node=<name>): that node's log explains it
    return Event(ts=e.ts, event=name, role=role, node=_str_or_none(e.fields.get("node")), attempt=attempt,
                 exit_code=_as_int(raw.get("exit_code")),
                 signal=_str_or_none(raw.get("signal")), message=_str_or_none(raw.get("message")), raw=raw)


def parse_events_text(text: str, attempt: int | None) -> list[Event]:
    """An attempt's events.log, as the rendered script writes it (launchgen.shared.jobdir's event lines)."""
    return [_event_from_line(e, attempt) for e in J.parse_events(text)]


# -------------------------------------------------------------------------------------------------- logs ---


@dataclass
class RoleLog:
    role: str
    node: str
    attempt: int
    path: str
    size: int
    mtime: float
    #: the `vllm.replicas` replica a server log belongs to (0 for the first replica and every trainer log)
    replica: int = 0

    @property
    def name(self) -> str:
        """The role as the script names it: `server-r1` for replica 1's server log."""
        return J.replica_role(self.replica) if self.role == "server" else self.role


def find_logs(job_dir: Path) -> list[RoleLog]:
    """Every `<role>-<node>.log` of every `attempt-<N>` folder."""
    logs: list[RoleLog] = []
    base = job_dir / J.DEFAULT_LAYOUT.logs_root()
    if not base.is_dir():
        return logs
    for adir in sorted(base.iterdir()):
        n = J.attempt_of(adir.name)
        if n is None or not adir.is_dir():
            continue
        for f in sorted(adir.iterdir()):
            rn = J.role_log_of(f.name)
            if rn and f.is_file():
                st = f.stat()
                logs.append(RoleLog(rn[0], rn[1], n, str(f), st.st_size, st.st_mtime, rn[2]))
    return logs


@dataclass(frozen=True)
class ServerRank:
    """One rank of a server replica over several nodes, from its `<role>.rank<K>.*` files of one attempt."""

    role: str  # server, server-r<k>
    rank: int
    node: str | None  # None: no `.node` file (the rank's step never reached its node)
    exit_code: int | None  # None: still running, or killed before it could write `.exit`


def read_server_ranks(job_dir: Path, attempt: int) -> list[ServerRank]:
    """Every rank an attempt's pid directory records, by role then rank; empty for a one-node server."""
    pid_dir = job_dir / J.DEFAULT_LAYOUT.pid_dir.format(attempt=attempt)
    found: dict[tuple[str, int], dict[str, str]] = {}
    for f in sorted(pid_dir.iterdir()) if pid_dir.is_dir() else []:
        if (rf := J.server_rank_file_of(f.name)) and f.is_file():
            found.setdefault(rf[:2], {})[rf[2]] = f.read_text(errors="replace").strip()
    return [ServerRank(role, rank, files.get("node") or None, _as_int(files.get("exit")))
            for (role, rank), files in sorted(found.items())]


def last_lines_start(fh: BinaryIO, lines: int) -> int:
    """Byte offset where the last `lines` lines of an open binary file begin (0 for `lines` <= 0 or fewer lines),
    read from the end in blocks so huge logs stay cheap. A final newline ends a line, it starts none."""
    pos = fh.seek(0, 2)
    if lines <= 0:
        return 0
    data = b""
    while pos > 0 and data.count(b"\n") <= lines:
        step = min(8192, pos)
        pos -= step
        fh.seek(pos)
        data = fh.read(step) + data
    body = data[:-1] if data.endswith(b"\n") else data
    idx = len(body)
    for _ in range(lines):
        idx = body.rfind(b"\n", 0, idx)
        if idx < 0:
            return 0
    return pos + idx + 1


def tail(path: str | Path, lines: int) -> list[str]:
    """Last `lines` lines of a text file (0: all)."""
    with Path(path).open("rb") as fh:
        fh.seek(last_lines_start(fh, lines))
        data = fh.read()
    return data.decode("utf-8", errors="replace").splitlines()


#: How much of a failed role's log `trainer_reason` reads: the reason is among the last lines a trainer writes.
_REASON_TAIL_LINES = 400


def trainer_reason(path: str | Path | None) -> str | None:
    """The trainer's own one-line reason for failing (`jobdir.trainer_error`), from the end of its log."""
    try:
        return J.trainer_error("\n".join(tail(path, _REASON_TAIL_LINES))) if path else None
    except OSError:
        return None


# ------------------------------------------------------------------------------------- finding the dir ---

_OUTPUT_DIR_RE = re.compile(rf"^{J.OUTPUT_DIR_VAR}=(.+)$", re.M)


def _job_dir_from_batch_log(path: Path) -> Path | None:
    """The rendered script announces its job directory in the batch log (StdOut)."""
    try:
        with path.open("rb") as fh:
            head = fh.read(256 * 1024).decode("utf-8", errors="replace")
    except OSError:
        return None
    found = J.announced_job_dirs(head)
    return Path(found[-1]) if found else None


def _job_dir_from_script(job_id: str, work: Path | None, run: Runner) -> Path | None:
    """The batch script (while the controller knows the job) -> the output directory it sets."""
    script = batch_script(job_id, run)
    m = _OUTPUT_DIR_RE.search(script) if script else None
    if not m:
        return None
    try:
        words = shlex.split(m.group(1))
    except ValueError:
        return None
    if len(words) != 1:
        return None
    p = Path(words[0].replace("%j", job_id))
    return p if p.is_absolute() or work is None else work / p


def _stream_path(stream: str, job_id: str, work: Path | None) -> Path:
    p = Path(stream.replace("%j", job_id))
    return p if p.is_absolute() or work is None else work / p


def _candidate_dirs(job_id: str, info: SchedulerInfo | None, run: Runner) -> Iterable[Path]:
    if info is None:
        return []
    work = Path(info.work_dir) if info.work_dir else None
    streams = [s for s in (info.std_out, info.std_err) if s]
    out = [d for s in streams if (d := _job_dir_from_batch_log(_stream_path(s, job_id, work))) is not None]
    from_script = _job_dir_from_script(job_id, work, run)
    if from_script is not None:
        out.append(from_script)
    for s in streams:
        p = _stream_path(s, job_id, work)
        # the plan may sit beside the stream file or a level or two above (logs/ subfolder)
        out.extend([p.parent, p.parent.parent, p.parent.parent.parent])
    if work is not None:
        out.extend([work / "launchgen-runs" / job_id, work])
        out.extend(sorted(work.glob(f"*/{job_id}")))
    return out


def locate_job_dir(job_id: str, info: SchedulerInfo | None, explicit: str | Path | None,
                   run: Runner = run_command) -> Path | None:
    if explicit is not None:
        p = Path(explicit)
        if not p.is_dir():
            raise StatusError(f"--job-dir {p}: no such directory")
        return p
    return next((c for c in _candidate_dirs(job_id, info, run) if J.is_job_dir(c)), None)


def local_job_dir(explicit: str | Path | None) -> Path:
    """A `--bash` run's job directory: --job-dir, else the current directory when it is one, else the default
    output_dir (`launchgen-runs/local`) below it."""
    if explicit is not None:
        return locate_job_dir(J.LOCAL_JOB_ID, None, explicit) or Path(explicit)
    here = Path.cwd()
    for cand in (here, here / "launchgen-runs" / J.LOCAL_JOB_ID):
        if J.is_job_dir(cand):
            return cand
    raise StatusError(f"no job directory of a local run here ({here}) nor in launchgen-runs/{J.LOCAL_JOB_ID}/: "
                      "run the command in the job directory, or pass --job-dir")


# ------------------------------------------------------------------------------------------ reading it ---


@dataclass
class JobDirContents:
    record: J.RunRecord | None = None
    plan_file: str | None = None
    events: list[Event] = field(default_factory=list)
    events_file: str | None = None
    logs: list[RoleLog] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def _read_record(job_dir: Path, out: JobDirContents, finished: bool | None) -> None:
    names = (J.DEFAULT_LAYOUT.plan_json, J.DEFAULT_LAYOUT.plan_static_json)
    pf = next((job_dir / n for n in names if (job_dir / n).is_file()), None)
    if pf is not None:
        out.plan_file = str(pf)
        try:
            loaded = json.loads(pf.read_text())
            out.record = J.RunRecord.from_json(loaded) if isinstance(loaded, dict) else None
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            out.notes.append(f"{pf}: not valid JSON ({exc})")
    if pf is not None and pf.name == J.PLAN_FILE:
        return
    if pf is not None and finished:
        out.notes.append(f"the job ended before it wrote {J.PLAN_FILE} (in its first lines: the job directory, "
                         "slurm.setup); the batch log says why")
    elif pf is not None:
        out.notes.append(f"no {J.PLAN_FILE} in {job_dir} yet: the job is starting (or stopped in its first lines)")
    else:
        out.notes.append(f"no {J.PLAN_FILE} in {job_dir} (the job has not started yet, or was not rendered by "
                         "launchgen)")


def _read_events(job_dir: Path, out: JobDirContents) -> None:
    pattern = J.DEFAULT_LAYOUT.events_log.format(attempt="*")
    texts = [(n, tf) for tf in job_dir.glob(pattern) if (n := J.attempt_of(tf.parent.name)) is not None]
    for n, tf in sorted(texts, key=lambda x: x[0]):
        out.events_file = out.events_file or str(job_dir / pattern)
        out.events.extend(parse_events_text(tf.read_text(errors="replace"), n))
    if out.events_file is None:
        out.notes.append(f"no events log in {job_dir}: role outcomes are inferred from logs and the scheduler")


def read_job_dir(job_dir: Path | None, finished: bool | None) -> JobDirContents:
    out = JobDirContents()
    if job_dir is None:
        return out
    _read_record(job_dir, out, finished)
    _read_events(job_dir, out)
    out.logs = find_logs(job_dir)
    return out


def find_batch_log(job_id: str, info: SchedulerInfo | None, record: J.RunRecord | None,
                   job_dir: Path | None) -> str | None:
    """The batch script's output file: the run record's, the scheduler's StdOut, or the plan's `--output` name
    in the submit directory (WorkDir, else the folders above the job directory)."""
    cands: list[Path] = []
    recorded = record.batch_log() if record else None
    if recorded:
        cands.append(Path(recorded))
    work = Path(info.work_dir) if info is not None and info.work_dir else None
    if info is not None and info.std_out:
        cands.append(_stream_path(info.std_out, job_id, work))
    name = record.layout_value("batch_log") if record else None
    if name:
        rel = name.replace("%j", job_id)
        dirs = [work] if work is not None else []
        if job_dir is not None:
            dirs += [job_dir, *list(job_dir.resolve().parents)[:3]]
        cands += [d / rel for d in dirs]
    return next((str(c) for c in cands if c.is_file()), None)


# ------------------------------------------------------------------------------------ trainer metrics ---


@dataclass
class MetricsRecord:
    """One logging step of the trainer's metrics.jsonl: its numbers (None for a NaN the trainer wrote as null)
    and, from trainers that stamp it (`jobdir.METRICS_WALL_KEY`), when it was written."""

    step: int
    wall: float | None
    values: dict[str, float | None]


def metrics_file(job_dir: Path, record: J.RunRecord | None) -> Path:
    """The trainer's metrics.jsonl: in the plan's trainer output directory (relative to the job directory)."""
    out = (record.layout_value("trainer_output_dir") if record else None) or J.DEFAULT_LAYOUT.trainer_output_dir
    return job_dir / out / J.METRICS_FILE


def read_metrics(job_dir: Path, record: J.RunRecord | None) -> tuple[list[MetricsRecord], list[str]]:
    """The records in step order (a step logged twice, by a resumed attempt, keeps its last record) and notes
    on what could not be read (a line torn by a kill mid-write is skipped, saying so)."""
    path = metrics_file(job_dir, record)
    if not path.is_file():
        return [], [f"no {J.METRICS_FILE} in {path.parent} (the trainer logged no step)"]
    by_step: dict[int, MetricsRecord] = {}
    torn = 0
    for line in path.read_text(errors="replace").splitlines():
        try:
            data = json.loads(line)
        except json.JSONDecodeError:
            torn += 1
            continue
        step = _as_int(data.get("step")) if isinstance(data, dict) else None
        if step is None:
            torn += 1
            continue
        wall = data.get(J.METRICS_WALL_KEY)
        values = {k: (float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None)
                  for k, v in data.items() if k not in ("step", J.METRICS_WALL_KEY)
                  and (v is None or isinstance(v, (int, float)))}
        by_step[step] = MetricsRecord(step, float(wall) if isinstance(wall, (int, float)) else None, values)
    notes = [f"{path}: {torn} line(s) that are not a step record were skipped"] if torn else []
    return [by_step[s] for s in sorted(by_step)], notes


@dataclass(frozen=True)
class StepTimes:
    """Seconds per optimizer step of a run, from its trainer's metrics.jsonl."""

    seconds: list[float]
    source: str  # the file, and which metric
    steps_done: int

    @property
    def median(self) -> float:
        xs = sorted(self.seconds)
        mid = len(xs) // 2
        return xs[mid] if len(xs) % 2 else (xs[mid - 1] + xs[mid]) / 2


def read_step_times(job_dir: Path, record: J.RunRecord | None = None) -> StepTimes:
    """The step times a run logged (`time/step`, else the sum of its phases), the first logged step left out (it
    compiles and warms caches). A record averages `logging_steps` steps, so each counts as their mean. Raises
    StatusError when the directory has no step times."""
    rows, _notes = read_metrics(job_dir, record)
    path = metrics_file(job_dir, record)
    times, metric = [], J.STEP_TIME_METRIC
    for row in rows:
        v = row.values.get(J.STEP_TIME_METRIC)
        if v is None:
            phases = [x for k in J.STEP_PHASE_METRICS if (x := row.values.get(k)) is not None]
            if not phases:
                continue
            v, metric = sum(phases), "the sum of time/* phases"
        times.append(v)
    if not rows:
        raise StatusError(f"no {J.METRICS_FILE} in {path.parent}: the run logged no step")
    if not times:
        raise StatusError(f"{path} has no step times ({J.STEP_TIME_METRIC} or time/* phases)")
    kept = times[1:] or times
    return StepTimes(kept, f"{path} ({metric}, median of {len(kept)} logged step(s))", rows[-1].step)
