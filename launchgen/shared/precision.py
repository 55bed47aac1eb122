"""Training precision: the one map from `train.precision` to dtypes, and the alias resolution.

Stdlib only: `check` (no torch), the plan and the trainers (`trainers/modeling.py`) all read it. Whether the
aliases contradict each other or `train.precision` is a user mistake the checks report (LG605/LG606);
`resolve_precision` is total and only says which precision a consistent spec means.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from launchgen.input.spec import Spec

#: train.precision -> the torch dtype name vLLM and `model.dtype: auto` use for it.
PRECISION_DTYPE: dict[str, str] = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}
#: train.precision -> accelerate's `mixed_precision`.
MIXED_PRECISION: dict[str, str] = {"bf16": "bf16", "fp16": "fp16", "fp32": "no"}


def engine_dtype(model_dtype: str, precision: str) -> str:
    """The dtype a vLLM engine (server `--dtype`, colocate `LLM(dtype=...)`) runs: model.dtype, or the
    precision's for `auto`. Never vLLM's own `auto`, which downcasts a float32 checkpoint to half precision."""
    return PRECISION_DTYPE[precision] if model_dtype == "auto" else model_dtype


def trainable_weight_dtype(model_dtype: str, precision: str, *, lora: bool, modules_to_save: bool) -> str:
    """The dtype the trainer loads the policy's weights in (`trainers/modeling.weight_dtype`, the memory estimate).

    `auto` keeps fp32 master weights for accelerate's autocast, except under LoRA without modules_to_save: the
    frozen base needs no master copy (PEFT keeps the adapters in fp32). An explicit `model.dtype` is what loads
    (`bfloat16`: pure-bf16 training at half the memory).
    """
    if model_dtype == "auto":
        return PRECISION_DTYPE[precision] if lora and not modules_to_save else "float32"
    return model_dtype


def resolve_precision(spec: Spec) -> str:
    """train.precision reconciled with the TRL-style bf16/fp16 aliases (an alias wins where they disagree:
    such a spec is refused by LG605/LG606 before anything uses the value)."""
    t = spec.train
    if t.fp16:
        return "fp16"
    if t.bf16:
        return "bf16"
    if t.bf16 is False and "precision" not in t.model_fields_set:
        return "fp32"
    return t.precision


def precision_conflict(spec: Spec) -> bool:
    """The aliases contradict each other or an explicit train.precision (what LG605/LG606 report)."""
    t = spec.train
    if t.bf16 and t.fp16:
        return True
    explicit = "precision" in t.model_fields_set
    return any(explicit and ((val and t.precision != alias) or (val is False and t.precision == alias))
               for alias, val in (("bf16", t.bf16), ("fp16", t.fp16)))


def server_dtype(spec: Spec) -> str:
    """The vLLM server's `--dtype`: `model.dtype`, or the training precision's dtype where it is `auto`."""
    return engine_dtype(spec.model.dtype, resolve_precision(spec))
