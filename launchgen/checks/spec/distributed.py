"""LG63x: train.distributed (accelerate/DeepSpeed files and CPU offload) against train.backend, the vLLM mode,
the precision and the model."""

from __future__ import annotations

from collections.abc import Iterator

from launchgen.checks.context import Ctx
from launchgen.checks.registry import _doc, check
from launchgen.shared.issues import Issue

_D = "train.distributed"
#: accelerate's distributed_type for each train.backend on GPUs (ddp: MULTI_GPU, or NO for one process).
_DISTRIBUTED_TYPE = {"ddp": ("MULTI_GPU", "NO"), "fsdp": ("FSDP",), "deepspeed_zero2": ("DEEPSPEED",),
                     "deepspeed_zero3": ("DEEPSPEED",)}

_doc("LG630", "error", "CPU offload with train.backend ddp: offload needs DeepSpeed ZeRO-2/3 or FSDP.",
     "Use train.backend: deepspeed_zero3 (or deepspeed_zero2 for the optimizer only, fsdp for parameters), or "
     "drop the offload.")
_doc("LG631", "error", "An offload the backend cannot do: parameter offload under ZeRO-2, or optimizer-only offload "
     "under FSDP2.", "ZeRO-2 offloads the optimizer only (parameters need deepspeed_zero3); FSDP2 offloads "
     "parameters, gradients and optimizer step together: set offload_params instead.")
_doc("LG632", "warning", "CPU offload with colocated vLLM: every generation and weight sync moves the weights "
     "over PCIe, and the colocated engine's GPU memory was sized without it.",
     "Prefer vllm.mode: server with offload, or drop the offload when colocating.")
_doc("LG635", "error", "train.distributed.deepspeed_config together with offload knobs: the DeepSpeed file owns "
     "offload (accelerate refuses both).", "Put offload_optimizer/offload_param in the DeepSpeed file's "
     "zero_optimization, or drop deepspeed_config.")
_doc("LG636", "error", "zero3_init_flag without train.backend deepspeed_zero3.",
     "Remove train.distributed.zero3_init_flag, or use deepspeed_zero3.")


@check("LG630", "LG631", "LG632", "LG635", "LG636")
def offload_fits_backend(ctx: Ctx) -> Iterator[Issue]:
    t = ctx.spec.train
    d = t.distributed
    knobs = [k for k in ("offload_optimizer", "offload_params") if getattr(d, k)]
    if t.device == "cpu":
        return
    for k in knobs:
        path = f"{_D}.{k}"
        if t.backend == "ddp":
            yield ctx.issue("LG630", path, f"{k} needs DeepSpeed ZeRO-2/3 or FSDP; train.backend is ddp")
        elif t.backend == "deepspeed_zero2" and k == "offload_params":
            yield ctx.issue("LG631", path, "ZeRO-2 does not offload parameters (only the optimizer state)")
        elif t.backend == "fsdp" and k == "offload_optimizer" and not d.offload_params:
            yield ctx.issue("LG631", path, "FSDP2 has no optimizer-only offload")
        elif d.deepspeed_config is not None and t.backend.startswith("deepspeed"):
            yield ctx.issue("LG635", path, f"{k} is set beside deepspeed_config; the DeepSpeed file owns offload")
    if knobs and ctx.colocate and t.backend != "ddp":
        yield ctx.issue("LG632", f"{_D}.{knobs[0]}",
                        f"{' and '.join(knobs)} with vllm.mode colocate: the weights cross PCIe at every generation "
                        "and weight sync")
    if d.zero3_init_flag is not None and t.backend != "deepspeed_zero3":
        yield ctx.issue("LG636", f"{_D}.zero3_init_flag", f"zero3_init_flag is for ZeRO-3; train.backend is {t.backend}")


