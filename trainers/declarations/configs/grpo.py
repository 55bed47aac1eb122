"""GRPO's config: TRL 1.16's GRPOConfig semantics, with its loss options (`AlgorithmOptions`)."""

from __future__ import annotations

from typing import ClassVar, Literal

from launchgen.trainers.declarations.algorithm_options import AlgorithmOptions
from launchgen.trainers.declarations.config import TRAINER_DOC, TrainerConfig
from launchgen.trainers.declarations.declaration import TrainerFacts
from pydantic import Field


class GRPOConfig(TrainerConfig, AlgorithmOptions):
    facts: ClassVar[TrainerFacts] = TrainerFacts(
        entry_module="launchgen.trainers.grpo", online=True, data="prompts", corrects_stale_samples=True,
        takes_eval_data=True, supports_liger_kernel=True, supports_liger_loss=True, reference="with_beta", listed=10,
    )
    defaults: ClassVar[dict[str, object]] = {"num_generations": 8, "beta": 0.0}

    trainer: Literal["grpo"] = Field(description=TRAINER_DOC)
