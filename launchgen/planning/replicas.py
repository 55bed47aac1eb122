"""Where each vLLM server replica runs: the pure placement math of `vllm.replicas` (stdlib + the layout).

A replica is one independent `vllm serve` group of `tensor_parallel_size x pipeline_parallel_size x
data_parallel_size` GPUs. The
server's GPUs (`Layout.server_positions` x `Layout.server_gpus`, in that order) are cut into `replicas` equal
consecutive slices:

- a replica at least as large as a node's server GPUs takes whole nodes (its size a multiple of them);
- a smaller one takes a consecutive slice of one node's server GPUs (its size dividing them);
- a CPU server (no GPUs) runs every replica on the server node, or its one replica with one worker on each
  of its nodes (`Layout.cpu_one_per_node`).

`place` returns None where no such cut exists (the checks report LG220); the plan asserts it never does.
Ports: replica k listens on `vllm.port + k` and has its weight-transfer group on `vllm.group_port + k`
(`launchgen.shared.ports.replica_port`).
"""

from __future__ import annotations

from dataclasses import dataclass

from launchgen.shared.jobdir import replica_role as replica_role
from launchgen.shared.layout import Layout

#: At most this many replicas: their ports `base + k` stay inside the 10-port window one job owns under
#: `job.port_offset: job_id` (jobs are 10 apart).
MAX_REPLICAS = 10


@dataclass(frozen=True)
class ReplicaPlace:
    index: int
    positions: tuple[int, ...]  # node positions, leader first
    gpus: tuple[int, ...]  # GPU positions on each of its nodes; () on a CPU server

    @property
    def name(self) -> str:
        """The replica's role name in pid, step and log file names: `server` for replica 0, else `server-r<k>`."""
        return replica_role(self.index)


def tiles(lay: Layout, replicas: int) -> bool:
    """`replicas` replicas of TP x DP GPUs cover the server's GPUs exactly (LG201's rule with replicas)."""
    return lay.replica_size * replicas == lay.server_world_size


def place(lay: Layout, replicas: int) -> tuple[ReplicaPlace, ...] | None:
    """Each replica's nodes and GPUs, or None when the server's GPUs do not cut into such replicas."""
    if lay.mode != "server" or not lay.server_positions:
        return None
    if lay.cpu_one_per_node:
        return (ReplicaPlace(0, lay.server_positions, ()),)
    if lay.server_cpu:
        return tuple(ReplicaPlace(k, (lay.server_positions[0],), ()) for k in range(replicas))
    per_node, size = lay.server_gpus_per_node, lay.replica_size
    if not tiles(lay, replicas) or per_node == 0:
        return None
    if size >= per_node:
        if size % per_node:
            return None
        span = size // per_node
        return tuple(ReplicaPlace(k, lay.server_positions[k * span:(k + 1) * span], lay.server_gpus)
                     for k in range(replicas))
    if per_node % size:
        return None
    per = per_node // size
    return tuple(ReplicaPlace(k, (lay.server_positions[k // per],),
                              lay.server_gpus[(k % per) * size:(k % per + 1) * size]) for k in range(replicas))
