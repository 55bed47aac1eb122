"""RLOO's config: TRL 1.16's RLOOConfig defaults (2 completions per prompt, KL coefficient 0.05)."""

from __future__ import annotations

from typing import ClassVar, Literal

from launchgen.trainers.declarations.config import TRAINER_DOC, TrainerConfig
from launchgen.trainers.declarations.declaration import TrainerFacts
from pydantic import Field


class RLOOConfig(TrainerConfig):
    facts: ClassVar[TrainerFacts] = TrainerFacts(
        entry_module="launchgen.trainers.rloo", online=True, data="prompts", takes_eval_data=True,
        supports_liger_kernel=True, reference="with_beta", listed=20,
    )
    defaults: ClassVar[dict[str, object]] = {"num_generations": 2, "beta": 0.05}

    trainer: Literal["rloo"] = Field(description=TRAINER_DOC)
