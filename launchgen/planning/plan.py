"""Spec -> Plan: the one place that decides nodes, GPUs, ports, hosts, env and commands.

Interface (what `checks.py`, `render.py`, `planview.py` and `launchgen status` read)
-----------------------------------------------------------------------------------
``build_plan(loaded: LoadedSpec) -> Plan``
    Pure (no I/O, no clock, no environment). It assembles the plan of a spec the checks accepted and reports
    no user error itself; LG909 comes from ``bash_issues`` (``render --bash`` of a multi-node layout).

    Every rule is a check (``launchgen/checks/``; LG901-LG904, LG907, LG908, LG910, LG911 and LG915 kept
    the codes the plan used to raise): a spec they refuse makes ``build_plan`` raise ``PlanInvariantError``, an
    internal error (``_assert_checked``, ``_assert_gpu_layout``, ``_assert_parallel_layout``, with the checks' own
    predicates). Checks run first and call ``build_plan`` only when they found no error, so a user sees one
    message per mistake. The layout itself comes from ``launchgen.shared.layout``.

Pure helpers for checks: ``resolve_gpus(spec) -> GpuAssignment``,
``resolve_ports(spec) -> tuple[Port, ...]``, ``node_layout(spec)``, ``bash_issues(plan)``,
``MAX_PORT_OFFSET`` (largest run-time shift of ``job.port_offset: job_id``).

Run-time values
---------------
Some values are only known on the node at run time (node names, addresses, machine rank, ports shifted by
the job id). The plan names them with ``Ref(var)``: a shell variable the rendered script sets in a fixed
place (documented on ``RUNTIME_VARS``); everything else in the plan is literal and is shell-quoted when rendered.
``EnvVar.literal=False`` values are shell expressions generated here (never spec text).

What a job leaves in its directory (for `launchgen status`)
-----------------------------------------------------------
The layout, the run record (``launchgen-plan.json``: ``Plan.to_json()`` plus the attempt's node names, ports
and log paths), the event lines, exit codes, the completion marker and the pid/exit files are the contract of
``launchgen.shared.jobdir``, which owns them; this module only fills in the static part.
Every trainer rank runs under ``python -m launchgen.jobside.rank`` (``accelerate launch -m launchgen.jobside.rank
launchgen.trainers.<name> ...``), which writes ``$LAUNCHGEN_PID_DIR/$LAUNCHGEN_NODE_NAME/rank<RANK>.pid`` (the
trainer's PID) and ``rank<RANK>.exit`` (its exit status). USR2 reaches the trainers through the pid files
(``steps/signal.sh``), never through ``accelerate launch``, which runs with USR2 ignored; the trainer step exits
with the trainer's own status from the exit files, since ``accelerate launch`` reports any failure as 1.

Node positions: trainer nodes are positions ``0..train.nodes-1``; dedicated server nodes follow. A server that
shares a node (``vllm.nodes: 0``) runs on position 0 with ``vllm.gpus``. GPU indices are positions in the list
of GPUs SLURM gives each step on that node (its ``CUDA_VISIBLE_DEVICES``), so UUID/non-contiguous allocations
work; under ``--bash`` they index the inherited ``CUDA_VISIBLE_DEVICES`` or, when unset, the devices.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from typing import Any

from launchgen import __version__
from launchgen.input.loader import LoadedSpec
from launchgen.input.spec import Spec
from launchgen.kinds.registry import AnyConfig, kind_of, resolve_trainer_config
from launchgen.kinds.trainer_config import build_trainer_config
from launchgen.planning.accelerate_config import accelerate_config
from launchgen.planning.containers import RUNTIMES, ContainerPlan, RoleName, container_plan, role_container
from launchgen.planning.hetjob import SERVER_GROUP, TRAINER_GROUP, is_hetjob, server_overrides
from launchgen.planning.invariants import cpu_server_problem, output_dir_problems, sbatch_value_problems
from launchgen.planning.model import (
    HEALTH_CLIENT_MARGIN_S,
    HEALTH_REQUEST_TIMEOUT_S,
    MAX_PORT_OFFSET,
    POLL_INTERVAL_S,
    RUNTIME_VARS,
    STOP_GRACE_S,
    Argv,
    Endpoint,
    EnvVar,
    GpuAssignment,
    NodePlan,
    Override,
    Plan,
    PlanInvariantError,
    Port,
    Ref,
    ReplicaPlan,
    ServerCommand,
    ServerPlan,
    SlurmPlan,
    TrainerPlan,
    Word,
    _invariant,
    runtime_var_documented,
)
from launchgen.planning.replicas import MAX_REPLICAS, ReplicaPlace
from launchgen.planning.replicas import place as replica_places
from launchgen.planning.reserved import is_reserved
from launchgen.script import scriptvars as V
from launchgen.shared import ports as ports_rule
from launchgen.shared.issues import Issue, SpecError
from launchgen.shared.jobdir import (
    COMPLETE_MARKER,
    ENV_COLOCATE_MASTER_PORT,
    ENV_NODE_NAME,
    EXIT_SERVER_FAILED,
)
from launchgen.shared.jobdir import Layout as JobLayout
from launchgen.shared.layout import GpuSlot, Layout, Role, resolve_layout
from launchgen.shared.precision import precision_conflict, resolve_precision, server_dtype
from launchgen.trainers.declarations.config import yaml_text

# The plan's interface: the data model lives in launchgen.planning.model, the trainer's config in
# launchgen.kinds.trainer_config, the accelerate file in launchgen.planning.accelerate_config; callers import it all from here.
__all__ = [
    "COMPLETE_MARKER", "EXIT_SERVER_FAILED", "HEALTH_CLIENT_MARGIN_S", "HEALTH_REQUEST_TIMEOUT_S", "MAX_PORT_OFFSET",
    "POLL_INTERVAL_S", "RUNTIME_VARS", "STOP_GRACE_S", "Argv", "Endpoint", "EnvVar", "GpuAssignment", "GpuSlot",
    "NodePlan", "Override", "Plan", "PlanInvariantError", "Port", "Ref", "ReplicaPlan", "ServerCommand", "ServerPlan", "SlurmPlan",
    "TrainerPlan", "Word", "accelerate_config", "bash_issues", "build_plan", "build_trainer_config", "node_layout",
    "plan_cpus_per_node", "resolve_gpus", "resolve_ports", "resolve_precision", "runtime_var_documented", "spec_canonical_json",
    "spec_hash",
]


def spec_dump(spec: Spec) -> dict[str, Any]:
    """The resolved spec as JSON data. The `estimate` section only feeds `plan`'s estimate, never the job, so
    it is left out unless written (a spec without it resolves, and hashes, as before the section existed)."""
    data = spec.model_dump(mode="json")
    if "estimate" not in spec.model_fields_set:
        data.pop("estimate", None)
    return data


def spec_canonical_json(spec: Spec) -> str:
    return json.dumps(spec_dump(spec), sort_keys=True, separators=(",", ":"))


def spec_hash(spec: Spec) -> str:
    return hashlib.sha256(spec_canonical_json(spec).encode()).hexdigest()


def node_layout(spec: Spec, lay: Layout | None = None) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(trainer node positions, server node positions); a shared server is on trainer position 0."""
    lay = lay or resolve_layout(spec)
    return lay.trainer_positions, lay.server_positions


def _assert_gpu_layout(spec: Spec, lay: Layout) -> None:
    """The GPU rules the checks enforce (LG101-LG105, LG501, LG903, LG908)."""
    g, v = lay.gpus_per_node, spec.vllm
    for gpus in (lay.server_gpus, lay.trainer_gpus):
        _invariant(all(i < g for i in gpus) and len(set(gpus)) == len(gpus),
                   "a GPU index is out of range or listed twice (LG101/LG102)")
    _invariant(not (lay.shared and set(lay.server_gpus) & set(lay.trainer_gpus)), "server and trainer share a GPU "
               "(LG103)")
    _invariant(lay.mode != "server" or lay.server_cpu or bool(lay.server_gpus), "the server has no GPUs "
               "(LG104/LG903)")
    _invariant(lay.mode != "colocate" or v is None or v.gpus is None, "vllm.gpus in colocate mode (LG501)")
    if lay.cpu:
        _invariant(lay.mode != "colocate" and spec.train.gpus is None, "a CPU trainer with GPUs (LG908)")
    else:
        _invariant(bool(lay.trainer_gpus), "no GPU is left for the trainer (LG105)")


def resolve_gpus(spec: Spec, lay: Layout | None = None) -> GpuAssignment:
    """GPU positions per role, from the layout resolver, for a spec the checks accepted."""
    lay = lay or resolve_layout(spec)
    _assert_gpu_layout(spec, lay)
    return GpuAssignment(lay.trainer_positions, lay.server_positions, lay.trainer_gpus, lay.server_gpus,
                         lay.shared_position)


def resolve_ports(spec: Spec, lay: Layout | None = None) -> tuple[Port, ...]:
    """Every port with the node position that binds it (base values; the offset is added at run time)."""
    t, v = spec.train, spec.vllm
    lay = lay or resolve_layout(spec)
    _, server_pos = node_layout(spec, lay)
    ports: list[Port] = [
        Port("main_process", t.main_process_port, V.LG_MAIN_PROCESS_PORT, 0, "trainer rank 0 (torch rendezvous)",
             "every trainer process", "train.main_process_port"),
    ]
    if v is not None and v.mode == "server":
        places = replica_places(lay, v.replicas)
        # a spec whose replicas do not fit (LG201/LG220) still gets every replica's ports for the port checks; of
        # more replicas than LG222 allows only the first MAX_REPLICAS (the port checks compare ports pairwise)
        count = min(v.replicas, MAX_REPLICAS)
        leaders = [p.positions[0] for p in places[:count]] if places else [server_pos[0]] * count
        for k, leader in enumerate(leaders):
            sfx, of = ("", "") if k == 0 else (f"_R{k}", f" replica {k}")
            ports.append(Port("server_http", ports_rule.replica_port(v.port, k), V.LG_SERVER_PORT + sfx, leader,
                              f"vllm serve{of} (HTTP API)", "trainer rank 0 and the supervisor", "vllm.port", k))
            ports.append(Port("group", ports_rule.replica_port(v.group_port, k), V.LG_GROUP_PORT + sfx, 0,
                              f"trainer rank 0 (NCCL weight-transfer rendezvous{of})", "every server worker",
                              "vllm.group_port", k))
            if lay.multi_node:
                ports.append(Port("master", ports_rule.replica_port(v.master_port, k), V.LG_MASTER_PORT + sfx,
                                  leader, f"vllm serve{of} rank 0 (torch.distributed rendezvous)",
                                  "the replica's headless server nodes", "vllm.master_port", k))
            if lay.multi_node_dp:
                ports.append(Port("dp_rpc", ports_rule.replica_port(v.dp_rpc_port, k), V.LG_DP_RPC_PORT + sfx,
                                  leader, f"vllm serve{of} (DP coordinator)", "headless server nodes",
                                  "vllm.dp_rpc_port", k))
    if v is not None and v.mode == "colocate":
        ports.append(Port("colocate_master", t.colocate_master_port, V.LG_COLOCATE_MASTER_PORT, 0,
                          "trainer rank 0 (vLLM external launcher)", "every trainer process",
                          "train.colocate_master_port"))
    return tuple(ports)


def plan_cpus_per_node(gpus: GpuAssignment, trainer_ppn: int) -> int:
    """The most processes one node runs: its vLLM workers (one per server GPU) plus its trainer processes.

    Requested as --cpus-per-task (one task per node) when nodes are shared and slurm.cpus_per_task is unset:
    a shared job would otherwise hold one CPU per node for all of them.
    """
    server, trainer = set(gpus.server_positions), set(gpus.trainer_positions)
    counts = [(len(gpus.server_gpus) if p in server else 0) + (trainer_ppn if p in trainer else 0)
              for p in server | trainer]
    return max([1, *counts])


def _resource_directives(spec: Spec, nodes: int, gpus: bool, plan_cpus: int,
                         own: dict[str, str] | None = None) -> list[str]:
    """One component's nodes, GPUs, CPUs, memory, time, partition/account/qos and exclusivity (`own`: the server
    component's values of a heterogeneous job, launchgen.planning.hetjob)."""
    s, own = spec.slurm, own or {}
    d = [f"--nodes={nodes}", "--ntasks-per-node=1"]
    if gpus:
        g, gpu_type = s.gpus_per_node, own.get("gpu_type", s.gpu_type)
        if s.gpu_request == "gres":
            d.append(f"--gres=gpu:{gpu_type}:{g}" if gpu_type else f"--gres=gpu:{g}")
        else:
            d.append(f"--gpus-per-node={gpu_type}:{g}" if gpu_type else f"--gpus-per-node={g}")
    if s.cpus_per_task is not None:
        d.append(f"--cpus-per-task={s.cpus_per_task}")
    elif not s.exclusive:
        d.append(f"--cpus-per-task={plan_cpus}")
    if s.mem is not None:
        d.append(f"--mem={s.mem}")
    d.append(f"--time={s.time}")
    for opt in ("partition", "account", "qos"):
        val = own.get(opt, getattr(s, opt))
        if val is not None:
            d.append(f"--{opt}={val}")
    if s.exclusive:
        d.append("--exclusive")
    return d


def _server_uses_gpus(spec: Spec) -> bool:
    return spec.vllm is not None and spec.vllm.mode == "server" and spec.vllm.device == "cuda"


def _het_directives(spec: Spec, lay: Layout, plan_cpus: int) -> tuple[str, ...]:
    """The server component's `#SBATCH` lines of a heterogeneous job (none otherwise)."""
    if not is_hetjob(spec):
        return ()
    return tuple(_resource_directives(spec, len(lay.server_positions), _server_uses_gpus(spec), plan_cpus,
                                      server_overrides(spec)))


def _sbatch_directives(spec: Spec, lay: Layout, batch_log: str, plan_cpus: int) -> tuple[str, ...]:
    s = spec.slurm
    het = is_hetjob(spec)
    # a heterogeneous job's first component is the trainer nodes alone (the server's: _het_directives)
    nodes = len(lay.trainer_positions) if het else lay.num_nodes
    gpus = spec.train.device == "cuda" or (not het and _server_uses_gpus(spec))
    d = [f"--job-name={spec.job.name}", *_resource_directives(spec, nodes, gpus, plan_cpus)]
    d.append(f"--output={batch_log}")
    d.append("--open-mode=append")
    if s.signal_grace > 0:
        d.append(f"--signal=B:USR2@{s.signal_grace}")
    d.append("--requeue" if s.max_restarts > 0 else "--no-requeue")
    d.extend(x.strip() for x in s.extra_directives)
    return tuple(d)


def _user_env(spec: Spec, role: Role) -> list[EnvVar]:
    env = [EnvVar(k, v, True, "slurm.env.all") for k, v in spec.slurm.env.all.items()]
    env += [EnvVar(k, v, True, f"slurm.env.{role}") for k, v in getattr(spec.slurm.env, role).items()]
    return env


def _select_gpus_expr(gpus: tuple[int, ...]) -> str:
    return '"$(lg_select_gpus ' + " ".join(str(i) for i in gpus) + ')"'


def _assert_parallel_layout(lay: Layout) -> None:
    """The TP/DP rules the checks enforce (LG201, LG202, LG209, LG904 in colocate)."""
    if lay.mode == "server" and not lay.server_cpu:
        _invariant(lay.tp_dp_matches_server and lay.server_tp_tiles_nodes,
                   "TP x PP x DP does not tile the server GPUs node by node (LG201/LG202)")
    elif lay.mode == "colocate":
        _invariant(lay.data_parallel_size == 1, "data_parallel_size in colocate mode (LG904)")
        _invariant(lay.colocate_tp_fits, "colocate TP does not divide the trainer processes of a node (LG209)")


def _node_plan(lay: Layout, pos: int) -> NodePlan:
    machine_rank, server_rank = lay.machine_rank(pos), lay.server_rank(pos)
    roles: tuple[Role, ...] = (*(("server",) if server_rank is not None else ()),
                               *(("trainer",) if machine_rank is not None else ()))
    return NodePlan(pos, roles, lay.server_gpus if server_rank is not None else (),
                    lay.trainer_gpus if machine_rank is not None else (), machine_rank, server_rank, lay.slots(pos))


# --------------------------------------------------------------------------------------------------- build

def _assert_checked(spec: Spec, lay: Layout) -> None:
    """The rules the checks own that the plan relies on; a spec they refuse never gets here (run_checks)."""
    _invariant(not precision_conflict(spec), "train.bf16/train.fp16 contradict train.precision (LG605/LG606)")
    _invariant(not any(is_reserved(name) for role in ("all", "server", "trainer")
                       for name in getattr(spec.slurm.env, role)), "slurm.env sets a reserved variable (LG807)")
    _invariant(not kind_of(spec).refused(spec.train.args), "train.args sets a field the spec owns (LG902)")
    _invariant(not sbatch_value_problems(spec), "an #SBATCH value is empty or contains whitespace (LG907)")
    _invariant(output_dir_problems(spec.job.output_dir) is None,
               "job.output_dir is not a plain path the job script expands (LG910/LG911)")
    _invariant(cpu_server_problem(spec, lay) is None, "a CPU vLLM server that cannot run here (LG915)")
    _assert_parallel_layout(lay)
    _invariant(not is_hetjob(spec) or not lay.shared, "a heterogeneous job whose server shares a node (LG261)")


def build_plan(loaded: LoadedSpec, config: AnyConfig | None = None) -> Plan:
    """The plan of a spec the checks accepted: assembles the parts from the layout and asserts the checks' rules
    (PlanInvariantError, an internal error: run_checks reports every user mistake before calling this). `config`:
    the trainer's config the checks resolved from this spec (`Ctx.resolved_config`), else resolved here."""
    spec = loaded.spec
    lay = resolve_layout(spec)
    _assert_checked(spec, lay)
    precision = resolve_precision(spec)
    if config is None:
        config, _ = resolve_trainer_config(spec, loaded)
    _invariant(config is not None, "train.args does not validate as the trainer's config (LG901)")
    assert config is not None
    gpus = resolve_gpus(spec, lay)
    batch_log = f"{spec.job.name}-%j.out"
    s = spec.slurm
    plan_cpus = plan_cpus_per_node(gpus, lay.processes_per_node)
    directives = _sbatch_directives(spec, lay, batch_log, plan_cpus)
    slurm = SlurmPlan(directives, tuple(s.setup), s.signal_grace, s.max_restarts, s.max_restarts > 0,
                      s.cpus_per_task, _het_directives(spec, lay, plan_cpus))
    h = spec_hash(spec)
    spec_yaml = (f"# resolved by launchgen {__version__}; sha256 {h}\n"
                 + yaml_text(spec_dump(spec), sort_keys=False))
    return Plan(
        version=__version__, source=loaded.path, spec=spec, spec_yaml=spec_yaml, spec_hash=h,
        job_name=spec.job.name, num_nodes=lay.num_nodes, gpus_per_node=s.gpus_per_node, device=spec.train.device,
        nodes=tuple(_node_plan(lay, pos) for pos in range(lay.num_nodes)), ports=resolve_ports(spec, lay),
        port_offset=spec.job.port_offset == "job_id", endpoints=_endpoints(lay, gpus), preflight=spec.job.preflight,
        server=_server_plan(spec, lay, gpus) if lay.mode == "server" else None,
        trainer=_trainer_plan(spec, lay, gpus, precision, config),
        layout=JobLayout(output_dir=spec.job.output_dir, batch_log=batch_log), slurm=slurm, vllm_mode=lay.mode,
        usr2_stop_after=s.signal_grace // 2,
    )


def _endpoints(lay: Layout, gpus: GpuAssignment) -> tuple[Endpoint, ...]:
    """Who connects to which port on which node (the plan view's table)."""
    first = gpus.trainer_positions[0]
    endpoints = [Endpoint("trainer processes", first, "main_process", Ref(V.LG_MAIN_PROCESS_IP),
                          "torch/accelerate rendezvous")]
    places = replica_places(lay, lay.replicas) if lay.mode == "server" else None
    for rp in places or ():
        what, sfx = ("", "") if lay.replicas == 1 else (f" (replica {rp.index})", f"_R{rp.index}" if rp.index else "")
        endpoints += [
            Endpoint("trainer rank 0, supervisor", rp.positions[0], "server_http", Ref(V.LG_SERVER_HOST + sfx),
                     "generation requests, weight-update control, /health" + what),
            Endpoint("server workers" + what, first, "group", Ref(V.LG_MAIN_PROCESS_IP),
                     "NCCL weight-transfer rendezvous (advertised by trainer rank 0 as VLLM_HOST_IP)"),
        ]
        if lay.multi_node:
            endpoints.append(Endpoint("headless server nodes" + what, rp.positions[0], "master",
                                      Ref(V.LG_MASTER_ADDR), "vLLM's engine rendezvous (--master-addr/--master-port)"))
        if lay.multi_node_dp:
            endpoints.append(Endpoint("headless server nodes" + what, rp.positions[0], "dp_rpc",
                                      Ref(V.LG_MASTER_ADDR), "vLLM data-parallel coordination"))
    if lay.mode == "colocate":
        endpoints.append(Endpoint("trainer processes (vLLM)", first, "colocate_master",
                                  Ref(V.LG_MAIN_PROCESS_IP), "vLLM external-launcher rendezvous"))
    return tuple(endpoints)


def _server_common_argv(spec: Spec, lay: Layout, sfx: str = "") -> list[Word]:
    """The `vllm serve` words every server node of a replica runs (`_node_argv` adds each node's own)."""
    v = spec.vllm
    assert v is not None
    tp, pp, dp = lay.tensor_parallel_size, lay.pipeline_parallel_size, lay.data_parallel_size
    common: list[Word] = [*v.executable_words, "serve", spec.model.name_or_path]
    if spec.model.revision:
        common += ["--revision", spec.model.revision]
    if spec.model.trust_remote_code:
        common.append("--trust-remote-code")
    common += ["--dtype", server_dtype(spec), "--tensor-parallel-size", str(tp)]
    if pp > 1:
        common += ["--pipeline-parallel-size", str(pp)]
    if dp > 1:
        common += ["--data-parallel-size", str(dp)]
    if v.enable_expert_parallel:
        common.append("--enable-expert-parallel")
        if v.all2all_backend is not None:
            common += ["--all2all-backend", v.all2all_backend]
        if v.enable_eplb:
            common.append("--enable-eplb")
    if lay.multi_node:
        # vLLM's own multi-node mode (no Ray): every node names the replica's size and rank 0's rendezvous; with
        # DP, vLLM infers each node's DP ranks from --node-rank and coordinates them at the same address
        common += ["--nnodes", str(lay.replica_nodes), "--master-addr", Ref(V.LG_MASTER_ADDR),
                   "--master-port", Ref(V.LG_MASTER_PORT + sfx)]
        if lay.multi_node_dp:
            common += ["--data-parallel-rpc-port", Ref(V.LG_DP_RPC_PORT + sfx)]
    if v.device == "cuda":
        common += ["--gpu-memory-utilization", repr(v.gpu_memory_utilization)]
    if v.kv_cache_memory_bytes is not None:
        common += ["--kv-cache-memory-bytes", str(v.kv_cache_memory_bytes)]
    if v.max_model_len is not None:
        common += ["--max-model-len", str(v.max_model_len)]
    if v.enable_prefix_caching is not None:
        common.append("--enable-prefix-caching" if v.enable_prefix_caching else "--no-enable-prefix-caching")
    if v.enforce_eager:
        common.append("--enforce-eager")
    common += ["--weight-transfer-config", f'{{"backend": "{v.transfer_backend}"}}', "--logprobs-mode",
               "processed_logprobs", "--max-logprobs", "-1"]
    return common


def _server_plan(spec: Spec, lay: Layout, gpus: GpuAssignment) -> ServerPlan:
    v = spec.vllm
    assert v is not None
    places = replica_places(lay, v.replicas)
    _invariant(places is not None, "the server replicas do not cut the server GPUs into equal parts (LG201/LG220)")
    assert places is not None
    replicas = tuple(_replica_plan(spec, lay, rp) for rp in places)
    container = _role_container(spec, "server", v.device == "cuda", replicas[0].env)
    if container is not None:
        replicas = tuple(_contained(r, container) for r in replicas)
    return ServerPlan(gpus.server_positions, gpus.server_gpus, lay.tensor_parallel_size, lay.data_parallel_size,
                      lay.data_parallel_size_local, lay.multi_node_dp, v.bind, replicas[0].commands, replicas[0].env,
                      "/health", v.health_timeout, " ".join(v.executable_words), replicas,
                      v.max_replica_restarts if v.restart_replicas else 0, container=container,
                      het_group=SERVER_GROUP if is_hetjob(spec) else None,
                      pipeline_parallel_size=lay.pipeline_parallel_size, multi_node=lay.multi_node)


def _role_container(spec: Spec, role: RoleName, uses_gpus: bool, env: tuple[EnvVar, ...]) -> ContainerPlan | None:
    section, source = role_container(spec, role)
    return None if section is None else container_plan(section, source, uses_gpus=uses_gpus, command_env=env)


def _contained(r: ReplicaPlan, c: ContainerPlan) -> ReplicaPlan:
    """Replica `r` with its commands run through the container's prefix and its variables forced inside."""
    commands = tuple(dataclasses.replace(cmd, argv=(*c.prefix, *cmd.argv)) for cmd in r.commands)
    return dataclasses.replace(r, commands=commands, env=(*r.env, *c.env))


def _replica_plan(spec: Spec, lay: Layout, rp: ReplicaPlace) -> ReplicaPlan:
    """One replica's commands (leader, then headless DP nodes) and environment; its ports are `base + index`."""
    v = spec.vllm
    assert v is not None
    sfx = "" if rp.index == 0 else f"_R{rp.index}"  # its script variables (ReplicaPlan.var)
    common = _server_common_argv(spec, lay, sfx)
    commands = []
    for k, pos in enumerate(rp.positions):
        argv: list[Word] = [*common, *(("--node-rank", str(k)) if lay.multi_node else ())]
        if k == 0:
            if lay.data_parallel_size > 1:
                # vLLM defaults to one API server per DP rank; only one would carry the dev routes
                argv += ["--api-server-count", "1"]
            argv += ["--host", Ref(V.LG_SERVER_BIND), "--port", Ref(V.LG_SERVER_PORT + sfx)]
        else:
            argv.append("--headless")  # rank k > 0: engine workers only, joined to rank 0's engine
        argv += list(v.extra_args)
        commands.append(ServerCommand(pos, k, tuple(argv)))
    senv = [
        EnvVar("CUDA_VISIBLE_DEVICES", _select_gpus_expr(rp.gpus), False) if v.device == "cuda"
        else EnvVar("CUDA_VISIBLE_DEVICES", ""),
        EnvVar("VLLM_SERVER_DEV_MODE", "1"),
        EnvVar("VLLM_HOST_IP", '"$LG_NODE_ADDR"', False),
        *_user_env(spec, "server"),
    ]
    return ReplicaPlan(rp.index, rp.name, rp.positions, rp.gpus, tuple(commands), tuple(senv), v.replicas)


def _trainer_env(spec: Spec, lay: Layout, gpus: GpuAssignment) -> list[EnvVar]:
    tenv: list[EnvVar] = []
    if spec.train.device == "cpu":
        tenv.append(EnvVar("CUDA_VISIBLE_DEVICES", ""))
    else:
        tenv.append(EnvVar("CUDA_VISIBLE_DEVICES", _select_gpus_expr(gpus.trainer_gpus), False))
    tenv += [
        EnvVar("VLLM_HOST_IP", '"$LG_NODE_ADDR"', False),
        EnvVar(ENV_NODE_NAME, '"$LG_NODE"', False),
    ]
    if lay.mode == "colocate":
        tenv.append(EnvVar(ENV_COLOCATE_MASTER_PORT, '"$LG_COLOCATE_MASTER_PORT"', False))
    return tenv + _user_env(spec, "trainer")


def _trainer_plan(spec: Spec, lay: Layout, gpus: GpuAssignment, precision: str, config: AnyConfig) -> TrainerPlan:
    t = spec.train
    num_machines, num_processes = lay.num_machines, lay.world_size
    module = config.facts.entry_module
    overrides = kind_of(spec).overrides(lay.mode, lay.replicas)
    targv: list[Word] = [
        "accelerate", "launch", "--config_file", Ref(V.LG_ACCELERATE_CONFIG),
        "--num_machines", str(num_machines), "--num_processes", str(num_processes),
        "--machine_rank", Ref(V.LG_MACHINE_RANK), "--main_process_ip", Ref(V.LG_MAIN_PROCESS_IP),
        "--main_process_port", Ref(V.LG_MAIN_PROCESS_PORT),
        # launchgen.jobside.rank runs the trainer module and records its pid and exit status (see launchgen/jobside/rank.py)
        "-m", "launchgen.jobside.rank", module, "--config", Ref(V.LG_TRAINER_CONFIG),
    ]
    for o in overrides:
        targv += ["--set", o.value]
    try:
        acc = accelerate_config(t.backend, precision, num_machines, num_processes, t.device, t.distributed)
    except (OSError, ValueError) as e:  # the user's accelerate file (LG633 in `check`'s file stage too)
        raise SpecError([Issue("LG633", "train.distributed.accelerate_config", f"cannot read it: {e}",
                               "Fix the path (relative paths start at the submit directory) or the file.")]) from None
    tenv = tuple(_trainer_env(spec, lay, gpus))
    container = _role_container(spec, "trainer", t.device == "cuda", tenv)
    if container is not None:
        targv = [*container.prefix, *targv]
        tenv = (*tenv, *container.env)
    return TrainerPlan(
        positions=gpus.trainer_positions, gpus=gpus.trainer_gpus, device=t.device, num_machines=num_machines,
        processes_per_node=lay.processes_per_node, num_processes=num_processes, backend=t.backend, module=module,
        argv=tuple(targv), env=tenv, unset_env=("VLLM_SERVER_DEV_MODE",), container=container,
        het_group=TRAINER_GROUP if is_hetjob(spec) else None,
        overrides=tuple(overrides), accelerate_config=acc,
        accelerate_config_yaml=yaml_text(acc, sort_keys=True), config=config,
        config_yaml="# output_dir, the server host and the ports are replaced at run time (--set)\n"
        + config.to_yaml(),
        colocate=lay.mode == "colocate",
    )


def bash_issues(plan: Plan) -> list[Issue]:
    """Why `plan` cannot run under `--bash` (one machine), as LG909 and LG254 issues."""
    if plan.num_nodes > 1:
        return [Issue("LG909", "train.nodes", f"the layout needs {plan.num_nodes} nodes but --bash runs on one "
                      "machine", "Render without --bash, or use one trainer node and `vllm.nodes: 0`.",
                      "error", None, plan.source)]
    for c in (plan.server.container if plan.server else None, plan.trainer.container):
        if c is not None and RUNTIMES[c.runtime].needs_slurm:
            return [Issue("LG254", f"{c.source}.runtime", f"{c.runtime} runs containers only through `srun` "
                          "(SLURM), which --bash does not use", "Render without --bash, or use apptainer or "
                          "charliecloud for a run on this machine.", "error", None, plan.source)]
    return []
