"""Online DPO's config: TRL 1.16's OnlineDPOConfig defaults and the rules of comparing 2 completions per prompt."""

from __future__ import annotations

from typing import ClassVar, Literal

from launchgen.trainers.declarations.config import DPO_LOSS_TYPES, TRAINER_DOC, TrainerConfig
from launchgen.trainers.declarations.declaration import TrainerFacts
from pydantic import Field


class OnlineDPOConfig(TrainerConfig):
    facts: ClassVar[TrainerFacts] = TrainerFacts(
        entry_module="launchgen.trainers.online_dpo", online=True, data="prompts", takes_eval_data=True,
        reference="always", listed=30,
    )
    defaults: ClassVar[dict[str, object]] = {
        "num_generations": 2, "beta": 0.1, "learning_rate": 5e-7, "generation.temperature": 0.9,
        "loss_type": "sigmoid",
    }

    trainer: Literal["online_dpo"] = Field(description=TRAINER_DOC)

    def _own_rules(self) -> None:
        if self.loss_type not in DPO_LOSS_TYPES:
            raise ValueError(f"online_dpo: loss_type must be sigmoid or ipo, not {self.loss_type!r}")
        if self.num_generations != 2:
            raise ValueError("online_dpo compares 2 completions per prompt: num_generations must be 2 (or unset)")
        if self.beta is None or self.beta <= 0:
            raise ValueError("online_dpo: beta must be > 0 (DPO's inverse temperature; TRL's default is 0.1)")
        if self.per_device_train_batch_size % 2:
            raise ValueError(
                "online_dpo: per_device_train_batch_size counts completions and must be even (2 per prompt, "
                "so a pair never spans micro-batches)"
            )
