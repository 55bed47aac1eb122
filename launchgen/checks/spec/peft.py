"""LG340-LG346: `train.args.peft` (LoRA) against the model's module names and the settings it cannot run with.

The module names come from the model's config.json (`model_type`, `num_hidden_layers`) through the table in
`launchgen.trainers.declarations.peft_config`, without importing torch; the combination rule is that module's too, so `check`
and the trainer refuse the same things. A `peft` section that does not validate is LG901's (the plan reports it).
"""

from __future__ import annotations

from collections.abc import Iterator

from pydantic import ValidationError

from launchgen.checks.constants import vllm_flag
from launchgen.checks.context import Ctx
from launchgen.checks.registry import _doc, check
from launchgen.shared.issues import Issue
from launchgen.trainers.declarations.peft_config import (
    ALL_LINEAR,
    PeftSection,
    combination_errors,
    entry_matches_layer_linear,
    entry_matches_module,
    known_linears,
)

_doc("LG340", "error", "A train.args.peft.target_modules entry matches no linear layer of the model (config.json).",
     "Use the model's module names (e.g. q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj) or all-linear.")
_doc("LG341", "error", "A train.args.peft.modules_to_save entry matches no module of the model (config.json).",
     "Name a module of the model (e.g. embed_tokens), or remove the entry.")
_doc("LG342", "info", "The peft target names were not checked: the model's config.json is not local, or its "
     "model_type is not in launchgen's table of module names.", "")
_doc("LG343", "error", "peft (LoRA) with DeepSpeed (train.backend deepspeed_zero2/3) or FSDP1 (fsdp_version: 1 in "
     "train.distributed.accelerate_config): the merged-weight sync and the adapter-only checkpoints are built for "
     "one process, DDP and FSDP2; ZeRO's gathers and engine checkpoints were never run with adapters (deepspeed "
     "is not in launchgen's test environment), FSDP1's flattened parameters are not gathered.",
     "Use train.backend: fsdp (FSDP2, launchgen's default fsdp_version) or ddp.")
_doc("LG344", "error", "peft (LoRA) with a setting it cannot run with: Liger kernels.",
     "Turn the setting off (use_liger_kernel: false).")
_doc("LG345", "warning", "peft with vLLM runtime-LoRA flags in vllm.extra_args: launchgen sends merged weights, so "
     "the server never loads an adapter and --enable-lora only reserves memory and slows decoding.",
     "Remove --enable-lora / --max-lora-rank / --max-loras from vllm.extra_args.")

_RUNTIME_LORA_FLAGS = ("--enable-lora", "--max-lora-rank", "--max-loras", "--lora-modules", "--max-cpu-loras")


def _section(ctx: Ctx) -> PeftSection | None:
    raw = ctx.value("peft")  # typed; what the user wrote only where train.args does not validate (LG901)
    if raw is None or isinstance(raw, PeftSection):
        return raw
    if not isinstance(raw, dict):
        return None
    try:
        return PeftSection.model_validate(raw)
    except ValidationError:
        return None


@check("LG340", "LG341", "LG342")
def peft_module_names(ctx: Ctx) -> Iterator[Issue]:
    p = _section(ctx)
    if p is None or p.adapter_path is not None:  # a saved adapter brings its own names (checked when loaded)
        return
    cfg = ctx.model_config
    model_type = cfg.data.get("model_type") if cfg is not None else None
    mt = model_type if isinstance(model_type, str) else None
    if cfg is None or known_linears(mt) is None:
        if p.target_modules != ALL_LINEAR or p.modules_to_save:
            why = ("config.json is not local" if cfg is None
                   else f"model_type {model_type!r} ({cfg.source}) is not in launchgen's table")
            yield ctx.issue("LG342", "train.args.peft", f"peft module names not checked: {why}")
        return
    layers = cfg._int("num_hidden_layers")
    if isinstance(p.target_modules, list):
        for i, entry in enumerate(p.target_modules):
            if not entry_matches_layer_linear(entry, mt, layers):
                yield ctx.issue("LG340", f"train.args.peft.target_modules.{i}",
                                f"{entry!r} matches no linear layer of a {mt} model ({cfg.source}); its layer "
                                f"linears are {', '.join(x.split('.')[-1] for x in known_linears(mt) or ())}")
    for i, entry in enumerate(p.modules_to_save):
        if not entry_matches_module(entry, mt, layers):
            yield ctx.issue("LG341", f"train.args.peft.modules_to_save.{i}",
                            f"{entry!r} matches no module of a {mt} model ({cfg.source})")


@check("LG343")
def peft_distributed_backend(ctx: Ctx) -> Iterator[Issue]:
    t = ctx.spec.train
    if _section(ctx) is not None and t.backend.startswith("deepspeed"):
        yield ctx.issue("LG343", "train.backend",
                        f"train.backend {t.backend} with peft: LoRA runs with one process, DDP or FSDP2 "
                        "(train.backend fsdp), not DeepSpeed")


@check("LG344")
def peft_combinations(ctx: Ctx) -> Iterator[Issue]:
    if _section(ctx) is None:
        return
    t = ctx.spec.train
    liger = t.use_liger_kernel or ctx.arg("model.use_liger_kernel") is True
    paths = {
        "model.use_liger_kernel": "train.use_liger_kernel" if t.use_liger_kernel else "train.args.model.use_liger_kernel",
    }
    for field, message in combination_errors(use_liger_kernel=liger):
        yield ctx.issue("LG344", paths[field], message)


@check("LG345")
def peft_runtime_lora_flags(ctx: Ctx) -> Iterator[Issue]:
    v = ctx.spec.vllm
    if _section(ctx) is None or v is None:
        return
    for i, arg in enumerate(v.extra_args):
        if vllm_flag(arg) in _RUNTIME_LORA_FLAGS:
            yield ctx.issue("LG345", f"vllm.extra_args.{i}",
                            f"{vllm_flag(arg)} with peft: the server receives merged weights and loads no adapter")


