"""The job-directory contract: what a rendered job writes into `$LG_JOB_DIR`, and how it is read back.

One owner for every name and format the pieces share, so they cannot drift apart:

* the planner (`launchgen.planning.plan`) records the static run record and the layout;
* `render` passes the event names, the event time format, the exit codes and the run-record writer into the
  templates (the scripts write what this module declares);
* `launchgen status` / `logs` read the directory only through the layout, the run record and `parse_event`;
* the trainers take their exit codes and completion-marker name from here; `launchgen.jobside.rank` its pid/exit files.

Standard library only, and no launchgen imports but `launchgen.shared.noderuns` (the static record's compact
form, stdlib-only too): it runs on login nodes (check, render, status) and inside trainer processes, and
`RUN_RECORD_WRITER` runs under the compute node's plain `python3`.

Layout (relative to the job directory; `{attempt}` and `{node}` are filled at run time)::

    spec.yaml, job.sbatch | job.sh, trainer.yaml, accelerate.yaml, steps/
    launchgen-plan.static.json        the static run record, written by render (there before the job starts)
    launchgen-plan.json               the run record of the current attempt (rewritten by every attempt)
    logs/attempt-{attempt}/           per attempt: events.log, signal.log, {role}-{node}.log, a plan copy
    run/attempt-{attempt}/pids/{node}/rank{rank}.pid | .exit
    trainer/                          the trainer's output_dir; trainer/launchgen-complete.json when done

Event line (`logs/attempt-{attempt}/events.log`, appended by the script's `lg_event`)::

    <UTC time, EVENT_TIME_FORMAT> <name>[ <word>...][ <key>=<value>...]

A bare word after a `key=value` continues that value (a space-separated node list: `nodes=node1 node2`).
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Mapping
from dataclasses import Field, dataclass, field, fields
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from launchgen.shared import noderuns

# ------------------------------------------------------------------------------------------- exit codes ---

EXIT_OK = 0
#: any failure of a trainer or of the job script
EXIT_FAILURE = 1
#: a trainer refused its configuration (bad trainer.yaml, data or model it cannot use)
EXIT_CONFIG = 2
#: `launchgen status` for a job that is over and did not complete (2 is bad usage)
EXIT_STATUS_JOB_FAILED = 3
#: the trainer checkpointed on USR2/TERM and stopped: requeue me (sysexits' EX_TEMPFAIL, "try again")
EXIT_PREEMPTED = 75
#: the job's status when the vLLM server died or never became healthy and the trainer had no error of its own
EXIT_SERVER_FAILED = EXIT_FAILURE
#: a job that ended with one of these did not fail: it completed, or it checkpointed for a re-run
EXIT_NOT_FAILED = frozenset({EXIT_OK, EXIT_PREEMPTED})
#: a status above 128 is 128 + the signal that ended the process; the signals a job sees, by number
SIGNAL_NAMES = {1: "HUP", 2: "INT", 6: "ABRT", 9: "KILL", 11: "SEGV", 12: "USR2", 10: "USR1", 15: "TERM"}

# ---------------------------------------------------------------------------------------- file names ---

PLAN_FILE = "launchgen-plan.json"
STATIC_PLAN_FILE = "launchgen-plan.static.json"
#: a JSON-lines event file in the job directory: no launchgen script writes one; read when present
#: written into the trainer's output_dir when max_steps is reached: the scripts stop requeueing once it exists
COMPLETE_MARKER = "launchgen-complete.json"
#: in the trainer's output_dir: one JSON record per logging step (`launchgen.trainers.reporting` writes it,
#: `launchgen report` reads it through `jobfiles.read_metrics`); `step` and the metrics of that step, plus
#: METRICS_WALL_KEY: when the record was written (Unix seconds), which places the step on the job's timeline
METRICS_FILE = "metrics.jsonl"
METRICS_WALL_KEY = "time/wall"
#: the plain progress line a trainer's main process prints per logging step (the job script shows them as they come)
STEP_LINE_PREFIX = "[launchgen] step "
#: the wall seconds of one optimizer step in a metrics record (`launchgen plan --from-run` turns it into GPU-hours)
STEP_TIME_METRIC = "time/step"
#: what older runs logged instead of `time/step`: the phases of a step, summed
STEP_PHASE_METRICS = ("time/generate", "time/score", "time/train", "time/sync_weights")
#: the job id `render --bash` runs use (`%j` -> `local`)
LOCAL_JOB_ID = "local"
ROLES = ("server", "trainer")
#: replica k >= 1 of `vllm.replicas` in step, pid and log file names (`server-r1-<node>.log`); replica 0 is `server`
REPLICA_ROLE = "server-r{replica}"
PID_FILE = "rank{rank}.pid"
EXIT_FILE = "rank{rank}.exit"

# ------------------------------------------------------------------------------------ environment ---

#: the attempt's pid directory; `launchgen.jobside.rank` writes `<it>/<node>/rank<RANK>.pid|.exit`
ENV_PID_DIR = "LAUNCHGEN_PID_DIR"
#: the node a trainer rank runs on (its pid directory's name)
ENV_NODE_NAME = "LAUNCHGEN_NODE_NAME"
#: the port of vLLM colocate's process group, planned per job (job.port_offset)
ENV_COLOCATE_MASTER_PORT = "LAUNCHGEN_COLOCATE_MASTER_PORT"
#: how trainer weights reach the vLLM server (nccl, or gloo for a CPU trainer)
ENV_WEIGHT_TRANSPORT = "LAUNCHGEN_WEIGHT_TRANSPORT"
#: the prefixes of the variables launchgen sets itself (a user may not set them in slurm.env)
RESERVED_ENV_PREFIXES = ("LAUNCHGEN_", "LG_")


@dataclass(frozen=True, kw_only=True)
class Layout:
    """Paths relative to the job directory; `{attempt}`, `{node}` filled at run time."""

    output_dir: str  # job.output_dir as written (with %j)
    spec: str = "spec.yaml"
    script_sbatch: str = "job.sbatch"
    script_bash: str = "job.sh"
    trainer_config: str = "trainer.yaml"
    accelerate_config: str = "accelerate.yaml"
    plan_json: str = PLAN_FILE
    plan_static_json: str = STATIC_PLAN_FILE
    steps_dir: str = "steps"
    log_dir: str = "logs/attempt-{attempt}"
    server_log: str = "logs/attempt-{attempt}/server-{node}.log"
    trainer_log: str = "logs/attempt-{attempt}/trainer-{node}.log"
    signal_log: str = "logs/attempt-{attempt}/signal.log"
    events_log: str = "logs/attempt-{attempt}/events.log"
    pid_dir: str = "run/attempt-{attempt}/pids"
    trainer_output_dir: str = "trainer"
    complete_marker: str = "trainer/" + COMPLETE_MARKER
    batch_log: str = ""  # relative to the submit dir (sbatch --output), filled by build_plan

    #: the keys of the run record's "layout" object
    RECORDED = ("output_dir", "spec", "trainer_config", "accelerate_config", "server_log", "trainer_log",
                "signal_log", "events_log", "pid_dir", "trainer_output_dir", "complete_marker", "batch_log")

    def to_json(self) -> dict[str, str]:
        return {k: getattr(self, k) for k in self.RECORDED}

    def role_log(self, role: str, attempt: int, node: str) -> str:
        pattern: str = getattr(self, f"{role}_log")
        return pattern.format(attempt=attempt, node=node)

    def logs_root(self) -> str:
        """The folder holding one `attempt-<N>` folder per attempt."""
        return str(Path(self.log_dir).parent)


#: the layout every job has (output_dir aside), for readers that have no plan
DEFAULT_LAYOUT = Layout(output_dir="")


def _name_rx(pattern: str, **groups: str) -> str:
    """A layout pattern (`server-{node}.log`) as a regex (no anchors) with a named group per field."""
    rx = re.escape(pattern)
    for name, body in groups.items():
        rx = rx.replace(re.escape("{" + name + "}"), f"(?P<{name}>{body})")
    return rx


_ATTEMPT_RE = re.compile(f"^{_name_rx(Path(DEFAULT_LAYOUT.log_dir).name, attempt=r'[0-9]+')}$")
_ROLE_LOG_RES = {r: re.compile(f"^{_name_rx(Path(DEFAULT_LAYOUT.role_log(r, 0, '{node}')).name, node='.+')}$")
                 for r in ROLES}


def attempt_of(dirname: str) -> int | None:
    """N of an `attempt-N` folder; None for anything else there (`attempt-0.bak`, a copy someone made)."""
    m = _ATTEMPT_RE.match(dirname)
    return int(m["attempt"]) if m else None


def replica_role(index: int) -> str:
    """The name replica `index` runs under: `server` for replica 0, else REPLICA_ROLE."""
    return "server" if index == 0 else REPLICA_ROLE.format(replica=index)


# A replica's log is the server's log pattern under the replica's role name. Tried before the plain server
# pattern, which matches it too (with node `r1-<node>`); a node really named `r<k>-...` is read as a replica.
_REPLICA_LOG_RE = re.compile("^" + _name_rx(
    Path(DEFAULT_LAYOUT.role_log("server", 0, "{node}")).name.replace("server", REPLICA_ROLE, 1),
    replica="[1-9][0-9]*", node=".+") + "$")  # fmt: skip


def role_log_of(filename: str) -> tuple[str, str, int] | None:
    """(role, node, replica) of a `<role>-<node>.log` file in an attempt folder (replica 0 for the server's
    first replica and for the trainer); None for any other file."""
    if m := _REPLICA_LOG_RE.match(filename):
        return "server", m["node"], int(m["replica"])
    return next(((r, m["node"], 0) for r, rx in _ROLE_LOG_RES.items() if (m := rx.match(filename))), None)


#: Each rank of a server replica that spans several nodes records itself in the pid directory under this name:
#: `.node` (its node, at start), `.pid` (its `vllm serve`), `.exit` (that process's status once it ended). The
#: supervisor names from them the node and rank that died or never joined, and tests kill a rank by its pid.
SERVER_RANK_FILE = "{role}.rank{rank}"
#: What vLLM logs on each node once its workers reach the engine's torch.distributed rendezvous
#: (`world_size=N rank=R local_rank=L distributed_init_method=tcp://ADDR:PORT backend=...`; vLLM 0.32's
#: parallel_state.py): a rank whose log lacks it at the health deadline never joined the engine.
VLLM_RENDEZVOUS_MARK = "distributed_init_method="


def server_rank_file(pid_dir: str | Path, role: str, rank: int, what: str) -> Path:
    """`<pid dir>/<role>.rank<K>.<what>` (what: node, pid or exit) of a multi-node server replica's rank K."""
    return Path(pid_dir) / (SERVER_RANK_FILE.format(role=role, rank=rank) + "." + what)


# the role is `server` (replica 0) or a later replica's REPLICA_ROLE
_SERVER_RANK_RE = re.compile("^" + _name_rx(
    SERVER_RANK_FILE, role=f"server|{_name_rx(REPLICA_ROLE, replica='[1-9][0-9]*')}", rank="[0-9]+")
    + r"\.(?P<what>node|pid|exit)$")  # fmt: skip


def server_rank_file_of(filename: str) -> tuple[str, int, str] | None:
    """(role, rank, what) of a `<role>.rank<K>.<what>` file in an attempt's pid directory (role `server` or
    `server-r<k>`); None for any other file."""
    m = _SERVER_RANK_RE.match(filename)
    return (m["role"], int(m["rank"]), m["what"]) if m else None


def pid_file(pid_dir: str | Path, node: str, rank: str | int) -> Path:
    return Path(pid_dir) / node / PID_FILE.format(rank=rank)


def exit_file(pid_dir: str | Path, node: str, rank: str | int) -> Path:
    return Path(pid_dir) / node / EXIT_FILE.format(rank=rank)


#: what the script prints into the batch log (StdOut) once it knows its job directory:
#: `... logs in <job dir>/logs/attempt-<N>`; `launchgen status` finds the job directory from it
LOGS_ANNOUNCEMENT = "logs in"
#: the script's variable holding job.output_dir as written (`scontrol write batch_script` shows it)
OUTPUT_DIR_VAR = "LG_OUTPUT_DIR"


#: How a trainer's failure reaches the job's summary ("the trainer says: ..."), `status` and `report`: the trainer's
#: one-line reason, the last line it writes to its log (`launchgen.trainers.declarations.errors`: a refused config, or the
#: exception with the file:line of the user's code; `launchgen.rank`: a death by signal). Read as the first such line.
TRAINER_ERROR_PREFIX = "error: "
#: lines of the wrappers around the trainer that restate its failure, never its reason (accelerate launch re-raises
#: the rank's exit status as these)
WRAPPER_ERROR_LINES = ("subprocess.CalledProcessError: ", "RuntimeError: Traceback", "RuntimeError: error: ")


def trainer_error(text: str) -> str | None:
    """The trainer's own reason in a role log's text (TRAINER_ERROR_PREFIX stripped); None when it wrote none."""
    for line in text.splitlines():
        if line.startswith(TRAINER_ERROR_PREFIX):
            return line[len(TRAINER_ERROR_PREFIX):].strip()
    return None


def announced_job_dirs(text: str) -> list[str]:
    """The job directories a batch log announces (LOGS_ANNOUNCEMENT), in order."""
    rx = re.escape(LOGS_ANNOUNCEMENT) + r" (?P<dir>/\S+)/" + _name_rx(DEFAULT_LAYOUT.log_dir, attempt="[0-9]+")
    return [m["dir"] for m in re.finditer(rx, text)]


def is_job_dir(p: Path) -> bool:
    names = (DEFAULT_LAYOUT.plan_json, DEFAULT_LAYOUT.plan_static_json)
    return any((p / f).is_file() for f in names) or (p / DEFAULT_LAYOUT.logs_root()).is_dir()


# ------------------------------------------------------------------------------------------------ events ---

#: strftime format of an event's time (bash: `printf '%(<it>)T'` with TZ=UTC)
EVENT_TIME_FORMAT = "%Y-%m-%dT%H:%M:%SZ"


class Ev:
    """The event names, for code that writes or matches one (`Ev.TRAINER_EXIT`); the templates get `ev.<name>`."""

    START = "start"
    SERVER_START = "server_start"
    TRAINER_START = "trainer_start"
    SERVER_HEALTHY = "server_healthy"
    SERVER_FAILED = "server_failed"
    REPLICA_RESTART = "replica_restart"
    TRAINER_EXIT = "trainer_exit"
    USR2 = "usr2"
    SIGNAL = "signal"
    COMPLETE = "complete"
    REQUEUE = "requeue"
    REQUEUE_CAP = "requeue_cap"
    EXIT = "exit"
    PREFLIGHT = "preflight"
    HEALTH_TIMEOUT = "health_timeout"  # the words of server_failed: never healthy,
    HEALTH_LOST = "health_lost"  # or healthy once, then silent for the supervisor's bound,
    UNHEALTHY = "unhealthy"  # or healthy once, then an error status from /health, then errors, refusals or silence


@dataclass(frozen=True)
class EventKind:
    name: str
    keys: tuple[str, ...] = ()  # key=value fields, in the order they are written
    words: tuple[str, ...] = ()  # bare words that may follow the name (one of them)
    doc: str = ""


_KINDS = (
    EventKind(Ev.START, ("job", "attempt", "restart_count", "spec_sha256"), doc="the attempt begins"),
    EventKind(Ev.SERVER_START, ("nodes", "replica"),
              doc="the vLLM server step is started on these nodes (`replica=<k>` with vllm.replicas > 1)"),
    EventKind(Ev.TRAINER_START, ("nodes",), doc="the trainer step is started on these nodes"),
    EventKind(Ev.SERVER_HEALTHY, ("after", "replica"),
              doc="the health URL answered 200, `after=<s>s` into the attempt (of replica `<k>`, if several)"),
    EventKind(Ev.SERVER_FAILED, ("exit", "replica", "rank", "node"), (Ev.HEALTH_TIMEOUT, Ev.HEALTH_LOST, Ev.UNHEALTHY),
              doc="the server (replica `<k>`, if several) died (`exit=<status>`), never became healthy "
              "(`health_timeout`), stopped answering /health after it was healthy (`health_lost`), or answered it "
              "with an error status several probes in a row (`unhealthy`: vLLM answers 503 once its engine died); "
              "for a replica over several nodes, `rank=<k> node=<name>` name the rank that ended first or never "
              "joined the engine"),
    EventKind(Ev.REPLICA_RESTART, ("replica", "restart", "exit"),
              doc="vllm.restart_replicas: replica `<k>` died (`exit=<status>`) and its step starts again "
              "(`restart=<n>`, counted per replica and attempt)"),
    EventKind(Ev.TRAINER_EXIT, ("status",), doc="the trainer step ended with this status"),
    EventKind(Ev.USR2, doc="the pre-timeout signal: the trainers are asked to checkpoint"),
    EventKind(Ev.SIGNAL, (), ("TERM", "INT", "HUP", "KILL"),
              doc="the script was signalled and stops everything (`KILL`: written by the `--bash` script's watcher, "
              "which stopped the steps after the script died without its traps)"),
    EventKind(Ev.COMPLETE, doc="the completion marker exists: training is done, no requeue"),
    EventKind(Ev.REQUEUE, ("restart",), doc="the job requeues itself (restart <n>)"),
    EventKind(Ev.REQUEUE_CAP, doc="not complete, but slurm.max_restarts is reached: no requeue"),
    EventKind(Ev.EXIT, ("status",), doc="the script exits with this status"),
    EventKind(Ev.PREFLIGHT, ("status", "codes", "seconds"),
              doc="the in-allocation preflight (job.preflight) passed (`status=ok`) or failed (`status=failed`, "
              "`codes=PF1xx,...`; launchgen.jobside.allocprobe.CODES), in `seconds`"),
)
EVENTS: dict[str, EventKind] = {k.name: k for k in _KINDS}


@dataclass(frozen=True)
class EventLine:
    """One parsed line of events.log."""

    ts: float
    name: str
    words: tuple[str, ...] = ()
    fields: dict[str, str] = field(default_factory=dict)
    text: str = ""

    @property
    def time_text(self) -> str:
        return time.strftime(EVENT_TIME_FORMAT, time.gmtime(self.ts))


def format_event(name: str, *words: str, ts: float | None = None, **values: object) -> str:
    """The line `lg_event` writes for this event (no newline); raises ValueError for what the contract lacks."""
    kind = EVENTS.get(name)
    if kind is None:
        raise ValueError(f"unknown event {name!r}: declare it in launchgen.shared.jobdir")
    bad = [w for w in words if w not in kind.words] + [k for k in values if k not in kind.keys]
    if bad:
        raise ValueError(f"event {name!r} has no word or field {bad[0]!r}")
    stamp = time.strftime(EVENT_TIME_FORMAT, time.gmtime(time.time() if ts is None else ts))
    parts = [stamp, name, *words, *(f"{k}={values[k]}" for k in kind.keys if k in values)]
    return " ".join(parts)


_LINE_RE = re.compile(r"^(?P<ts>\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ?)\s+(?P<name>\S+)\s*(?P<rest>.*)$")
_FIELD_RE = re.compile(r"^(?P<key>\w+)=(?P<value>\S*)$")


def _event_ts(text: str) -> float | None:
    try:
        return datetime.strptime(text.rstrip("Z"), EVENT_TIME_FORMAT.rstrip("Z")).replace(
            tzinfo=timezone.utc).timestamp()
    except ValueError:
        return None


def parse_event(line: str) -> EventLine | None:
    """One events.log line -> EventLine; None for a line that is not an event (a torn write, a stray echo).
    Names the contract does not declare are returned too: readers skip what they do not know."""
    m = _LINE_RE.match(line.strip())
    ts = _event_ts(m["ts"]) if m else None
    if m is None or ts is None:
        return None
    words: list[str] = []
    values: dict[str, str] = {}
    last: str | None = None
    for tok in m["rest"].split():
        fm = _FIELD_RE.match(tok)
        if fm:
            last = fm["key"]
            values[last] = fm["value"]
        elif last is not None:
            values[last] += " " + tok
        else:
            words.append(tok)
    return EventLine(ts=ts, name=m["name"], words=tuple(words), fields=values, text=line.strip())


def parse_events(text: str) -> list[EventLine]:
    return [ev for line in text.splitlines() if (ev := parse_event(line)) is not None]


# ----------------------------------------------------------------------------------- completion marker ---


@dataclass(frozen=True)
class CompletionMarker:
    """`<trainer output_dir>/launchgen-complete.json`: the trainer reached max_steps (the scripts' "do not
    requeue"); written last, atomically, by rank 0."""

    trainer: str
    global_step: int
    finished_at: float  # Unix time

    def to_json(self) -> dict[str, Any]:
        return {"trainer": self.trainer, "global_step": self.global_step, "finished_at": self.finished_at}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> CompletionMarker:
        return cls(str(data["trainer"]), int(data["global_step"]), float(data["finished_at"]))


# --------------------------------------------------------------------------------------------- run record ---

#: the version of the run record's format (`record_version` in launchgen-plan*.json); bump on a breaking change
RECORD_VERSION = 1


def _at_run_time(writer: str, kind: type = str) -> Any:
    """A field the job learns at run time (None in the static record). `writer`: the Python expression the
    compute node's record writer (`RUN_RECORD_WRITER`) fills it with, in the writer's names (`env`, `plan`,
    `attempt`, `logs`, `os`, `time`); `kind`: the JSON type a reader accepts (another reads as absent)."""
    return field(default=None, metadata={"writer": writer, "kind": kind})


@dataclass
class RunRecord:
    """launchgen-plan.json: the static plan (`Plan.to_json`, in `plan`) plus what the attempt learned at run
    time. The static file has only `plan`; every run-time field is None there."""

    plan: dict[str, Any]
    version: int = RECORD_VERSION
    scheduler: str | None = _at_run_time('env["LG_SCHEDULER"]')
    job_id: str | None = _at_run_time('env["LG_JOB_ID"]')
    attempt: int | None = _at_run_time("int(attempt)", int)
    restart_count: int | None = _at_run_time('int(env["LG_RESTART_COUNT"])', int)
    job_dir: str | None = _at_run_time('env["LG_JOB_DIR"]')
    log_dir: str | None = _at_run_time('env["LG_LOG_DIR"]')
    server_host: str | None = _at_run_time('env.get("LG_SERVER_HOST")')
    port_offset_value: int | None = _at_run_time('int(env["LG_PORT_OFFSET"])', int)
    pid_dir: str | None = _at_run_time(f'env["{ENV_PID_DIR}"]')
    #: {"server": {node: path}, "trainer": {node: path}, "events": path, "signal": path, "batch": path}
    logs: dict[str, Any] | None = _at_run_time("logs", dict)  # noqa: RUF009 (a field(), its default None)
    complete_marker: str | None = _at_run_time('os.path.join(env["LG_JOB_DIR"], plan["layout"]["complete_marker"])')
    started_at: str | None = _at_run_time(f'time.strftime("{EVENT_TIME_FORMAT}", time.gmtime())')

    def to_json(self) -> dict[str, Any]:
        out = {**self.plan, "record_version": self.version}
        out.update({k: v for k, v in self._runtime().items() if v is not None})
        return out

    def _runtime(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in run_time_fields()}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> RunRecord:
        """Tolerant: a field of the wrong type reads as absent (a hand-edited or older file still shows)."""
        runtime: dict[str, Any] = {}
        for f in run_time_fields():
            if f.name not in data:
                continue
            v, want = data[f.name], f.metadata["kind"]
            ok = isinstance(v, want) and not isinstance(v, bool)
            runtime[f.name] = v if ok else None
        plan = noderuns.expand_record({k: v for k, v in data.items() if k not in runtime and k != "record_version"})
        version = data.get("record_version")
        return cls(plan=plan, version=version if isinstance(version, int) else 0, **runtime)

    def role_nodes(self) -> dict[str, list[str]]:
        """role -> node names (empty lists in a static record)."""
        out: dict[str, list[str]] = {r: [] for r in ROLES}
        nodes = self.plan.get("nodes")
        for n in nodes if isinstance(nodes, list) else []:
            if not isinstance(n, dict):
                continue
            name = n.get("name")  # run time only: a static record has positions, no names
            roles = n.get("roles")
            for r in roles if isinstance(roles, list) else []:
                if r in out and isinstance(name, str):
                    out[r].append(name)
        return out

    def roles(self) -> tuple[str, ...]:
        """The roles some node of the plan has, in ROLES order (a job without vLLM has no server)."""
        have = {r for rs in self._node_roles() for r in rs}
        return tuple(r for r in ROLES if r in have)

    def _node_roles(self) -> list[list[str]]:
        nodes = self.plan.get("nodes")
        rows = [n.get("roles") for n in nodes if isinstance(n, dict)] if isinstance(nodes, list) else []
        return [[r for r in rs if r in ROLES] for rs in rows if isinstance(rs, list)]

    def layout_value(self, key: str) -> str | None:
        layout = self.plan.get("layout")
        v = layout.get(key) if isinstance(layout, dict) else None
        return v if isinstance(v, str) else None

    def batch_log(self) -> str | None:
        v = self.logs.get("batch") if self.logs else None
        return v if isinstance(v, str) else None


def run_time_fields() -> tuple[Field[Any], ...]:
    """RunRecord's fields the job fills in at run time, in declaration order."""
    return tuple(f for f in fields(RunRecord) if "writer" in f.metadata)


#: The program the job script runs with the node's `python3` at the start of every attempt: the static record
#: (argv[1], expanded by `launchgen.shared.noderuns`, whose source it starts with) + the attempt's node names,
#: ports, log paths -> launchgen-plan.json (argv[2]) and a copy in the attempt's log folder. Standard library only (the node's python3 need not have launchgen); it reads the names
#: above from the static record's layout. The record's run-time keys and their values are `RunRecord`'s
#: (`_at_run_time`), written out here one per line, so the writer cannot fill a key the reader does not know.
RUN_RECORD_WRITER = Path(noderuns.__file__).read_text() + """
import json, os, sys, time
plan = expand_record(json.load(open(sys.argv[1])))
env = os.environ
names = env["LG_NODE_LIST"].split()
attempt = env["LG_ATTEMPT"]
for node in plan["nodes"]:
    node["name"] = names[node["position"]]
for port in plan["ports"]:
    port["value"] = int(env[port["var"]])
logs = {"server": {}, "trainer": {}}
for node in plan["nodes"]:
    for role in node["roles"]:
        rel = plan["layout"][role + "_log"].format(attempt=attempt, node=node["name"])
        logs[role][node["name"]] = os.path.join(env["LG_JOB_DIR"], rel)
logs["events"] = os.path.join(env["LG_JOB_DIR"], plan["layout"]["events_log"].format(attempt=attempt))
logs["signal"] = os.path.join(env["LG_JOB_DIR"], plan["layout"]["signal_log"].format(attempt=attempt))
if env.get("LG_SCHEDULER") == "sbatch":
    logs["batch"] = os.path.join(env.get("SLURM_SUBMIT_DIR", "."), plan["layout"]["batch_log"].replace("%j", env["LG_JOB_ID"]))
plan.update({
@FIELDS@})
text = json.dumps(plan, indent=2, sort_keys=True) + "\\n"
for path in (sys.argv[2], os.path.join(env["LG_LOG_DIR"], "@PLAN_FILE@")):
    with open(path + ".tmp", "w") as f:
        f.write(text)
    os.replace(path + ".tmp", path)
""".replace("@PLAN_FILE@", PLAN_FILE).replace(
    "@FIELDS@", "".join(f'    "{f.name}": {f.metadata["writer"]},\n' for f in run_time_fields()))


def template_context() -> dict[str, Any]:
    """What `render` gives the templates, so the scripts write the names declared here."""
    return {
        "ev": {name: name for name in EVENTS} | {"health_timeout": Ev.HEALTH_TIMEOUT, "health_lost": Ev.HEALTH_LOST,
                                                   "unhealthy": Ev.UNHEALTHY},
        "exit_config": EXIT_CONFIG,
        "plan_file": PLAN_FILE,
        "event_time_format": EVENT_TIME_FORMAT,
        "run_record_writer": RUN_RECORD_WRITER,
        "pid_dir_var": ENV_PID_DIR,
        "logs_announcement": LOGS_ANNOUNCEMENT,
        "server_rank_file": SERVER_RANK_FILE,
        "vllm_rendezvous_mark": VLLM_RENDEZVOUS_MARK,
        "wrapper_error_lines": WRAPPER_ERROR_LINES,
        # as a grep pattern (a basic regular expression anchored at the line's start)
        "step_line_bre": "^" + re.sub(r"([][.*^$\\])", r"\\\1", STEP_LINE_PREFIX),
    }


# ------------------------------------------------------------------------------------------------ sweeps ---

#: in each point's job directory of a sweep (`launchgen.input.sweep`): every point's index, name and values, and
#: which point this is. `launchgen status` finds the other points beside it by their names.
SWEEP_FILE = "launchgen-sweep.json"


@dataclass(frozen=True)
class SweepRecord:
    """The sweep a job directory's run is a point of."""

    index: int
    #: (index, name, {dotted path: value}) of every point, in index order
    points: tuple[tuple[int, str, dict[str, Any]], ...]

    @property
    def name(self) -> str:
        return next((n for i, n, _v in self.points if i == self.index), "")

    def to_text(self) -> str:
        points = [{"index": i, "name": n, "values": v} for i, n, v in self.points]
        return json.dumps({"point": self.index, "points": points}, indent=2, sort_keys=True, default=str) + "\n"

    @classmethod
    def from_text(cls, text: str) -> SweepRecord | None:
        """None for anything that is not a record this module wrote (a hand edit, a torn write)."""
        try:
            data = json.loads(text)
        except ValueError:
            return None
        if not isinstance(data, dict) or not isinstance(data.get("point"), int) or \
                not isinstance(data.get("points"), list):
            return None
        points = []
        for p in data["points"]:
            if not (isinstance(p, dict) and isinstance(p.get("index"), int) and isinstance(p.get("name"), str)):
                return None
            points.append((p["index"], p["name"], p["values"] if isinstance(p.get("values"), dict) else {}))
        return cls(data["point"], tuple(points))
