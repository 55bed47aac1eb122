"""LG240-LG242: does each role fit its GPUs (the memory estimate of `launchgen.planning.estimate_spec`, issue 26).

* LG240 (error): a vLLM rank cannot hold its share of the weights and one `max_model_len` sequence of KV cache
  (vLLM refuses to start); the fix names the smallest tensor_parallel_size that fits.
* LG241 (error): a trainer process's weights, gradients and optimizer state alone exceed its GPU; the fix names
  the changes after which the estimate fits (ZeRO-3, offload, LoRA, checkpointing).
* LG242 (warning): within 10 % of the GPU, or over it only through the rough activation bound; a server whose KV
  cache holds fewer than two full-length sequences.

They say nothing when the model's numbers or the GPU's memory are unknown (`plan` says what is missing);
`check --live` on a GPU node judges again with nvidia-smi's memory (`probe_gpu_memory`).
Registered with `launchgen.checks.registry.check` like every check; the `--live` probe is `checks/live/fit.py`.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from launchgen.checks.context import Ctx
from launchgen.checks.registry import _doc, check
from launchgen.planning.estimate_spec import Estimate, estimate
from launchgen.shared.estimate import DTYPE_BYTES, RoleEstimate, smallest_tp, trainer_alternatives
from launchgen.shared.issues import Issue

if TYPE_CHECKING:
    pass

_doc("LG240", "error", "A vLLM rank cannot hold its share of the weights plus one max_model_len sequence of KV cache "
     "(estimated from the model's numbers and the GPU's memory); vLLM would refuse to start.",
     "Raise vllm.tensor_parallel_size (the message names the smallest that fits), lower vllm.max_model_len, or "
     "raise vllm.gpu_memory_utilization.")
_doc("LG241", "error", "A trainer process's weights, gradients and optimizer state alone exceed its GPU's memory "
     "under train.backend.",
     "Use train.backend: deepspeed_zero3 (or fsdp) to shard them, CPU offload (train.distributed), LoRA "
     "(train.args.peft), or more trainer nodes; the message names the changes that fit.")
_doc("LG242", "warning", "A role's memory estimate is within 10 % of its GPU (or over it through the rough activation "
     "bound), or the server's KV cache holds fewer than two full-length sequences.",
     "Leave headroom: shorter sequences or smaller per_device_train_batch_size, gradient checkpointing, "
     "max_tokens_per_forward, a larger TP; `launchgen plan` shows the breakdown.")


def _gib(x: float) -> str:
    return f"{x:.1f} GiB"


def _where(e: Estimate) -> str:
    return f"{_gib(e.gpu_gib or 0)} GPUs ({e.sources.get('gpu memory', '?')})"


def _server(ctx: Ctx, e: Estimate, s: RoleEstimate) -> Iterator[Issue]:
    v = ctx.spec.vllm
    if v is None or e.shape is None or e.gpu_gib is None:
        return
    tp, pp = v.tensor_parallel_size, ctx.layout.pipeline_parallel_size
    weights = s.parts[0].gib
    per_seq = e.shape.kv_bytes_per_token(DTYPE_BYTES[s.dtype], tp, pp) * (s.max_model_len or 0) / 2**30
    if s.verdict == "does not fit":
        best = smallest_tp(e.shape, dtype=s.dtype, gpu_gib=e.gpu_gib, max_model_len=v.max_model_len,
                           gpu_memory_utilization=v.gpu_memory_utilization,
                           kv_cache_memory_bytes=v.kv_cache_memory_bytes, limit=ctx.spec.slurm.gpus_per_node, pp=pp)
        fix = (f"Raise vllm.tensor_parallel_size to {best} (the smallest TP whose ranks hold the weights and a "
               f"{s.max_model_len}-token sequence)" if best is not None and best > tp else
               "No TP within one node fits: add server nodes and split the layers with "
               "vllm.pipeline_parallel_size, or use GPUs with more memory or a smaller model")
        over_weights = s.total_gib - (s.kv_gib or 0) > (s.budget_gib or 0)
        if not over_weights and v.max_model_len is not None:
            fix += f", or lower vllm.max_model_len (one {v.max_model_len}-token sequence needs {_gib(per_seq)} of KV)"
        fix += ", or raise vllm.gpu_memory_utilization."
        path = "vllm.tensor_parallel_size" if over_weights or v.max_model_len is None else "vllm.max_model_len"
        what = (f"the weights alone take {_gib(weights)} per rank at TP {tp}, plus about {_gib(s.parts[1].gib)} of "
                f"runtime" if over_weights else
                f"after {_gib(weights)} of weights per rank at TP {tp}, the KV cache gets {_gib(s.kv_gib or 0)}, "
                f"less than one {s.max_model_len}-token sequence ({_gib(per_seq)})")
        yield ctx.issue("LG240", path, f"{e.shape.parameter_count() / 1e9:.1f}B parameters on {_where(e)}: {what}; "
                        f"vLLM may use {_gib(s.budget_gib or 0)} of each GPU", fix)
    elif s.verdict == "tight":
        yield ctx.issue("LG242", "vllm.max_model_len" if v.max_model_len is not None else "vllm.tensor_parallel_size",
                        f"the server's KV cache ({_gib(s.kv_gib or 0)} per rank at TP {tp}) holds "
                        f"{s.full_sequences} full-length ({s.max_model_len}-token) sequence(s): generation runs "
                        "almost one sequence at a time")


def _trainer(ctx: Ctx, e: Estimate, t: RoleEstimate) -> Iterator[Issue]:
    if e.shape is None or e.gpu_gib is None or e.trainer_setup is None:
        return
    parts = ", ".join(f"{p.name.split(' (')[0]} {p.gib:.1f}" for p in t.parts if p.gib >= 0.05)
    head = (f"{e.shape.parameter_count() / 1e9:.1f}B parameters, {t.setup}: about {_gib(t.total_gib)} per GPU "
            f"({parts} GiB)")
    if t.verdict == "does not fit":
        alts = trainer_alternatives(e.shape, e.trainer_setup, e.gpu_gib)
        fix = ("Fits after any of: " + "; ".join(alts) + "." if alts else
               "No single change fits: more trainer nodes with deepspeed_zero3 and offload, LoRA, or larger GPUs.")
        d = ctx.spec.train.distributed
        own = d.deepspeed_config or d.accelerate_config
        # a config file of the user's may offload what the estimate keeps on the GPU: say so, do not refuse
        yield ctx.issue("LG241", "train.backend", f"{head}; weights, gradients and optimizer state alone "
                        f"({_gib(t.solid_gib)}) exceed the {_where(e)}"
                        + (f" (estimated without the offload {own} may set)" if own else ""), fix,
                        severity="warning" if own else None)
    elif t.verdict == "tight":
        yield ctx.issue("LG242", "train.backend", f"{head}, within 10 % of (or over) the {_where(e)}; the activation "
                        "part is a rough bound")


@check("LG240", "LG241", "LG242")
def roles_fit_their_gpus(ctx: Ctx) -> Iterator[Issue]:
    if ctx.cpu:
        return
    e = estimate(ctx.spec, ctx.model_config, ctx.trainer_cfg, ctx.layout)
    if e.server is not None:
        yield from _server(ctx, e, e.server)
    if e.trainer is not None:
        yield from _trainer(ctx, e, e.trainer)


