"""The bundled trainers by `trainer` name: the one place a trainer is added.

Adding one: an objective class (see `base.Objective`; an online-RL one also `base.RLObjective` and a rollout via
`base.make_rollout`) constructed as `cls(cfg, num_processes)`, one entry here, its name in `config.TrainerName`
and a `python -m launchgen.trainers.<name>` module calling `cli.entry`.
"""

from __future__ import annotations

from launchgen.trainers.config import TrainerConfig
from launchgen.trainers.errors import TrainerSetupError
from launchgen.trainers.objectives.base import Objective
from launchgen.trainers.objectives.grpo import GRPOObjective
from launchgen.trainers.objectives.online_dpo import OnlineDPOObjective
from launchgen.trainers.objectives.rloo import RLOOObjective
from launchgen.trainers.objectives.sft import SFTObjective

OBJECTIVES: dict[str, type[Objective]] = {
    cls.name: cls for cls in (GRPOObjective, RLOOObjective, OnlineDPOObjective, SFTObjective)
}


def build_objective(cfg: TrainerConfig, num_processes: int) -> Objective:
    """The configured trainer's objective, validated against the process count."""
    cls = OBJECTIVES.get(cfg.trainer)
    if cls is None:
        raise TrainerSetupError(f"trainer {cfg.trainer!r} is not one of {', '.join(OBJECTIVES)}")
    objective = cls(cfg, num_processes)
    objective.validate()
    if cfg.model.use_liger_kernel:
        from launchgen.trainers.modeling import check_liger_compatible

        check_liger_compatible(cfg)
        if not objective.supports_liger:
            able = [name for name, c in OBJECTIVES.items() if c.supports_liger]
            raise TrainerSetupError(f"model.use_liger_kernel is supported for {', '.join(able)}, not {cfg.trainer}")
    return objective
