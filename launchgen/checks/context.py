"""`Ctx`: what a check reads (the loaded spec, the layout, the model's config.json, the plan in the plan stage)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING, Any

from launchgen.checks.codes import CODES
from launchgen.input.loader import LoadedSpec
from launchgen.input.spec import Spec
from launchgen.kinds.registry import AnyConfig, Kind, as_bundled, kind_of
from launchgen.kinds.trainer_config import arg_paths, trainer_default
from launchgen.planning.hfcache import ModelConfig, find_model_config
from launchgen.shared.issues import Issue, Severity
from launchgen.shared.layout import Layout, resolve_layout
from launchgen.trainers.declarations.config import TrainerConfig
from launchgen.trainers.declarations.configs import CONFIGS
from launchgen.trainers.declarations.declaration import DeclaredConfig, TrainerFacts

#: `train.args` keys with the same meaning for the bundled trainers and TRL's (launchgen's data and rewards).
SHARED_ARGS = frozenset({"data", "eval_data", "rewards"})

if TYPE_CHECKING:
    from launchgen.planning.plan import Plan


# --- context ----------------------------------------------------------------------------------------------


@dataclass
class Ctx:
    loaded: LoadedSpec
    env: Mapping[str, str] = field(default_factory=lambda: dict(os.environ))
    plan: Plan | None = None
    #: the cluster's max_script_size (`check --live` reads it from `scontrol show config`); None: SLURM's default
    script_limit: int | None = None

    @property
    def spec(self) -> Spec:
        return self.loaded.spec

    @cached_property
    def model_config(self) -> ModelConfig | None:
        m = self.spec.model
        return find_model_config(m.name_or_path, m.revision, self.env)

    @cached_property
    def kind(self) -> Kind:
        """The trainer's kind (bundled loop, TRL trainer, the user's script): what checks ask instead of testing
        the trainer's facts or its config's class."""
        return kind_of(self.spec)

    @cached_property
    def _trainer_config(self) -> tuple[AnyConfig | None, list[Issue]]:
        return self.kind.resolve(self.spec, self.loaded)

    @property
    def trainer_cfg(self) -> TrainerConfig | None:
        """The bundled trainer's config as the trainer will read it (its own defaults filled in), or None where
        `train.args` does not validate (LG901), sets a field the spec owns (LG902) or is a TRL trainer's (its run
        config is checked as a whole by `launchgen.kinds.trl_config`)."""
        return as_bundled(self._trainer_config[0])

    @property
    def resolved_config(self) -> AnyConfig | None:
        """The trainer's resolved config of either kind (the bundled loop's or a TRL trainer's run config), for
        the sections both have (data, eval_data, rewards); None where train.args does not validate."""
        return self._trainer_config[0]

    @property
    def trainer_config_issues(self) -> list[Issue]:
        """LG901: why `train.args` does not validate, with fields and lines."""
        return self._trainer_config[1]

    @property
    def trainer_class(self) -> type[DeclaredConfig]:
        """The config class of the spec's trainer: its declaration (defaults, options, facts)."""
        return CONFIGS[self.spec.train.trainer]

    @property
    def trainer_facts(self) -> TrainerFacts:
        """What the spec's trainer declares about itself (online, data rows, Liger, ...): checks ask these, never
        its name."""
        return self.trainer_class.facts

    @cached_property
    def layout(self) -> Layout:
        """The one layout derivation the plan also builds on; total, so it is there for invalid specs too."""
        return resolve_layout(self.spec)

    @property
    def server_mode(self) -> bool:
        return self.layout.mode == "server"

    @property
    def colocate(self) -> bool:
        return self.layout.mode == "colocate"

    @property
    def shared_node(self) -> bool:
        """Server mode with the server on the first trainer node."""
        return self.layout.shared

    @property
    def server_gpus(self) -> list[int]:
        return list(self.layout.server_gpus)

    @property
    def server_nodes(self) -> int:
        return len(self.layout.server_positions)

    @property
    def cpu(self) -> bool:
        return self.layout.cpu

    @property
    def trainer_gpus(self) -> list[int]:
        return list(self.layout.trainer_gpus)

    @property
    def processes_per_node(self) -> int:
        return self.layout.processes_per_node

    @property
    def world_size(self) -> int:
        return self.layout.world_size

    @property
    def total_nodes(self) -> int:
        return self.layout.num_nodes

    # what the user wrote in train.args, raw: only for "did the user set it" (arguments the spec owns, a value the
    # config refuses, checks that must speak when the config does not validate); typed values with the trainer's
    # defaults are `trainer_cfg`'s. The one raw reader: a path no trainer's config has is a bug in the check (a
    # typo would silently read the default), so it raises.
    def arg(self, path: str, default: Any = None) -> Any:
        _known_path("arg", path)
        if self.kind.uses_trl_table and path.split(".")[0] not in SHARED_ARGS:
            return default  # TRL's fields: the bundled config's checks have nothing to read there
        node: Any = self.spec.train.args
        for part in path.split("."):
            if not isinstance(node, dict) or part not in node:
                return default
            node = node[part]
        return node

    def value(self, path: str) -> Any:
        """The trainer's value at `path` (a train.args field path): typed, from the resolved config with the
        trainer's own defaults; where train.args does not validate (LG901), what the user wrote, else the trainer's
        default, so a check still speaks beside LG901 without restating a default. A path no trainer's config has
        raises, as `arg` does: a typo must not read as an unset field."""
        _known_path("value", path)
        cfg = self.trainer_cfg
        if cfg is not None:
            node: Any = cfg
            for part in path.split("."):
                node = getattr(node, part, None)
            return node
        if self.has_arg(path):
            return self.arg(path)
        return trainer_default(self.trainer_class, path)

    def has_arg(self, path: str) -> bool:
        sentinel = object()
        return self.arg(path, sentinel) is not sentinel

    def issue(self, code: str, path: str, message: str, fix: str | None = None,
              severity: Severity | None = None) -> Issue:
        doc = CODES[code]
        return Issue(code, path, message, doc.fix if fix is None else fix,
                     doc.severity if severity is None else severity)


def _known_path(reader: str, path: str) -> None:
    """A path no trainer's config has is a bug in the check that reads it: a typo would read as unset."""
    if path not in arg_paths():
        raise KeyError(f"Ctx.{reader}({path!r}): no trainer's config has this field (launchgen.trainers.declarations.configs)")


def _set(model: Any, name: str) -> bool:
    """The user wrote the field (as opposed to getting the default)."""
    return name in model.model_fields_set
