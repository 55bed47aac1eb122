"""SFT's config: learns finished examples (no generation), TRL 1.16's SFTConfig learning rate."""

from __future__ import annotations

from typing import ClassVar, Literal

from launchgen.trainers.declarations.config import TRAINER_DOC, TrainerConfig
from launchgen.trainers.declarations.declaration import TrainerFacts
from pydantic import Field


class SFTConfig(TrainerConfig):
    facts: ClassVar[TrainerFacts] = TrainerFacts(
        entry_module="launchgen.trainers.sft", online=False, data="examples", supports_liger_kernel=True, listed=40,
    )
    defaults: ClassVar[dict[str, object]] = {"num_generations": 8, "beta": 0.0, "learning_rate": 2e-5}

    trainer: Literal["sft"] = Field(description=TRAINER_DOC)
