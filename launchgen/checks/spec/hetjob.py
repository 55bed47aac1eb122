"""Checks of a heterogeneous job (LG260-LG261): the server on its own partition/account/qos/GPU type.

What makes a spec one is `launchgen.planning.hetjob`; these refuse what SLURM cannot express: one node belongs to one
component, so the server needs dedicated nodes, and an in-process (colocate) vLLM has no nodes of its own.
"""

from __future__ import annotations

from collections.abc import Iterator

from launchgen.checks.context import Ctx
from launchgen.checks.registry import _doc, check
from launchgen.planning.hetjob import SERVER_FIELDS, server_overrides
from launchgen.shared.issues import Issue

_doc("LG260", "error", "vllm.partition / account / qos / gpu_type in colocate mode: vLLM runs inside the trainer "
     "processes, so it cannot have a partition or GPU type of its own (SLURM has no such job).",
     "Remove those fields, or use `vllm.mode: server` with dedicated server nodes (`vllm.nodes`).")
_doc("LG261", "error", "vllm.partition / account / qos / gpu_type differ from slurm's but the server shares a trainer "
     "node (`vllm.nodes: 0`): a node belongs to one component of a heterogeneous job.",
     "Give the server nodes of its own (`vllm.nodes: N`), or remove the server's own partition/account/qos/gpu_type.")


def _first_set(ctx: Ctx) -> str | None:
    v = ctx.spec.vllm
    return next((f"vllm.{n}" for n in SERVER_FIELDS if v is not None and getattr(v, n) is not None), None)


@check("LG260", "LG261")
def hetjob_expressible(ctx: Ctx) -> Iterator[Issue]:
    v = ctx.spec.vllm
    path = _first_set(ctx)
    if v is None or path is None:
        return
    if v.mode != "server":
        yield ctx.issue("LG260", path, f"{path} is set but vllm.mode is {v.mode}: the server has no nodes of its own")
    elif server_overrides(ctx.spec) and v.nodes == 0:
        own = ", ".join(f"{k}={val}" for k, val in server_overrides(ctx.spec).items())
        yield ctx.issue("LG261", path, f"the server's own {own} asks for a heterogeneous job, but vllm.nodes is 0 "
                        "(the server shares trainer node 0)")
