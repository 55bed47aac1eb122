"""What `launchgen report` shows, as plain data: the run's timeline and its training curves.

Everything comes from the job directory, read through `launchgen.readback.jobfiles` (events, role logs, the trainer's
metrics.jsonl), and the verdict on how the latest attempt ended from `launchgen.readback.postmortem` (the same words as
`launchgen status`). Drawing is `launchgen.readback.reporthtml`'s; this module imports no plotting library.

The timeline has one lane per attempt, role and node (`attempt 1 · server · node3`) plus one lane per attempt for
the job script itself: a lane runs from the role's start event to its end (its exit event, the server's failure,
else the attempt's end), and carries marks: the server's health, each training step (placed by the time the
trainer stamped on its record), each weight sync (on the server lanes, after the step that pushed it), replica
restarts, the pre-timeout signal, requeues and the exit.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from launchgen.readback import jobfiles as F
from launchgen.readback import postmortem
from launchgen.readback.jobfiles import Event, MetricsRecord, Seen
from launchgen.shared import jobdir as J

#: the step-time phases, in the order the step runs them (metric key, label)
PHASES = (("time/generate", "generate"), ("time/score", "score"), ("time/train", "train"),
          ("time/sync_weights", "sync"), ("time/eval", "eval"))
KL, LOSS, REWARD, STALENESS, TOKENS = "kl", "loss", "reward", "async/staleness", "num_tokens"


@dataclass
class Mark:
    t: float
    kind: str  # healthy, failed, step, sync, restart, signal, requeue, requeue_cap, complete, exit, end
    label: str


@dataclass
class Lane:
    attempt: int
    role: str  # job, server, server-r<k>, trainer
    node: str
    start: float | None
    end: float | None
    how: str  # how the lane ended, in postmortem's words ("" while unknown)
    marks: list[Mark] = field(default_factory=list)
    first_to_end: bool = False
    #: a server over several nodes: this node's rank and how its vllm ended ("rank 1, exit 137"; "" otherwise)
    rank: str = ""

    @property
    def name(self) -> str:
        return (f"attempt {self.attempt} · {self.role}" + (f" · {self.node}" if self.node else "")
                + (f" · {self.rank}" if self.rank else ""))


@dataclass
class Curve:
    key: str
    title: str
    steps: list[int]
    values: list[float]


@dataclass
class RunReport:
    job_id: str
    job_dir: str
    title: str
    summary: str
    lanes: list[Lane]
    curves: dict[str, list[Curve]]  # panel title -> its lines
    phases: list[Curve]  # step time split (stacked)
    notes: list[str]
    steps: int

    def lane(self, name: str) -> Lane | None:
        return next((ln for ln in self.lanes if ln.name == name), None)


def _by_attempt(events: list[Event]) -> dict[int, list[Event]]:
    out: dict[int, list[Event]] = {}
    for e in events:
        if e.attempt is not None and e.ts is not None:
            out.setdefault(e.attempt, []).append(e)
    return out


def _replica(e: Event) -> int:
    v = e.raw.get("replica")
    return int(v) if isinstance(v, str) and v.isdigit() else v if isinstance(v, int) else 0


def _job_mark(e: Event) -> Mark | None:
    assert e.ts is not None
    if e.event == Seen.SIGNAL:
        return Mark(e.ts, "signal", f"SIG{e.signal}" if e.signal else "signal")
    if e.event == Seen.REQUEUE:
        return Mark(e.ts, "requeue", f"requeued (restart {e.raw.get('restart_count', '?')})")
    if e.event == Seen.REQUEUE_REFUSED:
        return Mark(e.ts, "requeue_cap", "not requeued: slurm.max_restarts reached")
    if e.event == J.Ev.COMPLETE:
        return Mark(e.ts, "complete", "training complete (marker written)")
    if e.event == Seen.JOB_END:
        return Mark(e.ts, "exit", f"script exited {e.exit_code if e.exit_code is not None else '?'}")
    return None


def _job_lane(attempt: int, events: list[Event], logs: list[F.RoleLog]) -> Lane:
    """The script's own lane: from the attempt's start (else its first event) to the job's end (else the last
    event or log write), with the signal, requeue, completion and exit marks."""
    ts = [e.ts for e in events if e.ts is not None]
    start = next((e.ts for e in events if e.event == Seen.ATTEMPT_START), min(ts) if ts else None)
    end_ev = next((e for e in events if e.event == Seen.JOB_END), None)
    end = end_ev.ts if end_ev is not None else max([*ts, *(lg.mtime for lg in logs)], default=None)
    job = Lane(attempt, "job", "", start, end, "")
    for e in events:
        mark = _job_mark(e) if e.ts is not None else None
        if mark is not None:
            job.marks.append(mark)
            if mark.kind == "exit":
                job.how = mark.label
    return job


def _role_logs(logs: list[F.RoleLog], starts: dict[tuple[str | None, int], Event]
               ) -> tuple[list[tuple[str, str, int]], list[tuple[str, str, int]]]:
    """(name, node, replica) of each server and trainer lane: one per role log (one per node); a step that
    started but left no log (deleted, or it died at once) still gets one, named by the nodes its start event
    lists."""
    server_logs = [(lg.name, lg.node, lg.replica) for lg in logs if lg.role == "server"]
    trainer_logs = [(lg.name, lg.node, 0) for lg in logs if lg.role == "trainer"]
    for (role, replica), ev in starts.items():
        mine = server_logs if role == "server" else trainer_logs
        if role in ("server", "trainer") and not any(r == replica for _n, _node, r in mine):
            nodes = ev.raw.get("nodes")
            mine.append((J.replica_role(replica) if role == "server" else role,
                         nodes if isinstance(nodes, str) else "", replica))
    return server_logs, trainer_logs


def _server_lane(attempt: int, name: str, node: str, replica: int, start: float | None, end: float | None,
                 events: list[Event]) -> Lane:
    lane = Lane(attempt, name, node, start, end, "")
    for e in events:
        if e.ts is None or e.role != "server" or _replica(e) != replica:
            continue
        if e.event == Seen.HEALTH_OK:
            lane.marks.append(Mark(e.ts, "healthy", e.message or "healthy"))
        elif e.event in (Seen.SERVER_DIED, Seen.HEALTH_TIMEOUT):
            _state, lane.how = postmortem.how_ended(e)
            lane.end = e.ts
            lane.marks.append(Mark(e.ts, "end", lane.how))
        elif e.event == Seen.REPLICA_RESTART:
            lane.marks.append(Mark(e.ts, "restart", e.message or "replica restarted"))
    return lane


def _trainer_lane(attempt: int, node: str, start: float | None, end: float | None, events: list[Event],
                  log: str | None) -> Lane:
    lane = Lane(attempt, "trainer", node, start, end, "")
    t_end = next((e for e in events if e.event == Seen.STEP_EXIT and e.role == "trainer"), None)
    if t_end is not None and t_end.ts is not None:
        _state, lane.how = postmortem.how_ended(t_end, log)
        lane.end = t_end.ts
        lane.marks.append(Mark(t_end.ts, "end", lane.how))
    return lane


def _mark_steps(lanes: list[Lane], metrics: list[MetricsRecord], start: float | None, end: float | None) -> None:
    """Each training step inside the attempt on the trainer lanes, each weight push on the server lanes (a second
    of slack at the end: the trainer stamps its record just before the script notes the exit)."""
    lo, hi = (start or float("-inf")), (end or float("inf"))
    for rec in metrics:
        at = rec.wall
        if at is None or not lo <= at <= hi + 1.0:
            continue
        sync = rec.values.get("time/sync_weights")
        for lane in lanes:
            if lane.role == "trainer":
                lane.marks.append(Mark(at, "step", _step_text(rec)))
            elif sync and lane.role.startswith("server"):
                lane.marks.append(Mark(at, "sync", f"weights of step {rec.step} pushed ({sync:.2f} s)"))


def _mark_first_to_end(lanes: list[Lane]) -> None:
    ended = [ln for ln in lanes if ln.role != "job" and ln.how and ln.end is not None]
    if ended:
        min(ended, key=lambda ln: ln.end or 0.0).first_to_end = True


def _attempt_lanes(attempt: int, events: list[Event], logs: list[F.RoleLog],
                   metrics: list[MetricsRecord]) -> list[Lane]:
    job = _job_lane(attempt, events, logs)
    starts = {(e.role, _replica(e) if e.role == "server" else 0): e for e in events if e.event == Seen.STEP_START}

    def started(role: str, replica: int) -> float | None:
        ev = starts.get((role, replica))
        return ev.ts if ev is not None else job.start

    server_logs, trainer_logs = _role_logs(logs, starts)
    lanes = [job]
    lanes += [_server_lane(attempt, name, node, replica, started("server", replica), job.end, events)
              for name, node, replica in server_logs]
    trainer_log = {lg.node: lg.path for lg in logs if lg.role == "trainer"}
    lanes += [_trainer_lane(attempt, node, started("trainer", 0), job.end, events, trainer_log.get(node))
              for _n, node, _r in trainer_logs]
    _mark_steps(lanes, metrics, job.start, job.end)
    _mark_first_to_end(lanes)
    return lanes


def _rank_lanes(lanes: list[Lane], ranks: list[F.ServerRank]) -> list[Lane]:
    """Name each server lane of a replica over several nodes by its node's rank and that rank's exit status."""
    for r in ranks:
        for lane in lanes:
            if lane.role == r.role and lane.node == r.node:
                lane.rank = f"rank {r.rank}" + (f", exit {r.exit_code}" if r.exit_code is not None else "")
    return lanes


def _step_text(m: MetricsRecord) -> str:
    parts = [f"step {m.step}"]
    for key, label in ((REWARD, "reward"), (LOSS, "loss"), (KL, "kl")):
        v = m.values.get(key)
        if v is not None:
            parts.append(f"{label} {v:.4g}")
    times = [f"{label} {m.values[k]:.2f}s" for k, label in PHASES if m.values.get(k) is not None]
    return ", ".join(parts) + (f" ({', '.join(times)})" if times else "")


def _curve(metrics: list[MetricsRecord], key: str, title: str) -> Curve | None:
    pts = [(m.step, m.values[key]) for m in metrics if m.values.get(key) is not None]
    if not pts:
        return None
    return Curve(key, title, [p[0] for p in pts], [float(p[1]) for p in pts])  # type: ignore[arg-type]


def _step_seconds(m: MetricsRecord) -> float:
    return sum(m.values.get(k) or 0.0 for k, _ in PHASES)


def tokens_per_second(metrics: list[MetricsRecord]) -> Curve | None:
    """Trained tokens per second of wall time between logged steps (`num_tokens` is the running total, as in
    TRL); without the trainer's time stamps, per second of the step's own phases."""
    steps, values = [], []
    prev: MetricsRecord | None = None
    for m in metrics:
        tok = m.values.get(TOKENS)
        if tok is None:
            continue
        before = prev.values.get(TOKENS) if prev is not None else 0.0
        # the phases' time of the steps since the last record (they are the logged window's means)
        own = _step_seconds(m) * (m.step - prev.step if prev is not None else m.step)
        dt = own
        if prev is not None and m.wall is not None and prev.wall is not None and m.wall > prev.wall:
            dt = m.wall - prev.wall
            if own > 0 and dt > 5 * own:  # a requeue between the two records: its downtime trained nothing
                dt = own
        if dt > 0 and before is not None and tok >= before:
            steps.append(m.step)
            values.append((tok - before) / dt)
        prev = m
    return Curve("tokens/s", "tokens/s", steps, values) if steps else None


def _curves(metrics: list[MetricsRecord]) -> dict[str, list[Curve]]:
    keys = sorted({k for m in metrics for k in m.values})
    reward = [_curve(metrics, REWARD, "reward")]
    reward += [_curve(metrics, k, k.removeprefix("rewards/").removesuffix("/mean"))
               for k in keys if k.startswith("rewards/") and k.endswith("/mean")]
    panels = {
        "reward": reward,
        "KL to the reference": [_curve(metrics, KL, "kl")],
        "loss": [_curve(metrics, LOSS, "loss")],
        "tokens/s": [tokens_per_second(metrics)],
        "staleness (policy versions behind)": [_curve(metrics, STALENESS, "staleness")],
    }
    return {title: [c for c in cs if c is not None] for title, cs in panels.items()}


def build(job_id: str, job_dir: Path, status: postmortem.JobStatus | None = None) -> RunReport:
    """The report of the job in `job_dir`; `status` is the post-mortem of its latest attempt (made here from the
    directory alone when not given, as for a local run)."""
    contents = F.read_job_dir(job_dir, True)
    metrics, notes = F.read_metrics(job_dir, contents.record)
    if status is None:
        status = postmortem.analyse(job_id, None, "not used", [], job_dir, lines=0)
    lanes: list[Lane] = []
    for attempt, events in sorted(_by_attempt(contents.events).items()):
        lanes += _rank_lanes(_attempt_lanes(attempt, events, [lg for lg in contents.logs if lg.attempt == attempt],
                                            metrics), F.read_server_ranks(job_dir, attempt))
    if metrics and all(m.wall is None for m in metrics):
        notes.append("the trainer's records carry no time stamp (an older trainer): steps and weight syncs are "
                     "left off the timeline; the curves show them")
    if not lanes:
        notes.append("no events log: the timeline is empty (the job did not start, or was not rendered by "
                     "launchgen)")
    record = contents.record
    name = record.plan.get("job_name") if record is not None else None
    title = f"job {job_id}" + (f" ({name})" if isinstance(name, str) else "")
    return RunReport(job_id=job_id, job_dir=str(job_dir), title=title, summary=status.summary, lanes=lanes,
                     curves=_curves(metrics),
                     phases=[c for k, label in PHASES if (c := _curve(metrics, k, label)) is not None],
                     notes=[*contents.notes, *notes], steps=len(metrics))


# -------------------------------------------------------------------------------------- several runs ---

#: the panels a comparison overlays (one line per run each) and the final metrics its table shows
COMPARED = (("reward", REWARD), ("loss", LOSS), ("KL to the reference", KL), ("step time (s)", "time/step"))


@dataclass
class Comparison:
    """Several runs (a sweep's points) side by side: each panel has one line per run, titled by the run's name;
    `final` is each run's last logged value of each compared metric (None: not logged)."""

    title: str
    curves: dict[str, list[Curve]]
    final: list[tuple[str, int, dict[str, float | None]]]  # (run, last step, metric -> last value)
    notes: list[str]


def compare(title: str, runs: list[tuple[str, Path]]) -> Comparison:
    curves: dict[str, list[Curve]] = {panel: [] for panel, _k in COMPARED}
    final, notes = [], []
    for name, job_dir in runs:
        metrics, why = F.read_metrics(job_dir, F.read_job_dir(job_dir, True).record)
        notes += [f"{name}: {n}" for n in why]
        for panel, key in COMPARED:
            if (c := _curve(metrics, key, name)) is not None:
                curves[panel].append(c)
        last = {key: next((m.values[key] for m in reversed(metrics) if m.values.get(key) is not None), None)
                for _panel, key in COMPARED}
        final.append((name, metrics[-1].step if metrics else 0, last))
    return Comparison(title, curves, final, notes)
