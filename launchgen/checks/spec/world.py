"""LG3xx: the trainer's world size, generation backend and batch arithmetic."""

from __future__ import annotations

from collections.abc import Iterator

from launchgen.checks.context import Ctx
from launchgen.checks.registry import _doc, check
from launchgen.checks.spec.tp import _tp
from launchgen.shared.issues import Issue

# === LG3xx trainer world, backend, batch ==================================================================

_doc("LG301", "info", "A sharding backend (fsdp / deepspeed) on a single trainer GPU shards nothing.",
     "Use train.backend: ddp for one GPU, or give the trainer more GPUs.")
_doc("LG302", "warning", "deepspeed_zero3 with colocate: every GPU also holds a full vLLM copy of the weights, "
     "so ZeRO-3's memory savings mostly vanish.",
     "Use vllm.mode: server, or raise vllm.tensor_parallel_size so vLLM's copy is sharded too.")
_doc("LG303", "error", "The generation batch is not divisible by num_generations.",
     "Make per_device_train_batch_size x trainer processes x steps_per_generation a multiple of num_generations.")


@check("LG301")
def backend_fits_world(ctx: Ctx) -> Iterator[Issue]:
    t = ctx.spec.train
    if t.backend != "ddp" and ctx.world_size == 1:
        yield ctx.issue("LG301", "train.backend",
                        f"backend {t.backend} with a trainer world size of 1 adds overhead and shards nothing")


@check("LG302")
def zero3_with_colocate(ctx: Ctx) -> Iterator[Issue]:
    if ctx.colocate and ctx.spec.train.backend == "deepspeed_zero3" and _tp(ctx) == 1:
        yield ctx.issue("LG302", "train.backend",
                        "deepspeed_zero3 shards the trainer's weights, but colocate with tensor_parallel_size 1 "
                        "keeps a full vLLM copy of them on every GPU")


@check("LG303")
def generation_batch_divisible(ctx: Ctx) -> Iterator[Issue]:
    cfg = ctx.trainer_cfg
    if not ctx.trainer_facts.online or ctx.world_size == 0 or cfg is None:
        return  # a config that does not validate is LG901's
    # the trainer's own values, defaults included (num_generations per trainer, steps_per_generation = GA)
    g, bs = cfg.num_generations, cfg.per_device_train_batch_size
    spg = cfg.steps_per_generation or cfg.gradient_accumulation_steps
    batch = bs * ctx.world_size * spg
    if g and batch % g:
        path = "train.args.num_generations" if ctx.has_arg("num_generations") else "train.args"
        yield ctx.issue("LG303", path,
                        f"generation batch = per_device_train_batch_size {bs} x {ctx.world_size} trainer "
                        f"processes x steps_per_generation {spg} = {batch}, not a multiple of num_generations {g}")
