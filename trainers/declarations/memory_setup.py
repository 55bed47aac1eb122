"""What decides one trainer process's memory, from the trainer's resolved config: the one mapping from a
`TrainerConfig` to the estimate's `TrainerSetup`. `plan` feeds it the spec's values (`planning/estimate_spec.py`),
the trainer at start what its accelerator says (`trainers/grad_checkpointing.py`), so both estimate the same run
and `gradient_checkpointing: auto` decides alike. Torch-free."""

from __future__ import annotations

from typing import TYPE_CHECKING

from launchgen.trainers.declarations.peft_config import ALL_LINEAR

from launchgen.shared.estimate import DEFAULT_PROMPT_TOKENS, TrainBackend, TrainerSetup
from launchgen.shared.modelshape import ModelShape
from launchgen.shared.precision import trainable_weight_dtype

if TYPE_CHECKING:
    from launchgen.trainers.declarations.config import TrainerConfig


def lora_targets(shape: ModelShape, targets: list[str] | str) -> tuple[str, ...]:
    """The layer linears PEFT's suffix match adapts (`all-linear`: every one)."""
    names = tuple(shape.layer_linears())
    if targets == ALL_LINEAR:
        return names
    return tuple(n for n in names if any(n == t or n.endswith("." + t) for t in targets))


def needs_reference_copy(cfg: TrainerConfig) -> bool:
    """A second, frozen copy of the weights: the objectives' `needs_reference` (KL with beta != 0, DPO) without
    LoRA, whose reference is the policy with its adapters off."""
    if cfg.peft is not None:
        return False
    ref = cfg.facts.reference
    return ref == "always" or (ref == "with_beta" and bool(cfg.beta))


def trainer_setup(cfg: TrainerConfig, shape: ModelShape, *, backend: TrainBackend, processes: int,
                  offload_optimizer: bool = False, offload_params: bool = False, prompt_tokens: int | None = None,
                  colocated_gib: float = 0.0) -> tuple[TrainerSetup, str]:
    """The setup and where the prompt length came from. Checkpointing is as configured, `auto` as off: the
    caller puts `choose_checkpointing`'s answer in. `prompt_tokens` is the spec's `estimate.prompt_tokens`."""
    peft = cfg.peft
    if cfg.facts.data == "examples":
        prompt, completion, how = 0, cfg.max_length or 1024, f"{cfg.trainer}: max_length"
    else:
        completion = cfg.generation.max_completion_length
        if prompt_tokens is not None:
            prompt, how = prompt_tokens, "estimate.prompt_tokens"
        elif cfg.data.max_prompt_length is not None:
            prompt, how = cfg.data.max_prompt_length, "data.max_prompt_length"
        else:
            prompt, how = DEFAULT_PROMPT_TOKENS, f"assumed {DEFAULT_PROMPT_TOKENS} (set data.max_prompt_length)"
    # Only `keep_kv_cache: true` holds the cache through training; the default `lend` hands it back first.
    kept_kv = (cfg.facts.online and cfg.generation.backend == "hf" and cfg.generation.keep_kv_cache is True
               and cfg.generation.hf_engine != "generate")
    setup = TrainerSetup(
        backend=backend, processes=processes, precision=cfg.precision,
        weight_dtype=trainable_weight_dtype(cfg.model.dtype, cfg.precision, lora=peft is not None,
                                            modules_to_save=bool(peft and peft.modules_to_save)),
        offload_optimizer=offload_optimizer, offload_params=offload_params,
        lora_r=None if peft is None else peft.r,
        lora_targets=() if peft is None else lora_targets(shape, peft.target_modules),
        modules_to_save=() if peft is None else tuple(peft.modules_to_save),
        reference_copy=needs_reference_copy(cfg), gradient_checkpointing=cfg.model.gradient_checkpointing is True,
        rows=cfg.per_device_train_batch_size, prompt_tokens=prompt, completion_tokens=completion,
        max_tokens_per_forward=cfg.max_tokens_per_forward, logits_chunk_mib=cfg.model.logits_chunk_mib,
        generation_kv_rows=cfg.per_device_train_batch_size * (cfg.steps_per_generation or 1) if kept_kv else 0,
        colocated_gib=colocated_gib,
    )
    return setup, how
