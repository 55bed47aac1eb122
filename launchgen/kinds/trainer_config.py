"""The trainer's config from the spec: `train.args` plus the fields the spec owns, validated as the trainer's own
`TrainerConfig` (pydantic only, cheap to import: `check` imports no torch).

The bundled loop's kind (`kinds.registry.BUNDLED`) resolves with it before the checks (`Ctx.trainer_cfg`): checks
read typed fields with the trainer's own defaults, LG901 (`checks/spec/trainerargs.py`) reports what does not
validate, and `build_plan` embeds the same config.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator, Mapping
from functools import cache
from typing import Any, get_args

from pydantic import BaseModel, ValidationError

from launchgen.input.loader import PYDANTIC_FIXES as _PYDANTIC_FIXES
from launchgen.input.loader import LoadedSpec, issues_from_validation
from launchgen.input.spec import Spec
from launchgen.kinds.ownership import Filled, fill_owned, owned_args, owned_paths
from launchgen.planning.model import _err, _invariant
from launchgen.shared.issues import Issue, SpecError
from launchgen.trainers.declarations.config import TrainerConfig
from launchgen.trainers.declarations.configs import CONFIGS


def build_trainer_config(spec: Spec, precision: str, output_dir: str, loaded: LoadedSpec | None = None,
                         args: Mapping[str, Any] | None = None) -> TrainerConfig:
    """The resolved TrainerConfig (`args`, by default train.args, + what the spec owns); raises SpecError (LG901)."""
    args = copy.deepcopy(dict(spec.train.args if args is None else args))
    _invariant(not owned_args(args), "train.args sets a field the spec owns (LG902)")
    data: dict[str, Any] = args
    if not isinstance(data.get("generation", {}), dict):
        raise SpecError([_err("LG901", "train.args.generation", "must be a mapping",
                              "Write `generation:` as a mapping of generation settings.", loaded)])
    fill_owned(data, Filled(spec, precision, output_dir))
    try:
        return TrainerConfig.model_validate(data)
    except ValidationError as exc:
        lines = loaded.lines if loaded is not None else {}
        file = loaded.path if loaded is not None else None
        found = issues_from_validation(exc, lines, file, prefix=("train", "args"),
                                       model=CONFIGS.get(spec.train.trainer, TrainerConfig))
        generic = _PYDANTIC_FIXES
        raise SpecError([Issue("LG901", i.path, i.message,
                               "Fix the trainer argument (fields of launchgen.trainers.declarations.config.TrainerConfig)."
                               if i.fix in generic else i.fix, "error", i.line, i.file) for i in found]) from None


def _field_paths(model: type[BaseModel], prefix: str = "") -> Iterator[str]:
    for name, field in model.model_fields.items():
        yield prefix + name
        for sub in (field.annotation, *get_args(field.annotation)):
            if isinstance(sub, type) and issubclass(sub, BaseModel):
                yield from _field_paths(sub, f"{prefix}{name}.")


def trainer_default(model: type[BaseModel], path: str) -> Any:
    """The default of a train.args field for the trainer whose config class is `model` (its own `defaults` first);
    None where that trainer has no such field."""
    own = getattr(model, "defaults", {})
    if path in own:
        return own[path]
    *parents, leaf = path.split(".")
    node: type[BaseModel] | None = model
    for part in parents:
        ann = node.model_fields[part].annotation if node is not None and part in node.model_fields else None
        node = next((a for a in (ann, *get_args(ann)) if isinstance(a, type) and issubclass(a, BaseModel)), None)
    if node is None or leaf not in node.model_fields:
        return None  # not this trainer's field (another trainer's, e.g. a TRL trainer's own table)
    field = node.model_fields[leaf]
    return field.default_factory() if field.default_factory is not None else field.default  # type: ignore[call-arg]


@cache
def arg_paths() -> frozenset[str]:
    """Every dotted `train.args` path some declared trainer's config has (sections included)."""
    return frozenset(p for cls in CONFIGS.values() for p in _field_paths(cls))


def trainer_output_pattern(spec: Spec) -> str:
    """The trainer's output_dir in the written config (the script replaces it with the expanded one, --set)."""
    return spec.job.output_dir.rstrip("/") + "/trainer"


#: Where the trainer config's own definitions go in the spec's JSON Schema (apart from the spec's).
DEFS_PREFIX = "trainer."


def _section(node: dict[str, Any], defs: dict[str, Any]) -> dict[str, Any] | None:
    """The object schema a property refers to (`$ref`, or the first `$ref` of an anyOf/allOf), if any."""
    for cand in [node, *node.get("anyOf", []), *node.get("allOf", [])]:
        ref = cand.get("$ref")
        if isinstance(ref, str):
            found = defs.get(ref.rsplit("/", 1)[-1])
            return found if isinstance(found, dict) else None
    return node if "properties" in node else None


def plain_args_json_schema(model: type[BaseModel], prefix: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """The JSON Schema of `train.args` for one bundled trainer: its config class without the arguments the spec
    owns (LG902), and its definitions, keyed `<prefix><Model>` (for `launchgen schema`: editor completion and
    validation)."""
    schema = model.model_json_schema(ref_template="#/$defs/" + prefix + "{model}")
    defs = {prefix + k: v for k, v in schema.pop("$defs", {}).items()}
    for path in owned_paths():
        *parents, leaf = path.split(".")
        node: dict[str, Any] | None = schema
        for part in parents:
            node = _section(node.get("properties", {}).get(part, {}), defs) if node is not None else None
        if node is not None:
            node.get("properties", {}).pop(leaf, None)
            if leaf in node.get("required", []):
                node["required"].remove(leaf)
    for path, value in getattr(model, "defaults", {}).items():  # the trainer's own defaults, where it has them
        *parents, leaf = path.split(".")
        node = schema
        for part in parents:
            node = _section(node.get("properties", {}).get(part, {}), defs) if node is not None else None
        prop = node.get("properties", {}).get(leaf) if node is not None else None
        if prop is not None and not parents:  # a shared section's definition is every trainer's: left alone
            prop["default"] = value
    schema["title"] = "train.args"
    return schema, defs
