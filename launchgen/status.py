"""Role-aware post-mortem of a launchgen job: `launchgen status JOBID` and `launchgen logs JOBID`.

Sources, best first, all optional except a way to find the job directory:

* the scheduler: `scontrol show job -o` while the controller still remembers the job, else `sacct`
  (only when accounting storage is on; the report says when it is not);
* the job directory the rendered script writes (found through the job's StdOut/WorkDir, or `--job-dir`):
  `launchgen-plan.json` (node roles, ports, log paths), `events.jsonl` (the supervisor's record of what
  happened, contract below), and `logs/attempt-<N>/<role>-<node>.log`.

Events contract (`$JOB_DIR/events.jsonl`, one JSON object per line, appended by the supervisor in the batch
script; every field but `event` optional, unknown events and fields ignored so the writer can grow):

    {"ts": 1764680000.12, "attempt": 0, "event": "<name>", "role": "server|trainer|job", "node": "node1",
     "exit_code": 3, "signal": "TERM", "message": "...", "log": "logs/attempt-0/server-node1.log"}

Names read here: `attempt_start`, `step_start` (role), `health_ok`, `health_check` (`ok`: bool),
`health_timeout`, `server_died` (before or after health), `step_exit` (role, exit_code, signal), `signal`
(`signal`: "USR2"), `checkpoint`, `requeue` (`restart_count`, `max_restarts`), `requeue_refused`,
`teardown` (role being stopped, `message`: why), `job_end` (exit_code, message). Aliases (`type`/`kind`
for `event`, `time` for `ts`, `rc` for `exit_code`, `reason` for `message`) are accepted.

Nothing here imports torch or any trainer code: it runs on a login node.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

PLAN_FILE = "launchgen-plan.json"
#: written with the job's files before slurm.setup runs, so it is there even when the job dies in its first lines
STATIC_PLAN_FILE = "launchgen-plan.static.json"
#: the job id `render --bash` runs use (`%j` -> `local`)
LOCAL_JOB_ID = "local"
EVENTS_FILE = "events.jsonl"
ROLES = ("server", "trainer")
#: `launchgen logs --role batch`: the batch script's own output
BATCH_ROLE = "batch"
_LOG_RE = re.compile(r"^(?P<role>server|trainer)-(?P<node>.+)\.log$")
_ATTEMPT_RE = re.compile(r"^attempt-(?P<n>\d+)$")
# `Key=value` pairs of `scontrol -o`; values may contain spaces (Command=, WorkDir=), so a pair ends only
# where the next ` Key=` begins. Keys include `/` and `:` (`CPUs/Task`, `ReqB:S:C:T`).
_SCONTROL_PAIR_RE = re.compile(r"(?:^| )([A-Za-z][A-Za-z0-9_/:]*)=(.*?)(?= [A-Za-z][A-Za-z0-9_/:]*=|$)")
_FINISHED_STATES = frozenset(
    {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "PREEMPTED",
     "BOOT_FAIL", "DEADLINE", "REVOKED", "SPECIAL_EXIT"}
)
_SIGNAL_NAMES = {1: "HUP", 2: "INT", 6: "ABRT", 9: "KILL", 11: "SEGV", 12: "USR2", 10: "USR1", 15: "TERM"}


class StatusError(Exception):
    """A post-mortem cannot be made; the message says what to pass instead."""


# ----------------------------------------------------------------------------------------- scheduler ---


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
        return (self.state or "").split()[0] in _FINISHED_STATES if self.state else False


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


def _run(cmd: list[str], timeout: float = 20.0) -> tuple[int, str, str]:
    if shutil.which(cmd[0]) is None:
        return 127, "", f"{cmd[0]}: command not found"
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        return 124, "", f"{' '.join(cmd)} timed out after {timeout:.0f}s"
    return p.returncode, p.stdout, p.stderr


def query_scontrol(job_id: str) -> SchedulerInfo | None:
    rc, out, _err = _run(["scontrol", "show", "job", "-o", job_id])
    if rc != 0:
        return None
    recs = parse_scontrol_oneliner(out)
    if not recs:
        return None
    # a het job: the leader's line carries the batch script's ExitCode/StdOut
    return scheduler_info_from_scontrol(recs[0])


def query_sacct(job_id: str) -> tuple[SchedulerInfo | None, list[StepInfo], str | None]:
    """-> (job row, steps, why accounting gave nothing or None)."""
    rc, out, err = _run(["sacct", "-j", job_id, "-D", "-P", "-n", f"--format={','.join(SACCT_FIELDS)}"])
    if rc != 0 or "accounting storage is disabled" in (err + out):
        msg = (err or out).strip().splitlines()
        return None, [], msg[0] if msg else f"sacct exited {rc}"
    info, steps = parse_sacct(out, job_id)
    if info is None:
        return None, steps, f"sacct has no record of job {job_id}"
    return info, steps, None


# ----------------------------------------------------------------------------------------- job dir -----


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


def _as_float(v: Any) -> float | None:
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        return float(v)
    if isinstance(v, str):
        try:
            return float(v)
        except ValueError:
            try:
                return datetime.fromisoformat(v).timestamp()
            except ValueError:
                return None
    return None


def parse_events(text: str) -> list[Event]:
    """Tolerant reader of events.jsonl: a torn last line (the job is still writing) is skipped."""
    events = []
    for line in text.splitlines():
        line = line.strip()
        if not line:
            continue
        try:
            d = json.loads(line)
        except json.JSONDecodeError:
            continue
        if not isinstance(d, dict):
            continue
        name = d.get("event") or d.get("type") or d.get("kind")
        if not isinstance(name, str):
            continue
        sig = d.get("signal")
        if isinstance(sig, int) and not isinstance(sig, bool):
            sig = _SIGNAL_NAMES.get(sig, str(sig))
        events.append(
            Event(
                ts=_as_float(d.get("ts", d.get("time"))),
                event=name,
                role=d.get("role") if isinstance(d.get("role"), str) else None,
                node=d.get("node") if isinstance(d.get("node"), str) else None,
                attempt=_as_int(d.get("attempt")),
                exit_code=_as_int(d.get("exit_code", d.get("rc"))),
                signal=str(sig).removeprefix("SIG") if sig not in (None, "") else None,
                message=d.get("message", d.get("reason")) if isinstance(d.get("message", d.get("reason")), str) else None,
                raw=d,
            )
        )
    return events


_TEXT_EVENT_RE = re.compile(r"^(?P<ts>\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ?)\s+(?P<name>\S+)\s*(?P<rest>.*)$")
_KV_RE = re.compile(r"(\w+)=(\S*)")


def _canonical(name: str, kv: dict[str, str], rest: str) -> tuple[str, str | None, dict[str, Any]]:
    """The rendered script's text event -> (canonical event, role, extra fields)."""
    extra: dict[str, Any] = {}
    if name == "start":
        return "attempt_start", "job", extra
    if name in ("server_start", "trainer_start"):
        return "step_start", name.split("_")[0], {"nodes": kv.get("nodes")}
    if name == "server_healthy":
        return "health_ok", "server", {"message": f"healthy after {kv.get('after', '?')}"}
    if name == "server_failed":
        if "health_timeout" in rest.split():
            return "health_timeout", "server", extra
        return "server_died", "server", {"exit_code": kv.get("exit")}
    if name == "trainer_exit":
        return "step_exit", "trainer", {"exit_code": kv.get("status")}
    if name == "server_exit":
        return "step_exit", "server", {"exit_code": kv.get("status")}
    if name == "usr2":
        return "signal", "job", {"signal": "USR2"}
    if name == "signal":
        return "signal", "job", {"signal": rest.split()[0] if rest.split() else None}
    if name == "requeue":
        return "requeue", "job", {"restart_count": kv.get("restart")}
    if name == "requeue_cap":
        return "requeue_refused", "job", {"message": "slurm.max_restarts reached"}
    if name == "exit":
        return "job_end", "job", {"exit_code": kv.get("status")}
    return name, None, extra


def parse_events_text(text: str, attempt: int | None) -> list[Event]:
    """`logs/attempt-<N>/events.log` as the rendered script writes it: `<UTC ISO time> <event> key=value ...`."""
    events = []
    for line in text.splitlines():
        m = _TEXT_EVENT_RE.match(line.strip())
        if not m:
            continue
        rest = m["rest"]
        kv = dict(_KV_RE.findall(rest))
        name, role, extra = _canonical(m["name"], kv, rest)
        raw: dict[str, Any] = {"event": name, "ts": m["ts"], "role": role, "attempt": attempt, "text": line.strip(),
                               **kv, **{k: v for k, v in extra.items() if v is not None}}
        try:
            ts = datetime.fromisoformat(m["ts"].replace("Z", "+00:00")).timestamp()
        except ValueError:
            ts = None
        sig = raw.get("signal")
        events.append(Event(ts=ts, event=name, role=role, node=None, attempt=attempt,
                            exit_code=_as_int(raw.get("exit_code")), signal=sig if isinstance(sig, str) else None,
                            message=raw.get("message") if isinstance(raw.get("message"), str) else None, raw=raw))
    return events


@dataclass
class RoleLog:
    role: str
    node: str
    attempt: int
    path: str
    size: int
    mtime: float


def find_logs(job_dir: Path) -> list[RoleLog]:
    logs: list[RoleLog] = []
    base = job_dir / "logs"
    if not base.is_dir():
        return logs
    for adir in sorted(base.iterdir()):
        m = _ATTEMPT_RE.match(adir.name)
        if not m or not adir.is_dir():
            continue
        for f in sorted(adir.iterdir()):
            lm = _LOG_RE.match(f.name)
            if lm and f.is_file():
                st = f.stat()
                logs.append(RoleLog(lm["role"], lm["node"], int(m["n"]), str(f), st.st_size, st.st_mtime))
    return logs


def tail(path: str | Path, lines: int) -> list[str]:
    """Last `lines` lines of a text file (0: all), read from the end so huge logs stay cheap."""
    p = Path(path)
    with p.open("rb") as fh:
        fh.seek(0, 2)
        size = fh.tell()
        if lines <= 0:
            fh.seek(0)
            data = fh.read()
        else:
            block = 8192
            data = b""
            pos = size
            while pos > 0 and data.count(b"\n") <= lines:
                step = min(block, pos)
                pos -= step
                fh.seek(pos)
                data = fh.read(step) + data
    text = data.decode("utf-8", errors="replace").splitlines()
    return text if lines <= 0 else text[-lines:]


_LOGS_IN_RE = re.compile(r"logs in (/\S+)/logs/attempt-\d+")
_OUTPUT_DIR_RE = re.compile(r"^LG_OUTPUT_DIR=(.+)$", re.M)


def _job_dir_from_batch_log(path: Path) -> Path | None:
    """The rendered script announces `... logs in <job dir>/logs/attempt-<N>` in the batch log (StdOut)."""
    try:
        with path.open("rb") as fh:
            head = fh.read(256 * 1024).decode("utf-8", errors="replace")
    except OSError:
        return None
    found = _LOGS_IN_RE.findall(head)
    return Path(found[-1]) if found else None


def _job_dir_from_script(job_id: str, work: Path | None) -> Path | None:
    """`scontrol write batch_script` (while the controller knows the job) -> the LG_OUTPUT_DIR it sets."""
    rc, out, _ = _run(["scontrol", "write", "batch_script", job_id, "-"])
    m = _OUTPUT_DIR_RE.search(out) if rc == 0 else None
    if not m:
        return None
    import shlex

    try:
        words = shlex.split(m.group(1))
    except ValueError:
        return None
    if len(words) != 1:
        return None
    p = Path(words[0].replace("%j", job_id))
    return p if p.is_absolute() or work is None else work / p


def _candidate_dirs(job_id: str, info: SchedulerInfo | None) -> Iterable[Path]:
    if info is None:
        return []
    out: list[Path] = []
    work = Path(info.work_dir) if info.work_dir else None
    for stream in (info.std_out, info.std_err):
        if stream:
            sp = Path(stream.replace("%j", job_id))
            found = _job_dir_from_batch_log(sp if sp.is_absolute() or work is None else work / sp)
            if found is not None:
                out.append(found)
    from_script = _job_dir_from_script(job_id, work)
    if from_script is not None:
        out.append(from_script)
    for stream in (info.std_out, info.std_err):
        if not stream:
            continue
        p = Path(stream.replace("%j", job_id))
        if work is not None and not p.is_absolute():
            p = work / p
        # the plan may sit beside the stream file or a level or two above (logs/ subfolder)
        out.extend([p.parent, p.parent.parent, p.parent.parent.parent])
    if work is not None:
        out.extend([work / "launchgen-runs" / job_id, work])
        out.extend(sorted(work.glob(f"*/{job_id}")))
    return out


def _is_job_dir(p: Path) -> bool:
    return any((p / f).is_file() for f in (PLAN_FILE, STATIC_PLAN_FILE, EVENTS_FILE)) or (p / "logs").is_dir()


def locate_job_dir(job_id: str, info: SchedulerInfo | None, explicit: str | Path | None) -> Path | None:
    if explicit is not None:
        p = Path(explicit)
        if not p.is_dir():
            raise StatusError(f"--job-dir {p}: no such directory")
        return p
    for cand in _candidate_dirs(job_id, info):
        if _is_job_dir(cand):
            return cand
    return None


# ----------------------------------------------------------------------------------------- analysis ----


@dataclass
class RoleOutcome:
    role: str
    nodes: list[str]
    state: str  # running | exited | failed | killed | stopped | health_failure | health_timeout | not_started | unknown
    how: str
    exit_code: int | None = None
    signal: str | None = None
    ended_at: float | None = None
    log: str | None = None


@dataclass
class HealthCheck:
    ok: bool
    at: float | None
    message: str | None


@dataclass
class JobStatus:
    job_id: str
    job_dir: str | None
    scheduler: SchedulerInfo | None
    accounting: str  # "on" or why it is off / empty
    steps: list[StepInfo]
    attempt: int | None
    attempts: list[int]
    roles: list[RoleOutcome]
    first_to_end: str | None
    summary: str
    last_health: HealthCheck | None
    logs: list[RoleLog]
    failed_log: str | None
    failed_log_tail: list[str]
    events_file: str | None
    plan_file: str | None
    notes: list[str] = field(default_factory=list)
    batch_log: str | None = None  # the batch script's own output (sbatch --output)
    failed: bool = False  # the job is over and did not complete: `launchgen status` exits 3
    over: bool = False  # nothing more will be written (finished, or unknown to the scheduler): `logs --follow` stops

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _plan_nodes(plan: dict[str, Any] | None) -> dict[str, list[str]]:
    """role -> node names from launchgen-plan.json, whatever its exact nesting (read defensively)."""
    roles: dict[str, list[str]] = {r: [] for r in ROLES}
    if not plan:
        return roles
    nodes = plan.get("nodes")
    if isinstance(nodes, list):
        for n in nodes:
            if not isinstance(n, dict):
                continue
            name = n.get("hostname") or n.get("name") or n.get("node")
            if name is None and isinstance(n.get("index"), int):
                name = f"#{n['index']}"
            rs = n.get("roles") or ([n["role"]] if isinstance(n.get("role"), str) else [])
            for r in rs if isinstance(rs, list) else []:
                if r in roles and isinstance(name, str):
                    roles[r].append(name)
    return roles


def _role_of_step(step: StepInfo) -> str | None:
    n = step.name.lower()
    for r in ROLES:
        if r in n:
            return r
    if "vllm" in n:
        return "server"
    if "accelerate" in n or "python" in n or "torchrun" in n:
        return "trainer"
    return None


def _fmt_ts(ts: float | None) -> str:
    return datetime.fromtimestamp(ts).strftime("%H:%M:%S") if ts is not None else "?"


def _how(ev: Event) -> tuple[str, str]:
    """-> (state, sentence) for a role-ending event."""
    if ev.event == "health_timeout":
        return "health_timeout", ev.message or "never became healthy before the health timeout"
    if ev.event == "server_died":
        code = f" (exit {ev.exit_code})" if ev.exit_code is not None else ""
        return "health_failure", ev.message or f"server process died{code}"
    if ev.signal:
        return "killed", f"killed by SIG{ev.signal}" + (f" ({ev.message})" if ev.message else "")
    if ev.exit_code is not None and ev.exit_code > 128 and ev.exit_code - 128 in _SIGNAL_NAMES:
        return "killed", f"exit {ev.exit_code} (SIG{_SIGNAL_NAMES[ev.exit_code - 128]})"
    if ev.exit_code == 0:
        return "exited", "exited 0"
    if ev.exit_code == 75:
        return "preempted", "checkpointed and exited 75 (stopped by USR2/TERM; a requeued attempt resumes)"
    if ev.exit_code is not None:
        return "failed", f"exited {ev.exit_code}" + (f": {ev.message}" if ev.message else "")
    return "stopped", ev.message or ev.event


_END_EVENTS = ("step_exit", "server_died", "health_timeout")


@dataclass
class _JobDirContents:
    plan: dict[str, Any] | None = None
    plan_file: str | None = None
    events: list[Event] = field(default_factory=list)
    events_file: str | None = None
    logs: list[RoleLog] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def _attempt_of(d: Path) -> int | None:
    """N of `logs/attempt-N`; None for anything else there (`attempt-0.bak`, a copy someone made)."""
    m = _ATTEMPT_RE.match(d.name)
    return int(m["n"]) if m else None


def _read_plan(job_dir: Path, out: _JobDirContents, finished: bool | None) -> None:
    for name in (PLAN_FILE, STATIC_PLAN_FILE):
        pf = job_dir / name
        if not pf.is_file():
            continue
        out.plan_file = str(pf)
        try:
            loaded = json.loads(pf.read_text())
            out.plan = loaded if isinstance(loaded, dict) else None
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            out.notes.append(f"{pf}: not valid JSON ({exc})")
        break
    if out.plan_file == str(job_dir / PLAN_FILE):
        return
    if out.plan_file is not None and finished:
        out.notes.append(f"the job ended before it wrote {PLAN_FILE} (in its first lines: the job directory, "
                         "slurm.setup); the batch log says why")
    elif out.plan_file is not None:
        out.notes.append(f"no {PLAN_FILE} in {job_dir} yet: the job is starting (or stopped in its first lines)")
    else:
        out.notes.append(f"no {PLAN_FILE} in {job_dir} (the job has not started yet, or was not rendered by "
                         "launchgen)")


def _read_job_dir(job_dir: Path | None, finished: bool | None) -> _JobDirContents:
    out = _JobDirContents()
    if job_dir is None:
        return out
    _read_plan(job_dir, out, finished)
    ef = job_dir / EVENTS_FILE
    if ef.is_file():
        out.events_file = str(ef)
        out.events = parse_events(ef.read_text(errors="replace"))
    texts = [(n, tf) for tf in job_dir.glob("logs/attempt-*/events.log") if (n := _attempt_of(tf.parent)) is not None]
    for n, tf in sorted(texts, key=lambda x: x[0]):
        out.events_file = out.events_file or str(tf.parent.parent / "attempt-*" / "events.log")
        out.events.extend(parse_events_text(tf.read_text(errors="replace"), n))
    if out.events_file is None:
        out.notes.append(f"no events log in {job_dir}: role outcomes are inferred from logs and the scheduler")
    out.logs = find_logs(job_dir)
    return out


def analyse(
    job_id: str,
    info: SchedulerInfo | None,
    accounting: str,
    steps: list[StepInfo],
    job_dir: Path | None,
    lines: int = 20,
) -> JobStatus:
    jd = _read_job_dir(job_dir, finished=bool(info.finished) if info is not None else None)
    plan, events, logs, notes = jd.plan, jd.events, jd.logs, jd.notes
    plan_file, events_file = jd.plan_file, jd.events_file

    attempts = sorted({lg.attempt for lg in logs} | {e.attempt for e in events if e.attempt is not None})
    attempt = attempts[-1] if attempts else None
    if attempt is None and isinstance(plan, dict) and _as_int(plan.get("attempt")) is not None:
        attempt = _as_int(plan.get("attempt"))
    cur_events = [e for e in events if e.attempt is None or e.attempt == attempt]
    cur_logs = [lg for lg in logs if lg.attempt == attempt]

    for st in steps:
        st.role = _role_of_step(st)

    plan_nodes = _plan_nodes(plan)
    roles: list[RoleOutcome] = []
    job_end = next((e for e in cur_events if e.event == "job_end"), None)
    finished = info.finished if info is not None else _local_finished(job_id, job_end)
    for role in _job_roles(plan, logs, events, steps):
        nodes = sorted({lg.node for lg in cur_logs if lg.role == role}) or plan_nodes[role]
        role_logs = [lg for lg in cur_logs if lg.role == role]
        log_path = role_logs[0].path if role_logs else None
        ends = [e for e in cur_events if e.event in _END_EVENTS and (e.role == role or (
            e.role is None and role == "server" and e.event in ("server_died", "health_timeout")))]
        started = any(e.event == "step_start" and e.role == role for e in cur_events) or bool(role_logs)
        if ends:
            ev = min(ends, key=lambda e: e.ts if e.ts is not None else float("inf"))
            state, how = _how(ev)
            if ev.node and ev.node not in nodes:
                nodes.append(ev.node)
            log_path = next((lg.path for lg in role_logs if lg.node == ev.node), log_path)
            if isinstance(ev.raw.get("log"), str) and job_dir is not None:
                log_path = str(job_dir / ev.raw["log"]) if not Path(ev.raw["log"]).is_absolute() else ev.raw["log"]
            roles.append(RoleOutcome(role, nodes, state, how, ev.exit_code, ev.signal, ev.ts, log_path))
            continue
        role_steps = [s for s in steps if s.role == role]
        if role_steps and all(s.end for s in role_steps):
            s = max(role_steps, key=lambda s: s.end or "")
            state = "exited" if s.exit_code == 0 and not s.exit_signal else "failed"
            if s.exit_signal:
                state = "killed"
            how = f"step {s.step_id} {s.state} (exit {s.exit_code}:{s.exit_signal}, from sacct)"
            end = _as_float(s.end)
            roles.append(RoleOutcome(role, nodes, state, how, s.exit_code,
                                     _SIGNAL_NAMES.get(s.exit_signal or 0) if s.exit_signal else None, end, log_path))
            continue
        if not started:
            how = ("never started: the batch script ended before this step" if finished
                   else "no log and no start event for this attempt")
            roles.append(RoleOutcome(role, nodes, "not_started" if finished is not False else "pending", how,
                                     log=log_path))
        elif finished:
            # The job is over but nothing recorded how this role ended: the log's last write is the best clue.
            last = max((lg.mtime for lg in role_logs), default=None)
            roles.append(RoleOutcome(role, nodes, "unknown",
                                     f"ended with the job (no exit recorded; log last written {_fmt_ts(last)})",
                                     ended_at=last, log=log_path))
        else:
            roles.append(RoleOutcome(role, nodes, "running", "running", log=log_path))

    # A role with no end of its own was stopped by the supervisor: after the other role ended, or because the
    # whole job was signalled (scancel, the time limit, preemption).
    attempt_over = any(e.event == "job_end" for e in cur_events) or bool(finished)
    explicit = [r for r in roles if r.state not in ("running", "unknown", "not_started", "pending")]
    signals = [e for e in cur_events if e.event == "signal" and e.signal in ("TERM", "INT", "KILL")]
    for i, r in enumerate(roles):
        if r.state not in ("running", "unknown") or not attempt_over:
            continue
        if explicit:
            other = min(explicit, key=lambda x: x.ended_at if x.ended_at is not None else float("inf"))
            roles[i] = RoleOutcome(r.role, r.nodes, "stopped", f"stopped by launchgen after the {other.role} ended",
                                   ended_at=job_end.ts if job_end else None, log=r.log)
        elif signals:
            why = {"TIMEOUT": "the time limit", "CANCELLED": "scancel"}.get(
                ((info.state or "").split() or [""])[0] if info else "", "scancel, the time limit or preemption")
            roles[i] = RoleOutcome(r.role, r.nodes, "stopped",
                                   f"stopped: the job received SIG{signals[0].signal} ({why})",
                                   signal=signals[0].signal, ended_at=signals[0].ts, log=r.log)

    # first to end: an explicit end event wins; a role still running never ends "first"
    ended = [r for r in roles if r.ended_at is not None and r.state not in ("running", "not_started", "pending")]
    first = min(ended, key=lambda r: r.ended_at or 0.0) if ended else None

    health: HealthCheck | None = None
    for e in cur_events:
        if e.event in ("health_ok", "health_check", "health_timeout", "server_died"):
            ok = e.event == "health_ok" or (e.event == "health_check" and bool(e.raw.get("ok")))
            health = HealthCheck(ok=ok, at=e.ts, message=e.message or e.event)

    failed = _job_failed(info, job_id, job_end)
    batch_log = find_batch_log(job_id, info, plan, job_dir)
    failed_log = _explaining_log(roles, failed, batch_log)
    failed_tail = tail(failed_log, lines) if failed_log and Path(failed_log).is_file() else []

    requeues = [e for e in events if e.event in ("requeue", "requeue_refused")]
    if requeues:
        rq = requeues[-1]
        notes.append(f"{rq.event.replace('_', ' ')}" + (f": {rq.message}" if rq.message else "")
                     + (f" (attempt {rq.attempt})" if rq.attempt is not None else ""))
    if any(e.event == "signal" for e in cur_events):
        sig = next(e for e in cur_events if e.event == "signal")
        notes.append(f"received SIG{sig.signal or '?'} at {_fmt_ts(sig.ts)} (pre-timeout signal: checkpoint + requeue)")

    summary = _summary(info, roles, first, job_id == LOCAL_JOB_ID, job_end)
    return JobStatus(
        job_id=job_id, job_dir=str(job_dir) if job_dir else None, scheduler=info, accounting=accounting,
        steps=steps, attempt=attempt, attempts=attempts, roles=roles,
        first_to_end=first.role if first else None, summary=summary, last_health=health, logs=logs,
        failed_log=failed_log, failed_log_tail=failed_tail, events_file=events_file, plan_file=plan_file,
        notes=notes, batch_log=batch_log, failed=failed, over=finished is not False,
    )


_BAD_ENDS = ("failed", "killed", "health_failure", "health_timeout")


def _job_roles(plan: dict[str, Any] | None, logs: list[RoleLog], events: list[Event],
               steps: list[StepInfo]) -> tuple[str, ...]:
    """The roles this job has: the plan's, else those seen in logs, events and sacct steps (a job without vLLM
    has no server)."""
    nodes = plan.get("nodes") if plan else None
    if isinstance(nodes, list):
        have = {r for n in nodes if isinstance(n, dict) for r in (n.get("roles") or []) if r in ROLES}
        if have:
            return tuple(r for r in ROLES if r in have)
    seen = {lg.role for lg in logs} | {e.role for e in events if e.role in ROLES} | {s.role for s in steps if s.role}
    seen |= {"server" for e in events if e.event in ("server_died", "health_timeout", "health_ok")}
    return tuple(r for r in ROLES if r in seen or r == "trainer")


def _local_finished(job_id: str, job_end: Event | None) -> bool | None:
    """A `--bash` run has no scheduler: it is over when the script recorded its end."""
    if job_id != LOCAL_JOB_ID:
        return None
    return job_end is not None


def _job_failed(info: SchedulerInfo | None, job_id: str, job_end: Event | None) -> bool:
    """Over without completing (a local run: ended with a status other than 0 or 75, checkpointed for a re-run)."""
    if info is not None:
        return info.finished and (info.state or "").split()[0] != "COMPLETED"
    return job_id == LOCAL_JOB_ID and job_end is not None and job_end.exit_code not in (0, 75, None)


def _has_text(path: str | None) -> bool:
    try:
        return path is not None and Path(path).stat().st_size > 0
    except OSError:
        return False


def _explaining_log(roles: list[RoleOutcome], failed: bool, batch_log: str | None) -> str | None:
    """The log to show: the first role that ended badly, if its log says anything; else, for a failed job, the
    batch log (the only record of a script that died before or between its steps), else any role's log."""
    for r in sorted(roles, key=lambda r: r.ended_at if r.ended_at is not None else float("inf")):
        if r.state in _BAD_ENDS and _has_text(r.log):
            return r.log
    if not failed:
        return None
    if _has_text(batch_log):
        return batch_log
    return next((r.log for r in roles if r.role == "trainer" and r.log), None) or next(
        (r.log for r in roles if r.log), None)


def find_batch_log(job_id: str, info: SchedulerInfo | None, plan: dict[str, Any] | None,
                   job_dir: Path | None) -> str | None:
    """The batch script's output file: the plan's record, the scheduler's StdOut, or the plan's `--output` name
    in the submit directory (WorkDir, else the folders above the job directory)."""
    cands: list[Path] = []
    logs = plan.get("logs") if plan else None
    if isinstance(logs, dict) and isinstance(logs.get("batch"), str):
        cands.append(Path(logs["batch"]))
    work = Path(info.work_dir) if info is not None and info.work_dir else None
    if info is not None and info.std_out:
        sp = Path(info.std_out.replace("%j", job_id))
        cands.append(sp if sp.is_absolute() or work is None else work / sp)
    layout = plan.get("layout") if plan else None
    name = layout.get("batch_log") if isinstance(layout, dict) else None
    if isinstance(name, str) and name:
        rel = name.replace("%j", job_id)
        dirs = [work] if work is not None else []
        if job_dir is not None:
            dirs += [job_dir, *list(job_dir.resolve().parents)[:3]]
        cands += [d / rel for d in dirs]
    return next((str(c) for c in cands if c.is_file()), None)


def _local_state(job_end: Event | None) -> str:
    if job_end is None:
        return "local run (--bash): running, or stopped without recording its end"
    return f"local run (--bash): ended, exit {job_end.exit_code if job_end.exit_code is not None else '?'}"


def _summary(info: SchedulerInfo | None, roles: list[RoleOutcome], first: RoleOutcome | None,
             local: bool = False, job_end: Event | None = None) -> str:
    if info is None and local:
        parts = [_local_state(job_end)]
    else:
        parts = [f"job {(info.state or '?') if info else 'unknown to the scheduler'}"]
    if info and info.exit_code is not None:
        parts[0] += f" (exit {info.exit_code}" + (f", signal {info.exit_signal}" if info.exit_signal else "") + ")"
    if info and (info.state or "").startswith("TIMEOUT"):
        parts.append("stopped by the time limit")
    if first is not None:
        where = f" on {', '.join(first.nodes)}" if first.nodes else ""
        parts.append(f"{first.role} ended first{where}: {first.how}")
    elif roles and all(r.how.startswith("never started") for r in roles):
        parts.append("no step started: the batch script stopped first (its log below says why)")
    elif any(r.state == "running" for r in roles):
        parts.append("running: " + ", ".join(r.role for r in roles if r.state == "running"))
    return "; ".join(parts)


def collect(job_id: str, job_dir: str | Path | None = None, lines: int = 20) -> JobStatus:
    """Everything `launchgen status` shows, from whatever sources answer."""
    job_id = job_id.strip()
    if job_id == LOCAL_JOB_ID:
        return _collect_local(job_dir, lines)
    if not re.fullmatch(r"\d+(?:_\d+)?", job_id):
        raise StatusError(f"JOBID {job_id!r}: expected a numeric SLURM job id (as printed by sbatch), or "
                          f"{LOCAL_JOB_ID!r} for a `render --bash` run")
    info = query_scontrol(job_id)
    sacct_info, steps, why_not = query_sacct(job_id)
    accounting = "on" if why_not is None else f"off or empty: {why_not}"
    if info is None:
        info = sacct_info
    jd = locate_job_dir(job_id, info, job_dir)
    if info is None and jd is None:
        raise StatusError(
            f"job {job_id} is unknown to scontrol (finished more than MinJobAge ago?) and sacct "
            f"({why_not or 'no record'}); pass --job-dir with the job's output directory"
        )
    st = analyse(job_id, info, accounting, steps, jd, lines)
    if jd is None:
        st.notes.insert(0, "job directory not found from the job's StdOut/WorkDir; pass --job-dir")
    return st


def local_job_dir(explicit: str | Path | None) -> Path:
    """A `--bash` run's job directory: --job-dir, else the current directory when it is one, else the default
    output_dir (`launchgen-runs/local`) below it."""
    if explicit is not None:
        return locate_job_dir(LOCAL_JOB_ID, None, explicit) or Path(explicit)
    here = Path.cwd()
    for cand in (here, here / "launchgen-runs" / LOCAL_JOB_ID):
        if _is_job_dir(cand):
            return cand
    raise StatusError(f"no job directory of a local run here ({here}) nor in launchgen-runs/{LOCAL_JOB_ID}/: run "
                      "`launchgen status local` in the job directory, or pass --job-dir")


def _collect_local(job_dir: str | Path | None, lines: int) -> JobStatus:
    return analyse(LOCAL_JOB_ID, None, "not used (a local --bash run)", [], local_job_dir(job_dir), lines)


def select_log(st: JobStatus, role: str, node: str | None, attempt: int | None) -> RoleLog:
    """The log `launchgen logs` prints: role, then node (name or position), then attempt (default: latest).
    `batch` is the batch script's own output (sbatch --output), the one record of a script that died early."""
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
        raise StatusError(f"no {role} log under {where}/logs/attempt-*/{batch}")
    atts = sorted({lg.attempt for lg in cands})
    want = attempt if attempt is not None else atts[-1]
    cands = [lg for lg in cands if lg.attempt == want]
    if not cands:
        raise StatusError(f"--attempt {attempt}: {role} logs exist for attempts {', '.join(map(str, atts))}")
    if node is None:
        return cands[0]
    named = [lg for lg in cands if lg.node == node]
    if named:
        return named[0]
    if node.isdigit() and int(node) < len(cands):
        return cands[int(node)]
    raise StatusError(f"--node {node}: {role} ran on {', '.join(lg.node for lg in cands)} in attempt {want}")
