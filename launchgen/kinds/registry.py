"""The trainer kinds, and the one place that tells them apart: a bundled loop (`grpo`, `sft`, ...), a TRL
trainer (`trl.<name>`) and the user's own TRL script (`train.script` under a `trl.<name>` trainer).

Each `Kind` owns what differs between them: how its config is resolved from the spec, the `--set` values the job
passes at run time, the JSON Schema of its `train.args`, the owned rows it takes (`ownership.OWNED`, by policy)
and which of TRL's rules and tables apply. Checks, plan and schema ask the kind (`kind_of`, `Ctx.kind`); they
never test `facts.trl_config` or a config's class themselves (tests/test_kinds.py keeps it so).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeAlias

from pydantic import BaseModel

from launchgen.input.loader import LoadedSpec
from launchgen.input.spec import Spec
from launchgen.kinds import trainer_config, trl_config
from launchgen.kinds.ownership import MATCH, REFUSE, Filled, Owned, Policy, lookup, rows, without_owned
from launchgen.planning.model import Override, Ref
from launchgen.script import scriptvars as V
from launchgen.shared.issues import Issue, SpecError
from launchgen.shared.precision import resolve_precision
from launchgen.trainers.declarations.config import TrainerConfig
from launchgen.trainers.declarations.configs import CONFIGS
from launchgen.trainers.declarations.trl.config import TrlRunConfig

#: What `train.args` resolves to, of either kind.
AnyConfig: TypeAlias = TrainerConfig | TrlRunConfig
Resolved: TypeAlias = tuple[AnyConfig | None, list[Issue]]


def _located(issues: list[Issue], loaded: LoadedSpec | None) -> list[Issue]:
    if loaded is None:
        return issues
    return [i if i.line is not None else i.located(loaded.path, loaded.line_of(i.path)) for i in issues]


def _filled(spec: Spec) -> Filled:
    return Filled(spec, resolve_precision(spec), trainer_config.trainer_output_pattern(spec))


def _resolve_bundled(spec: Spec, loaded: LoadedSpec | None) -> Resolved:
    # the owned arguments are left out (LG902 reports them), so the rest is still read
    f = _filled(spec)
    try:
        return trainer_config.build_trainer_config(spec, f.precision, f.output_dir, loaded,
                                                   without_owned(spec.train.args)), []
    except SpecError as e:
        return None, _located(list(e.issues), loaded)


def _resolve_trl(spec: Spec, loaded: LoadedSpec | None) -> Resolved:
    try:
        return trl_config.build_trl_config(spec, spec.train.trainer, _filled(spec), loaded), []
    except SpecError as e:
        return None, list(e.issues)


def _bundled_overrides(mode: str, replicas: int) -> list[Override]:
    """The `--set` values known only at run time (the job directory, the server's host, the shifted ports)."""
    overrides = [Override("output_dir", Ref(V.LG_TRAINER_OUTPUT_YAML, "output_dir="))]
    if mode == "server":
        overrides += [
            Override("generation.vllm_server.host", Ref(V.LG_SERVER_HOST_YAML, "generation.vllm_server.host=")),
            Override("generation.vllm_server.port", Ref(V.LG_SERVER_PORT, "generation.vllm_server.port=")),
            Override("generation.vllm_server.group_port",
                     Ref(V.LG_GROUP_PORT, "generation.vllm_server.group_port=")),
        ]
        if replicas > 1:
            overrides.append(Override("generation.vllm_server.replicas",
                                      Ref(V.LG_REPLICAS_YAML, "generation.vllm_server.replicas=")))
    return overrides


def _trl_overrides(mode: str, replicas: int) -> list[Override]:
    """A TRL trainer's run config (`launchgen.trainers.declarations.trl.config`): TRL's output_dir and the `server`
    section (one server: LG920 refuses replicas)."""
    overrides = [Override("args.output_dir", Ref(V.LG_TRAINER_OUTPUT_YAML, "args.output_dir="))]
    if mode == "server":
        overrides += [
            Override("server.host", Ref(V.LG_SERVER_HOST_YAML, "server.host=")),
            Override("server.port", Ref(V.LG_SERVER_PORT, "server.port=")),
            Override("server.group_port", Ref(V.LG_GROUP_PORT, "server.group_port=")),
        ]
    return overrides


def _trl_schema(model: type[BaseModel], prefix: str) -> tuple[dict[str, Any], dict[str, Any]]:
    assert issubclass(model, TrlRunConfig)  # CONFIGS' TRL entries are run configs (declarations/configs/trl.py)
    return trl_config.trl_args_json_schema(model, prefix)


@dataclass(frozen=True)
class Kind:
    name: str
    resolve: Callable[[Spec, LoadedSpec | None], Resolved]
    overrides: Callable[[str, int], list[Override]]  # (vllm mode, replicas) -> the trainer's --set values
    args_schema: Callable[[type[BaseModel], str], tuple[dict[str, Any], dict[str, Any]]]
    policy: Policy  # what a user value for an owned argument meets; the kind's rows are those of its policy
    uses_trl_table: bool  # train.args holds TRL's fields, checked against the generated table of one TRL release
    runs_script: bool  # train.script runs under it
    trl_rule_stages: tuple[str, ...]  # which of TRL's refusals (trainers/declarations/trl/rules.py) apply

    @property
    def owned(self) -> tuple[Owned, ...]:
        return rows(self.policy)

    def refused(self, args: Mapping[str, Any]) -> list[tuple[str, str]]:
        """(path, owning spec field) of every owned argument `args` sets that the kind refuses outright (LG902)."""
        if self.policy.accepts_equal:
            return []  # compared with launchgen's value while resolving (LG921)
        return [(o.path, o.owner) for o in self.owned if lookup(args, o.path)[0]]


BUNDLED = Kind("bundled", _resolve_bundled, _bundled_overrides, trainer_config.plain_args_json_schema, REFUSE,
               uses_trl_table=False, runs_script=False, trl_rule_stages=())
TRL = Kind("trl", _resolve_trl, _trl_overrides, _trl_schema, MATCH,
           uses_trl_table=True, runs_script=True, trl_rule_stages=("config", "trainer"))
# a script brings its own reward functions: only the config's rules are known to hold there
SCRIPT = Kind("script", _resolve_trl, _trl_overrides, _trl_schema, MATCH,
              uses_trl_table=True, runs_script=True, trl_rule_stages=("config",))
KINDS = (BUNDLED, TRL, SCRIPT)


def trainer_kind(trainer: str) -> Kind:
    """The kind of a declared trainer (an unknown name is the loader's LG0xx; it resolves as a bundled loop)."""
    cls = CONFIGS.get(trainer)
    return TRL if cls is not None and cls.facts.trl_config is not None else BUNDLED


def kind_of(spec: Spec) -> Kind:
    kind = trainer_kind(spec.train.trainer)
    return SCRIPT if kind is TRL and spec.train.script is not None else kind


def resolve_trainer_config(spec: Spec, loaded: LoadedSpec | None = None) -> Resolved:
    """The trainer's config for `spec` (its kind's resolution), or None and the LG901 issues (each with its
    `train.args` field and YAML line); a TRL trainer's also LG920/LG921."""
    return kind_of(spec).resolve(spec, loaded)


def as_bundled(cfg: AnyConfig | None) -> TrainerConfig | None:
    """`cfg` where it is a bundled loop's config (the typed fields its checks read), else None."""
    return cfg if isinstance(cfg, TrainerConfig) else None


def as_trl(cfg: AnyConfig | None) -> TrlRunConfig | None:
    """`cfg` where it is a TRL trainer's run config, else None."""
    return cfg if isinstance(cfg, TrlRunConfig) else None


def args_schemas_by_trainer() -> tuple[dict[str, dict[str, Any]], dict[str, Any]]:
    """The JSON Schema of `train.args` of every declared trainer, by name, and their definitions together (the
    sections they share are one definition each)."""
    by_name: dict[str, dict[str, Any]] = {}
    defs: dict[str, Any] = {}
    for name, cls in CONFIGS.items():
        by_name[name], own = trainer_kind(name).args_schema(cls, trainer_config.DEFS_PREFIX)
        defs.update(own)
    return by_name, defs
