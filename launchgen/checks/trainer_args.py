"""The trainer sections the file checks read, validated the trainer's way (invalid ones are LG901's business)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from pydantic import ValidationError

from launchgen.trainers.config import DataSection, RewardSpec, TrainerConfig

if TYPE_CHECKING:
    from launchgen.checks.context import Ctx


def data_section(ctx: Ctx) -> DataSection | None:
    raw = ctx.arg("data")
    if not isinstance(raw, dict):
        return None
    try:
        return DataSection.model_validate(raw)
    except ValidationError:
        return None


def reward_specs(ctx: Ctx) -> list[tuple[str, RewardSpec]]:
    """(field path, spec) of each reward the trainer loads; the default when `train.args.rewards` is unset."""
    raw = ctx.arg("rewards")
    if raw is None:
        default = TrainerConfig.model_fields["rewards"].default_factory
        specs = default() if callable(default) else []
        return [("train.args.rewards", s) for s in specs if isinstance(s, RewardSpec)]
    if not isinstance(raw, list):
        return []
    out = []
    for i, item in enumerate(raw):
        try:
            out.append((f"train.args.rewards.{i}", RewardSpec.model_validate(item)))
        except ValidationError:
            continue
    return out
