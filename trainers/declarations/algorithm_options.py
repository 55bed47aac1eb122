"""GRPOConfig's loss options beyond the clipped token objective (TRL 1.16 names, defaults and meanings).

A mixin of `configs.grpo.GRPOConfig` (flat fields under `train.args`, as TRL's GRPOConfig has them), read by
`trainers/algorithms/grpo.py` (the formulas) and `trainers/objectives/grpo.py` (the wiring). Pydantic only, so
`launchgen check` validates them without torch. Only `configs.grpo.GRPOConfig` has them (TRL's RLOOConfig has
none): another bundled trainer that sets one is refused, naming the field, instead of silently ignoring it
(`config.TrainerConfig._options_of_other_trainers`).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

ISLevel = Literal["token", "sequence"]
Aggregation = Literal["sum_then_normalize", "normalize_then_sum"]
#: Loss types whose objective is a clipped ratio (TRL logs clip_ratio/* for these).
CLIPPED_LOSS_TYPES = frozenset({"grpo", "bnpo", "dr_grpo", "dapo", "luspo"})
#: Loss types TRL normalises by the generation batch's completion tokens (dapo's normaliser).
TOKEN_SUM_LOSS_TYPES = frozenset({"dapo", "cispo", "vespo"})
#: Loss types added by this module (the Liger fused loss supports none of them: LG612).
NEW_LOSS_TYPES = ("cispo", "sapo", "luspo", "vespo")


class AlgorithmOptions(BaseModel):
    # built with GRPO's config on first validation, not on import (see declaration.DeclaredConfig)
    model_config = ConfigDict(extra="forbid", frozen=False, validate_default=True, defer_build=True)

    importance_sampling_level: ISLevel = Field(
        default="token",
        description="GRPO: `token` ratios per token, or `sequence` (GSPO): one ratio per completion, exp of the "
        "mean token log-ratio.",
    )
    delta: float | None = Field(
        default=None, gt=0,
        description="GRPO (clipped loss types): two-sided clipping, the ratio multiplying a negative advantage is "
        "capped at delta (TRL recommends > 1 + epsilon_high); null: off.",
    )
    top_entropy_quantile: float = Field(
        default=1.0, ge=0.0, le=1.0,
        description="GRPO: keep the policy loss only on tokens whose entropy is in the top quantile (over the "
        "micro-batch, all processes); 1.0 keeps every token, 0.0 only the highest-entropy one.",
    )
    entropy_coef: float = Field(
        default=0.0,
        description="GRPO: subtract entropy_coef x the mean token entropy (of the tokens the loss acts on) from the "
        "loss; 0 disables the bonus.",
    )
    use_adaptive_entropy: bool = Field(
        default=False,
        description="GRPO: Skywork-OR1's entropy controller: entropy_coef is the starting coefficient, moved by "
        "entropy_coef_delta after each optimizer step (up while the step's entropy is at or below entropy_target, "
        "down otherwise) and applied only while the previous step's entropy is at or below entropy_target.",
    )
    entropy_coef_min: float = Field(default=0.0, description="GRPO, use_adaptive_entropy: lower bound of the coefficient.")
    entropy_coef_max: float = Field(default=1.0, description="GRPO, use_adaptive_entropy: upper bound of the coefficient.")
    entropy_coef_delta: float = Field(
        default=0.005, description="GRPO, use_adaptive_entropy: how far the coefficient moves per optimizer step."
    )
    entropy_target: float = Field(
        default=0.2,
        description="GRPO, use_adaptive_entropy: target mean token entropy (nats) over the tokens the loss acts on.",
    )
    off_policy_mask_threshold: float | None = Field(
        default=None,
        description="GRPO: drop negative-advantage completions whose mean KL(sampler || policy) exceeds this "
        "(DeepSeek-V3.2's off-policy sequence mask); uses the sampler's log-probs where the backend returns them.",
    )
    sapo_temperature_pos: float = Field(default=1.0, gt=0, description="GRPO, loss_type sapo: temperature for A > 0.")
    sapo_temperature_neg: float = Field(default=1.05, gt=0, description="GRPO, loss_type sapo: temperature for A <= 0.")
    vespo_k_pos: float = Field(default=2.0, description="GRPO, loss_type vespo: power exponent k for A >= 0.")
    vespo_lambda_pos: float = Field(default=3.0, description="GRPO, loss_type vespo: decay lambda for A >= 0.")
    vespo_k_neg: float = Field(default=3.0, description="GRPO, loss_type vespo: power exponent k for A < 0.")
    vespo_lambda_neg: float = Field(default=2.0, description="GRPO, loss_type vespo: decay lambda for A < 0.")
    multi_objective_aggregation: Aggregation = Field(
        default="sum_then_normalize",
        description="GRPO with several rewards: `sum_then_normalize` (weighted sum, then group advantages) or "
        "`normalize_then_sum` (each reward normalised per group, weighted sum, then whitened over the batch).",
    )


#: Where a resolved config and `--help` list this module's fields: next to the other algorithm knobs.
AFTER_FIELD = "mask_truncated_completions"


def ordered_keys(keys: list[str], after: str = AFTER_FIELD) -> list[str]:
    """`keys` (TrainerConfig's fields, the mixin's first) with this module's fields moved to just after `after`."""
    ours = [k for k in keys if k in AlgorithmOptions.model_fields]
    rest = [k for k in keys if k not in AlgorithmOptions.model_fields]
    i = rest.index(after) + 1 if after in rest else len(rest)
    return rest[:i] + ours + rest[i:]


def ordered_dump(data: dict[str, Any], after: str = AFTER_FIELD) -> dict[str, Any]:
    """A TrainerConfig dump in `ordered_keys` order, so a resolved config reads trainer, model, data, ..."""
    return {k: data[k] for k in ordered_keys(list(data), after)}
