"""The bundled trainers' objectives, by `trainer` name: found, not listed.

An objective is a class in a module of this package with `config_class` (its trainer's config class, see
`launchgen.trainers.declarations.configs`), constructed as `cls(cfg, num_processes)` (see `base.Objective`; an online-RL one is
also a `base.RLObjective` whose `make_source` returns a `rollout.Rollout`). Importing this package imports every module
of it, so adding a trainer's objective touches no list here.
"""

from __future__ import annotations

import importlib
import pkgutil

from launchgen.trainers.declarations.config import TrainerConfig
from launchgen.trainers.declarations.declaration import declared
from launchgen.trainers.declarations.errors import TrainerSetupError
from launchgen.trainers.objectives.base import Objective


def _discover() -> dict[str, type[Objective]]:
    found: dict[str, type[Objective]] = {}
    for info in pkgutil.iter_modules(__path__):
        module = importlib.import_module(f"{__name__}.{info.name}")
        for value in vars(module).values():
            if isinstance(value, type) and value.__module__ == module.__name__ and "config_class" in vars(value):
                found[value.config_class.trainer_name] = value  # type: ignore[attr-defined]
    order = [c.trainer_name for c in declared()]
    return {name: found[name] for name in sorted(found, key=order.index)}


OBJECTIVES: dict[str, type[Objective]] = _discover()


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
        if not cfg.facts.supports_liger_kernel:
            # the bundled loop's trainers are the ones with an objective
            able = [n for n, o in OBJECTIVES.items() if o.config_class.facts.supports_liger_kernel]
            raise TrainerSetupError(f"model.use_liger_kernel is supported for {', '.join(able)}, not {cfg.trainer}")
    return objective
