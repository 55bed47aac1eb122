"""The trainer sections the spec and files checks read (data, eval_data, rewards): typed, from the resolved config
of either kind (the bundled loop's or a TRL trainer's run config). Where train.args does not validate (LG901 says
why), the sections that do validate are read from what the user wrote, so their files are still checked."""

from __future__ import annotations

from typing import TYPE_CHECKING

from pydantic import ValidationError

from launchgen.trainers.declarations.config import DataSection, RewardSpec, TrainerConfig

if TYPE_CHECKING:
    from launchgen.checks.context import Ctx


def _section(ctx: Ctx, name: str) -> DataSection | None:
    cfg = ctx.resolved_config
    if cfg is not None:
        section = getattr(cfg, name)
        return section if isinstance(section, DataSection) else None
    # train.args does not validate (LG901 says why): still check the files this section names
    raw = ctx.arg(name)
    if not isinstance(raw, dict):
        return None
    try:
        return DataSection.model_validate(raw)
    except ValidationError:
        return None


def data_section(ctx: Ctx) -> DataSection | None:
    return _section(ctx, "data")


def eval_data_section(ctx: Ctx) -> DataSection | None:
    return _section(ctx, "eval_data")


def reward_specs(ctx: Ctx) -> list[tuple[str, RewardSpec]]:
    """(field path, spec) of each reward the trainer loads; the default when `train.args.rewards` is unset."""
    cfg = ctx.resolved_config
    if cfg is not None:
        written = ctx.has_arg("rewards")  # only for the path an issue points at
        return [(f"train.args.rewards.{i}" if written else "train.args.rewards", s) for i, s in enumerate(cfg.rewards)]
    raw = ctx.arg("rewards")  # train.args does not validate (LG901): the rewards that do
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
