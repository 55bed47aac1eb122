"""The job script's variables: every `LG_*` / `LAUNCHGEN_*` name a rendered script sets or reads, declared once.

A name is declared here with why the script keeps it; Python that writes or points at a variable (a `Ref` in the
plan, a port's variable, a container mount) imports its constant from here, and `tests/test_scriptvars.py` fails on
a template or a rendered script that uses a name not declared here, and on a declaration nothing uses. The
`LAUNCHGEN_*` variables the trainers read are the job-directory contract's (`launchgen.shared.jobdir.ENV_*`): declared
here under jobdir's names. A per-replica copy of a variable is `<NAME>_R<k>` (`ReplicaPlan.var`).

`ref=True` marks the variables the plan may point at (`planmodel.Ref`: a word of a command line or an address that
is only known at run time); their text is what `launchgen plan` shows for them.
"""

from __future__ import annotations

from dataclasses import dataclass

from launchgen.shared import jobdir as J


@dataclass(frozen=True)
class ScriptVar:
    name: str
    why: str
    ref: bool = False  # a plan `Ref` may name it


VARS: dict[str, ScriptVar] = {}


def _var(name: str, why: str, ref: bool = False) -> str:
    assert name not in VARS, name
    VARS[name] = ScriptVar(name, why, ref)
    return name


def base_name(var: str) -> str:
    """`LG_SERVER_PORT_R1` -> `LG_SERVER_PORT`: replica k's copy of a variable is declared once, without `_R<k>`."""
    base, sep, k = var.rpartition("_R")
    return base if sep and k.isdigit() and base in VARS else var


# --- the job and its attempt -------------------------------------------------------------------------------
LG_JOB_ID = _var("LG_JOB_ID", "SLURM's job id (`local` under --bash): file names and the run record")
LG_JOB_NAME = _var("LG_JOB_NAME", "the job's name, for %x in job.output_dir")
LG_ARRAY_JOB_ID = _var("LG_ARRAY_JOB_ID", "the array's job id (else the job id), for %A in job.output_dir")
LG_SCHEDULER = _var("LG_SCHEDULER", "sbatch or bash: the run record says which script ran")
LG_SPEC_HASH = _var("LG_SPEC_HASH", "the spec's sha256, on the attempt's start event")
LG_OUTPUT_DIR = _var(J.OUTPUT_DIR_VAR, "job.output_dir as written (with %j), before expansion; `status` finds "
                     "the job directory from it in a batch script")
LG_JOB_DIR = _var("LG_JOB_DIR", "absolute job directory (job.output_dir with %j replaced)", ref=True)
LG_ATTEMPT = _var("LG_ATTEMPT", "this attempt's number (one more than the newest attempt folder)")
LG_RESTART_COUNT = _var("LG_RESTART_COUNT", "SLURM's restart count: the requeue cap (slurm.max_restarts)")
LG_LOG_DIR = _var("LG_LOG_DIR", "$LG_JOB_DIR/logs/attempt-<N>", ref=True)
LG_EVENTS = _var("LG_EVENTS", "the attempt's events.log, which lg_event appends to")
LG_STARTED = _var("LG_STARTED", "a file the attempt touches at its start: a completion marker older than it is an earlier attempt's")
LG_PREV_RECORDS = _var("LG_PREV_RECORDS", "the previous attempt's record files, put back when this attempt exits with a config error")
LG_COMPLETE_MARKER = _var("LG_COMPLETE_MARKER", "the trainer's completion marker: present, the job is not requeued")
LG_ACCELERATE_CONFIG = _var("LG_ACCELERATE_CONFIG", "$LG_JOB_DIR/accelerate.yaml", ref=True)
LG_TRAINER_CONFIG = _var("LG_TRAINER_CONFIG", "$LG_JOB_DIR/trainer.yaml", ref=True)
LG_TRAINER_OUTPUT = _var("LG_TRAINER_OUTPUT", "the trainer's output_dir ($LG_JOB_DIR/trainer)")
LG_TRAINER_OUTPUT_YAML = _var("LG_TRAINER_OUTPUT_YAML", "$LG_JOB_DIR/trainer as a YAML single-quoted scalar",
                              ref=True)

# --- nodes and addresses -----------------------------------------------------------------------------------
LG_NODES = _var("LG_NODES", "the allocation's node names in plan position order (a bash array)")
LG_NODE_LIST = _var("LG_NODE_LIST", "LG_NODES space-separated: logged and read by the run record's writer")
LG_ALL_NODELIST = _var("LG_ALL_NODELIST", "every node, comma-separated: the preflight step's --nodelist")
LG_TRAIN_NODES = _var("LG_TRAIN_NODES", "the trainer's nodes, space-separated (the roster its step ranks by)")
LG_TRAIN_NODELIST = _var("LG_TRAIN_NODELIST", "the trainer's nodes, comma-separated: its step's --nodelist")
LG_SERVER_NODES = _var("LG_SERVER_NODES", "a server replica's nodes, space-separated (its step's roster)")
LG_SERVER_NODELIST = _var("LG_SERVER_NODELIST", "a server replica's nodes, comma-separated: its step's --nodelist")
LG_SERVER_LEADER = _var("LG_SERVER_LEADER", "a server replica's first node (its HTTP endpoint and log name)")
LG_SERVER_LOG = _var("LG_SERVER_LOG", "a server replica's leader log, named when it fails or never becomes healthy")
LG_NODE = _var("LG_NODE", "this node's name (SLURMD_NODENAME; `local` under --bash) [step]", ref=True)
LG_NODE_ADDR = _var("LG_NODE_ADDR", "this node's cluster address (getent ahostsv4; 127.0.0.1 under --bash) [step]",
                    ref=True)
LG_MACHINE_RANK = _var("LG_MACHINE_RANK", "index of this node among the trainer nodes [trainer step]", ref=True)
LG_SERVER_RANK = _var("LG_SERVER_RANK", "index of this node among its replica's server nodes [server step]")
LG_MAIN_PROCESS_IP = _var("LG_MAIN_PROCESS_IP", "name of trainer node 0 (127.0.0.1 under --bash)", ref=True)
LG_SERVER_HOST = _var("LG_SERVER_HOST", "address trainers and the supervisor use to reach the server", ref=True)
LG_SERVER_HOST_YAML = _var("LG_SERVER_HOST_YAML", "LG_SERVER_HOST as a YAML single-quoted scalar [trainer step]",
                           ref=True)
LG_SERVER_BIND = _var("LG_SERVER_BIND", "address `vllm serve --host` binds [server step]", ref=True)
LG_MASTER_ADDR = _var("LG_MASTER_ADDR", "address of a multi-node replica's first node (vLLM's --master-addr, also its "
                      "DP coordinator) [server step]", ref=True)
LG_REPLICAS_YAML = _var("LG_REPLICAS_YAML", "every replica's host, port and group port as a YAML list "
                        "(vllm.replicas > 1) [trainer step]", ref=True)
LG_SUBMIT_DIR = _var("LG_SUBMIT_DIR", "the directory the job was submitted from (mounted into containers) "
                     "[with a container]", ref=True)
LG_HF_CACHE = _var("LG_HF_CACHE", "HF_HOME, default ~/.cache/huggingface (mounted into containers) "
                   "[with a container]", ref=True)

# --- ports (launchgen.shared.ports: the spec's port + the job's offset) --------------------------------------------
LG_PORT_OFFSET = _var("LG_PORT_OFFSET", "the job's port offset (job.port_offset), added to every planned port")
LG_SERVER_PORT = _var("LG_SERVER_PORT", "vllm.port + offset", ref=True)
LG_GROUP_PORT = _var("LG_GROUP_PORT", "vllm.group_port + offset", ref=True)
LG_MAIN_PROCESS_PORT = _var("LG_MAIN_PROCESS_PORT", "train.main_process_port + offset", ref=True)
LG_COLOCATE_MASTER_PORT = _var("LG_COLOCATE_MASTER_PORT", "train.colocate_master_port + offset", ref=True)
LG_DP_RPC_PORT = _var("LG_DP_RPC_PORT", "vllm.dp_rpc_port + offset", ref=True)
LG_MASTER_PORT = _var("LG_MASTER_PORT", "vllm.master_port + offset (a replica over several nodes)", ref=True)

# --- the supervisor ----------------------------------------------------------------------------------------
LG_SERVER_PID = _var("LG_SERVER_PID", "the server step's srun (or process) id, which the supervisor waits on")
LG_TRAINER_PID = _var("LG_TRAINER_PID", "the trainer step's srun (or process) id, which the supervisor waits on")
LG_WATCHER_PID = _var("LG_WATCHER_PID", "the health watcher's process, stopped when the job ends")
LG_FOLLOW_PID = _var("LG_FOLLOW_PID", "the follower that shows the trainer's step lines (tail -F | grep), stopped when the job ends")
LG_STEP_PGIDS = _var("LG_STEP_PGIDS", "file of the steps' process groups, so a signal reaches each whole step")
LG_USR2 = _var("LG_USR2", "1 once the pre-timeout USR2 arrived: the attempt ends as preempted and requeues")
LG_USR2_DEADLINE = _var("LG_USR2_DEADLINE", "when the trainer must have stopped after USR2 before it is killed")
LG_FINISHED = _var("LG_FINISHED", "1 once the supervisor's loop is over: the traps stop forwarding signals")
LG_PREEMPTED = _var("LG_PREEMPTED", "1 when the attempt ended by a signal (exit 75, requeue)")
LG_RC = _var("LG_RC", "the job's exit status, decided as the steps end")
LG_SERVER_RC = _var("LG_SERVER_RC", "the server step's exit status")
LG_TRAINER_RC = _var("LG_TRAINER_RC", "the trainer step's exit status")
LG_TRAINER_FAILED = _var("LG_TRAINER_FAILED", "1 when the trainer ended with an error (not preempted)")
LG_FAILED_LOG = _var("LG_FAILED_LOG", "the failed trainer's log, quoted in the batch log's last lines")
LG_REASON = _var("LG_REASON", "the first error line of that log")
LG_HEALTH_URL = _var("LG_HEALTH_URL", "a server replica's /health URL")
LG_HEALTH_DEADLINE = _var("LG_HEALTH_DEADLINE", "when a server that never became healthy fails the job "
                          "(vllm.health_timeout)")
LG_HEALTHY = _var("LG_HEALTHY", "1 once a replica answered /health")
LG_LAST_OK = _var("LG_LAST_OK", "when a replica last answered /health (a hung one is stopped after HEALTH_LOST_S)")
LG_PROBE_FAILS = _var("LG_PROBE_FAILS", "a replica's /health failures in a row (without restarts: error answers)")
LG_PROBE_RC = _var("LG_PROBE_RC", "the last /health probe: 0 answered 200, 2 answered another status, else no answer")
LG_RANK_NOTE = _var("LG_RANK_NOTE", "which rank of a multi-node server replica ended first or never joined, and "
                    "its node and log (the supervisor's message)")
LG_RANK = _var("LG_RANK", "that rank's index, for the server_failed event")
LG_RANK_NODE = _var("LG_RANK_NODE", "that rank's node, for the server_failed event")
LG_RESTARTS = _var("LG_RESTARTS", "how often a replica was restarted (vllm.restart_replicas)")

# --- the preflight step ------------------------------------------------------------------------------------
LG_PREFLIGHT_T0 = _var("LG_PREFLIGHT_T0", "when the preflight step started")
LG_PREFLIGHT_S = _var("LG_PREFLIGHT_S", "how long it ran, for its event")
LG_PREFLIGHT_RC = _var("LG_PREFLIGHT_RC", "its exit status: a failure ends the attempt before any model loads")
LG_PREFLIGHT_CODES = _var("LG_PREFLIGHT_CODES", "the PF codes the nodes reported, for the event and the log")

# --- what the trainer steps read (the job-directory contract's names) -------------------------------------------
PID_DIR = _var(J.ENV_PID_DIR, "the attempt's pid directory: launchgen.jobside.rank writes, steps/signal.sh reads")
NODE_NAME = _var(J.ENV_NODE_NAME, "the node a trainer rank runs on (its pid directory's name)")
COLOCATE_MASTER_PORT = _var(J.ENV_COLOCATE_MASTER_PORT, "vLLM colocate's process-group port, for the trainer")

# --- a sweep's --bash driver (templates/sweep_bash.j2) ----------------------------------------------------------
LG_SWEEP_STOP = _var("LG_SWEEP_STOP", "1 once Ctrl-C or TERM arrived: no further point starts")
LG_SWEEP_FAILED = _var("LG_SWEEP_FAILED", "1 once a point ended non-zero: the driver's exit status")
LG_SWEEP_RESULTS = _var("LG_SWEEP_RESULTS", "`<point>: exit <status>` of each point run, for the last line")
LG_SWEEP_SLOTS = _var("LG_SWEEP_SLOTS", "how many points run side by side: sweep.max_parallel, fewer where this "
                      "machine's GPUs do not hold that many points")
LG_SWEEP_DEVICES = _var("LG_SWEEP_DEVICES", "this machine's GPUs (CUDA_VISIBLE_DEVICES, else nvidia-smi), sliced "
                        "between the slots")
LG_SWEEP_PIDS = _var("LG_SWEEP_PIDS", "the running points' scripts, one per slot")
LG_SWEEP_NAMES = _var("LG_SWEEP_NAMES", "their names, for the results")
SWEEP_SLOT = _var("LAUNCHGEN_SWEEP_SLOT", "a point's slot among those running side by side under a sweep's --bash "
                  "driver: its port offset (job.port_offset: job_id) instead of the script's PID")

#: Heredoc delimiters, not variables: a Python program the script runs (`python3 - <<'LAUNCHGEN_PY'`), and the
#: files the script embeds (`render.heredoc`: the prefix + a hash of the content, so no content line can end it).
PY_HEREDOC = "LAUNCHGEN_PY"
EOF_PREFIX = "LAUNCHGEN_EOF_"


def ref_vars() -> dict[str, str]:
    """The variables a plan `Ref` may name, with what `launchgen plan` says about each."""
    return {v.name: v.why for v in VARS.values() if v.ref}
