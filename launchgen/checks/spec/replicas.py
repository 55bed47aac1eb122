"""Checks of `vllm.replicas` (LG220-LG229): placement, mode, count, addresses and restarts of server replicas.

LG201 (TP x DP x replicas against the server's GPUs) stays in `checks.py`; these stand down where it fires, so a
mistake gets one message. The placement math is `launchgen.planning.replicas`.
"""

from __future__ import annotations

from collections.abc import Iterator

from launchgen.checks.context import Ctx
from launchgen.checks.registry import _doc, check
from launchgen.planning.replicas import MAX_REPLICAS, place
from launchgen.shared.issues import Issue

_doc("LG220", "error", "The server replicas do not cut into whole nodes or equal slices of a node's server GPUs "
     "(a replica's TP x DP GPUs neither a multiple nor a divisor of the server GPUs per node).",
     "Make tensor_parallel_size x data_parallel_size a divisor of the server GPUs per node (several replicas per "
     "node) or a multiple of them (whole nodes per replica).")
_doc("LG221", "error", "vllm.replicas > 1 outside server mode.",
     "Remove vllm.replicas: colocate runs one vLLM engine inside each trainer process.")
_doc("LG222", "error", f"More than {MAX_REPLICAS} server replicas.",
     f"Use at most {MAX_REPLICAS} replicas (replica k listens on vllm.port + k, and jobs' port offsets are 10 "
     "apart), or make each replica larger (tensor_parallel_size / data_parallel_size).")
_doc("LG223", "error", "Several server replicas with vllm.bind set to one address: each replica needs the "
     "address of its own node.",
     "Set vllm.bind to `node` (each replica binds its node's address) or `0.0.0.0`.")


_doc("LG224", "error", "vllm.restart_replicas with a single replica: while it restarts there is no replica to "
     "generate on.",
     "Set vllm.replicas to 2 or more, or remove vllm.restart_replicas.")
_doc("LG225", "warning", "vllm.max_replica_restarts is set but vllm.restart_replicas is off, so it has no effect.",
     "Set vllm.restart_replicas: true, or remove vllm.max_replica_restarts.")


@check("LG220")
def replicas_tile_nodes(ctx: Ctx) -> Iterator[Issue]:
    v, lay = ctx.spec.vllm, ctx.layout
    if v is None or v.mode != "server" or v.replicas == 1 or lay.server_cpu:
        return
    if not lay.server_world_size or not lay.tp_dp_matches_server or len(set(lay.server_gpus)) != len(lay.server_gpus):
        return  # the count itself is wrong: LG201's (or LG102's, LG104's) message
    if not lay.server_tp_tiles_nodes:
        return  # a TP group across nodes: LG202's message
    if place(lay, v.replicas) is None:
        yield ctx.issue("LG220", "vllm.replicas",
                        f"{v.replicas} replicas of {lay.replica_size} GPU(s) (tensor_parallel_size "
                        f"{v.tensor_parallel_size} x data_parallel_size {v.data_parallel_size}) do not cut the "
                        f"{len(lay.server_positions)} server node(s) x {lay.server_gpus_per_node} GPU(s) into whole "
                        "nodes or equal slices of one node")


@check("LG221")
def replicas_need_server_mode(ctx: Ctx) -> Iterator[Issue]:
    v = ctx.spec.vllm
    if v is not None and v.mode != "server" and v.replicas != 1:
        yield ctx.issue("LG221", "vllm.replicas", f"vllm.replicas is {v.replicas} but vllm.mode is {v.mode}")


@check("LG222")
def replicas_within_port_window(ctx: Ctx) -> Iterator[Issue]:
    v = ctx.spec.vllm
    if v is not None and v.mode == "server" and v.replicas > MAX_REPLICAS:
        yield ctx.issue("LG222", "vllm.replicas", f"vllm.replicas is {v.replicas}; at most {MAX_REPLICAS}")


@check("LG223")
def replicas_bind_their_node(ctx: Ctx) -> Iterator[Issue]:
    v = ctx.spec.vllm
    if v is not None and v.mode == "server" and v.replicas > 1 and v.bind not in ("node", "0.0.0.0"):
        yield ctx.issue("LG223", "vllm.bind", f"vllm.bind is {v.bind!r} with {v.replicas} replicas")


@check("LG224", "LG225")
def replica_restarts_sane(ctx: Ctx) -> Iterator[Issue]:
    v = ctx.spec.vllm
    if v is None or v.mode != "server":
        return
    if v.restart_replicas and v.replicas == 1:
        yield ctx.issue("LG224", "vllm.restart_replicas", "vllm.restart_replicas is true but vllm.replicas is 1")
    if not v.restart_replicas and "max_replica_restarts" in v.model_fields_set:
        yield ctx.issue("LG225", "vllm.max_replica_restarts",
                        f"vllm.max_replica_restarts is {v.max_replica_restarts} but vllm.restart_replicas is off")
