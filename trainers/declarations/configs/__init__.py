"""Every trainer's config class, one module each: importing this package declares them all.

A trainer is declared by its config class (see `launchgen.trainers.declarations.declaration`); this package imports each of
its modules, so adding a trainer adds a module here and touches no list. Everything that enumerates trainers
(`TRAINER_NAMES`, the spec's `train.trainer` type, `launchgen schema`, the objectives) derives from `declared()`.
Pydantic only: `launchgen check` imports it on a login node.
"""

from __future__ import annotations

import importlib
import pkgutil
from typing import TYPE_CHECKING, Any, Literal

from launchgen.trainers.declarations.declaration import DeclaredConfig, any_config_adapter, declared

for _module in pkgutil.iter_modules(__path__):
    importlib.import_module(f"{__name__}.{_module.name}")

#: Every declared trainer's config class by name, in listing order.
CONFIGS: dict[str, type[DeclaredConfig]] = {c.trainer_name: c for c in declared()}
TRAINER_NAMES: tuple[str, ...] = tuple(CONFIGS)

if TYPE_CHECKING:
    TrainerName = str
else:
    #: The `trainer` values a spec may name (the spec's `train.trainer` type).
    TrainerName = Literal[TRAINER_NAMES]


def parse_trainer_config(data: Any) -> DeclaredConfig:
    """`data` validated as the config class its `trainer` names (the discriminated union)."""
    found: DeclaredConfig = any_config_adapter().validate_python(data)
    return found
