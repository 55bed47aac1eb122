"""The post-mortem: how each role of a job's latest attempt ended, which ended first, and what to show.

Input: what the scheduler said (`launchgen.readback.slurmquery`) and what the job directory holds (`launchgen.readback.jobfiles`).
Each judgement is one small rule below; `analyse` gathers the facts once and applies them in order:

1. a role's own end event (`_from_end_event`), else its sacct steps (`_from_steps`), else what is missing
   (`_from_absence`);
2. a role with no end of its own was stopped by launchgen (`_stopped_roles`);
3. the first role to end, the last health check, the requeue and signal notes, the log that explains a failure.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from launchgen.jobside.allocprobe import CODES as PREFLIGHT_CODES
from launchgen.jobside.allocprobe import STEP_TIMEOUT_S as PREFLIGHT_STEP_TIMEOUT_S
from launchgen.readback.jobfiles import (
    Event,
    JobDirContents,
    RoleLog,
    Seen,
    find_batch_log,
    read_job_dir,
    read_metrics,
    tail,
    trainer_reason,
)
from launchgen.readback.slurmquery import SchedulerInfo, StepInfo
from launchgen.shared import jobdir as J


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
class ReplicaState:
    """One `vllm.replicas` replica in the latest attempt, from its events (`replica=<k>`)."""

    index: int
    state: str  # starting, healthy, restarting, failed
    restarts: int
    last: str  # the event that set the state, as the script wrote it


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
    replicas: list[ReplicaState] = field(default_factory=list)  # with vllm.replicas > 1

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


_END_EVENTS = (Seen.STEP_EXIT, Seen.SERVER_DIED, Seen.HEALTH_TIMEOUT)
_SERVER_ENDS = (Seen.SERVER_DIED, Seen.HEALTH_TIMEOUT)  # about the server even without a role
_BAD_ENDS = ("failed", "killed", "health_failure", "health_timeout")
_OPEN = ("running", "unknown")  # states a later rule may still settle
_NOT_ENDED = ("running", "not_started", "pending")


@dataclass
class _Facts:
    """What the rules read, gathered once: the latest attempt's events and logs, and whether the job is over."""

    job_id: str
    info: SchedulerInfo | None
    steps: list[StepInfo]
    job_dir: Path | None
    contents: JobDirContents
    attempts: list[int]
    attempt: int | None
    events: list[Event]  # of the latest attempt
    logs: list[RoleLog]  # of the latest attempt
    job_end: Event | None
    finished: bool | None  # None: cannot tell (no scheduler answer, not a local run)

    def role_logs(self, role: str) -> list[RoleLog]:
        return [lg for lg in self.logs if lg.role == role]


def _fmt_ts(ts: float | None) -> str:
    return datetime.fromtimestamp(ts).strftime("%H:%M:%S") if ts is not None else "?"


def _role_of_step(step: StepInfo) -> str | None:
    n = step.name.lower()
    for r in J.ROLES:
        if r in n:
            return r
    if "vllm" in n:
        return "server"
    if "accelerate" in n or "python" in n or "torchrun" in n:
        return "trainer"
    return None


def _gather(job_id: str, info: SchedulerInfo | None, steps: list[StepInfo], job_dir: Path | None) -> _Facts:
    jd = read_job_dir(job_dir, finished=bool(info.finished) if info is not None else None)
    attempts = sorted({lg.attempt for lg in jd.logs} | {e.attempt for e in jd.events if e.attempt is not None})
    attempt = attempts[-1] if attempts else (jd.record.attempt if jd.record else None)
    events = [e for e in jd.events if e.attempt is None or e.attempt == attempt]
    job_end = next((e for e in events if e.event == Seen.JOB_END), None)
    for st in steps:
        st.role = _role_of_step(st)
    # a `--bash` run has no scheduler: it is over when the script recorded its end
    local_over = (job_end is not None) if job_id == J.LOCAL_JOB_ID else None
    return _Facts(job_id, info, steps, job_dir, jd, attempts, attempt, events,
                  [lg for lg in jd.logs if lg.attempt == attempt], job_end,
                  info.finished if info is not None else local_over)


def _job_roles(f: _Facts) -> tuple[str, ...]:
    """The roles this job has: the run record's, else those seen in logs, events and sacct steps (a job
    without vLLM has no server)."""
    rec = f.contents.record
    if rec is not None and rec.roles():
        return rec.roles()
    events = f.contents.events
    seen = {lg.role for lg in f.contents.logs} | {e.role for e in events if e.role in J.ROLES}
    seen |= {s.role for s in f.steps if s.role}
    seen |= {"server" for e in events if e.event in (*_SERVER_ENDS, Seen.HEALTH_OK)}
    return tuple(r for r in J.ROLES if r in seen or r == "trainer")


# ----------------------------------------------------------------------------------- how a role ended ---


def how_ended(ev: Event, log: str | None = None) -> tuple[str, str]:
    """(state, sentence) for a role-ending event (`launchgen report` labels every attempt's ends with it); for a
    failed trainer with its log, the sentence ends with the trainer's own reason (its exception, not its status)."""
    state, how = _how(ev)
    reason = trainer_reason(log) if ev.role == "trainer" and state in ("failed", "killed") else None
    return state, f"{how}: {reason}" if reason else how


def _how(ev: Event) -> tuple[str, str]:
    """-> (state, sentence) for a role-ending event."""
    if ev.event == Seen.HEALTH_TIMEOUT:
        return "health_timeout", ev.message or "never became healthy before the health timeout"
    if ev.event == Seen.SERVER_DIED:
        code = f" (exit {ev.exit_code})" if ev.exit_code is not None else ""
        return "health_failure", ev.message or f"server process died{code}"
    if ev.signal:
        return "killed", f"killed by SIG{ev.signal}" + (f" ({ev.message})" if ev.message else "")
    return _how_status(ev.exit_code, ev.message) or ("stopped", ev.message or ev.event)


def _how_status(code: int | None, message: str | None) -> tuple[str, str] | None:
    if code is not None and code > 128 and code - 128 in J.SIGNAL_NAMES:
        return "killed", f"exit {code} (SIG{J.SIGNAL_NAMES[code - 128]})"
    if code == J.EXIT_OK:
        return "exited", "exited 0"
    if code == J.EXIT_PREEMPTED:
        return "preempted", (f"checkpointed and exited {J.EXIT_PREEMPTED} (stopped by USR2/TERM; the next "
                             "attempt or run into this job directory resumes from that checkpoint)")
    if code is not None:
        return "failed", f"exited {code}" + (f": {message}" if message else "")
    return None


def _from_end_event(f: _Facts, role: str, nodes: list[str]) -> RoleOutcome | None:
    """The role's own end: the earliest step exit, server death or health timeout recorded for it."""
    ends = [e for e in f.events if e.event in _END_EVENTS
            and (e.role == role or (e.role is None and role == "server" and e.event in _SERVER_ENDS))]
    if not ends:
        return None
    ev = min(ends, key=lambda e: e.ts if e.ts is not None else float("inf"))
    if ev.node and ev.node not in nodes:
        nodes.append(ev.node)
    role_logs = f.role_logs(role)
    log = next((lg.path for lg in role_logs if lg.node == ev.node), role_logs[0].path if role_logs else None)
    state, how = how_ended(ev, log)
    return RoleOutcome(role, nodes, state, how, ev.exit_code, ev.signal, ev.ts, log)


def _from_steps(f: _Facts, role: str, nodes: list[str], log: str | None) -> RoleOutcome | None:
    """Accounting's record of the role's steps, when every one of them has ended."""
    steps = [s for s in f.steps if s.role == role]
    if not steps or not all(s.end for s in steps):
        return None
    s = max(steps, key=lambda s: s.end or "")
    state = "killed" if s.exit_signal else ("exited" if s.exit_code == 0 else "failed")
    how = f"step {s.step_id} {s.state} (exit {s.exit_code}:{s.exit_signal}, from sacct)"
    sig = J.SIGNAL_NAMES.get(s.exit_signal or 0) if s.exit_signal else None
    return RoleOutcome(role, nodes, state, how, s.exit_code, sig, _end_time(s.end), log)


def _end_time(text: str | None) -> float | None:
    try:
        return datetime.fromisoformat(text).timestamp() if text else None
    except ValueError:
        return None


def _from_absence(f: _Facts, role: str, nodes: list[str], log: str | None) -> RoleOutcome:
    """No end recorded: never started, running, or over without a trace (the log's last write is the clue)."""
    started = any(e.event == Seen.STEP_START and e.role == role for e in f.events) or bool(f.role_logs(role))
    if not started:
        how = ("never started: the batch script ended before this step" if f.finished
               else "no log and no start event for this attempt")
        return RoleOutcome(role, nodes, "not_started" if f.finished is not False else "pending", how, log=log)
    if f.finished:
        last = max((lg.mtime for lg in f.role_logs(role)), default=None)
        return RoleOutcome(role, nodes, "unknown",
                           f"ended with the job (no exit recorded; log last written {_fmt_ts(last)})",
                           ended_at=last, log=log)
    return RoleOutcome(role, nodes, "running", "running", log=log)


def _role_outcome(f: _Facts, role: str) -> RoleOutcome:
    rec = f.contents.record
    planned = rec.role_nodes()[role] if rec else []
    nodes = sorted({lg.node for lg in f.role_logs(role)}) or planned
    role_logs = f.role_logs(role)
    log = role_logs[0].path if role_logs else None
    return (_from_end_event(f, role, nodes) or _from_steps(f, role, nodes, log)
            or _from_absence(f, role, nodes, log))


def _stopped_roles(f: _Facts, roles: list[RoleOutcome]) -> list[RoleOutcome]:
    """A role with no end of its own was stopped by the supervisor: after the other role ended, or because the
    whole job was signalled (scancel, the time limit, preemption)."""
    if not (f.job_end is not None or f.finished):
        return roles
    explicit = [r for r in roles if r.state not in (*_OPEN, "not_started", "pending")]
    signals = [e for e in f.events if e.event == Seen.SIGNAL and e.signal in ("TERM", "INT", "KILL", "HUP")]
    out = []
    for r in roles:
        if r.state in _OPEN and explicit:
            other = min(explicit, key=lambda x: x.ended_at if x.ended_at is not None else float("inf"))
            r = RoleOutcome(r.role, r.nodes, "stopped", f"stopped by launchgen after the {other.role} ended",
                            ended_at=f.job_end.ts if f.job_end else None, log=r.log)
        elif r.state in _OPEN and signals:
            r = RoleOutcome(r.role, r.nodes, "stopped",
                            f"stopped: the job received SIG{signals[0].signal} ({_why_signalled(f, signals[0].signal)})",
                            signal=signals[0].signal, ended_at=signals[0].ts, log=r.log)
        out.append(r)
    return out


#: Who sends a `--bash` run each signal: no scheduler, so never scancel, a time limit or preemption.
_LOCAL_SENDER = {"INT": "Ctrl-C", "TERM": "kill or a shutdown", "HUP": "the terminal closed",
                 "KILL": "SIGKILL or the OOM killer; the watcher stopped the steps"}


def _why_signalled(f: _Facts, signal: str | None) -> str:
    if f.job_id == J.LOCAL_JOB_ID:
        return _LOCAL_SENDER.get(signal or "", "sent to the script")
    state = ((f.info.state or "").split() or [""])[0] if f.info else ""
    return {"TIMEOUT": "the time limit", "CANCELLED": "scancel"}.get(state, "scancel, the time limit or preemption")


# ------------------------------------------------------------------------------------- the whole job ---


def _first_to_end(roles: list[RoleOutcome]) -> RoleOutcome | None:
    """An explicit end wins; a role still running never ends "first"."""
    ended = [r for r in roles if r.ended_at is not None and r.state not in _NOT_ENDED]
    return min(ended, key=lambda r: r.ended_at or 0.0) if ended else None


def _last_health(events: list[Event]) -> HealthCheck | None:
    health: HealthCheck | None = None
    for e in events:
        if e.event in (Seen.HEALTH_OK, *_SERVER_ENDS):
            ok = e.event == Seen.HEALTH_OK
            health = HealthCheck(ok=ok, at=e.ts, message=e.message or e.event)
    return health


def _event_notes(f: _Facts) -> list[str]:
    notes = []
    requeues = [e for e in f.contents.events if e.event in (Seen.REQUEUE, Seen.REQUEUE_REFUSED)]
    if requeues:
        rq = requeues[-1]
        notes.append(f"{rq.event.replace('_', ' ')}" + (f": {rq.message}" if rq.message else "")
                     + (f" (attempt {rq.attempt})" if rq.attempt is not None else ""))
    for pf in (e for e in f.events if e.event == Seen.PREFLIGHT):
        if pf.message == "ok":
            notes.append(f"preflight passed in {pf.raw.get('seconds', '?')} s")
        else:
            codes = str(pf.raw.get("codes", "?"))
            meaning = "; ".join(f"{c} {PREFLIGHT_CODES[c]}" if c in PREFLIGHT_CODES else _PREFLIGHT_NO_CODE.get(c, c)
                                for c in codes.split(","))
            notes.append(f"preflight failed before any model loaded: {meaning} (logs/attempt-<N>/preflight-<node>.log)")
    for sig in (e for e in f.events if e.event == Seen.SIGNAL):
        means = _SIGNAL_MEANS.get(sig.signal or "", "stopped everything")
        if f.job_id == J.LOCAL_JOB_ID and sig.signal == "TERM":  # no scheduler: nobody ran scancel
            means = "kill or a shutdown: everything was stopped"
        notes.append(f"received SIG{sig.signal or '?'} at {_fmt_ts(sig.ts)} ({means})")
    return notes


#: The preflight event's `codes` when no probe reported one (templates/partials/preflight.j2).
_PREFLIGHT_NO_CODE = {
    "timeout": f"the step did not finish within {PREFLIGHT_STEP_TIMEOUT_S} s (a node's srun or probe hung)",
    "none": "the step failed before any probe reported (srun could not start it, or it was killed)",
}


#: What the script did on each signal it records (launchgen.shared.jobdir's `usr2` and `signal` events).
_SIGNAL_MEANS = {
    "USR2": "checkpoint requested: the time limit is near, or a user asked; the job requeues itself if training is "
            "not complete and slurm.max_restarts allows",
    "TERM": "scancel or kill: everything was stopped; no requeue",
    "INT": "Ctrl-C: everything was stopped",
    "HUP": "hang-up (the terminal closed): everything was stopped, and the run counts as failed",
    "KILL": "the script was killed without running its traps (SIGKILL, the OOM killer); its watcher stopped the "
            "steps and recorded the end",
}


_REPLICA_STATES = {Seen.STEP_START: "starting", Seen.HEALTH_OK: "healthy", Seen.REPLICA_RESTART: "restarting",
                   Seen.SERVER_DIED: "failed", Seen.HEALTH_TIMEOUT: "failed"}


def replica_states(events: list[Event]) -> list[ReplicaState]:
    """Each replica's state in these events (only the scripts of several replicas write `replica=<k>`)."""
    states: dict[int, ReplicaState] = {}
    for e in events:
        k = str(e.raw.get("replica"))
        if e.role != "server" or e.event not in _REPLICA_STATES or not k.isdigit():
            continue
        r = states.setdefault(int(k), ReplicaState(int(k), "starting", 0, ""))
        r.state, r.last = _REPLICA_STATES[e.event], e.raw.get("text", "")
        r.restarts += e.event == Seen.REPLICA_RESTART
    return [states[k] for k in sorted(states)]


def _replica_notes(replicas: list[ReplicaState]) -> list[str]:
    return [f"vLLM replica {r.index}: {r.state}" + (f", restarted {r.restarts} time(s)" if r.restarts else "")
            for r in replicas if r.restarts or r.state != "healthy"]


def _job_failed(f: _Facts) -> bool:
    """Over without completing (a local run: ended with a status other than 0 or 75, checkpointed for a re-run)."""
    if f.info is not None:
        return f.info.finished and (f.info.state or "").split()[0] != "COMPLETED"
    end = f.job_end
    return f.job_id == J.LOCAL_JOB_ID and end is not None and end.exit_code not in (*J.EXIT_NOT_FAILED, None)


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
    if info and info.exit_code is not None and info.finished:  # a queued or running job's ExitCode is 0:0
        parts[0] += f" (exit {info.exit_code}" + (f", signal {info.exit_signal}" if info.exit_signal else "") + ")"
    pending = info is not None and (info.state or "").startswith("PENDING")
    if pending and info is not None:
        start = info.start_time if info.start_time not in (None, "Unknown", "None") else None
        parts[0] += (f", expected to start {start.replace('T', ' ')}" if start else ", no start time estimated yet") \
            + (f" ({info.reason})" if info.reason and info.reason != "None" else "")
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


def _progress(job_dir: Path | None, record: J.RunRecord | None) -> str | None:
    """What the trainer's metrics.jsonl says was trained: the last step, its reward and loss."""
    if job_dir is None:
        return None
    metrics, _ = read_metrics(job_dir, record)
    if not metrics:
        return None
    last = metrics[-1]
    said = [f"{key} {value:.4g}" for key in ("reward", "loss") if isinstance(value := last.values.get(key), float)]
    return (f"trained: step {last.step} last recorded ({len(metrics)} metrics record(s))"
            + (f"; last {', '.join(said)}" if said else ""))


def analyse(job_id: str, info: SchedulerInfo | None, accounting: str, steps: list[StepInfo],
            job_dir: Path | None, lines: int = 20) -> JobStatus:
    f = _gather(job_id, info, steps, job_dir)
    roles = _stopped_roles(f, [_role_outcome(f, role) for role in _job_roles(f)])
    first = _first_to_end(roles)
    failed = _job_failed(f)
    batch_log = find_batch_log(job_id, info, f.contents.record, job_dir)
    failed_log = _explaining_log(roles, failed, batch_log)
    jd = f.contents
    return JobStatus(
        job_id=job_id, job_dir=str(job_dir) if job_dir else None, scheduler=info, accounting=accounting,
        steps=steps, attempt=f.attempt, attempts=f.attempts, roles=roles, first_to_end=first.role if first else None,
        summary=_summary(info, roles, first, job_id == J.LOCAL_JOB_ID, f.job_end), last_health=_last_health(f.events),
        logs=jd.logs, failed_log=failed_log,
        failed_log_tail=tail(failed_log, lines) if failed_log and Path(failed_log).is_file() else [],
        events_file=jd.events_file, plan_file=jd.plan_file,
        notes=[*jd.notes, *_event_notes(f), *_replica_notes(replica_states(f.events)),
               *filter(None, [_progress(job_dir, jd.record)])],
        batch_log=batch_log, failed=failed, over=f.finished is not False, replicas=replica_states(f.events),
    )
