"""`python -m launchgen.trainers.<name>`: arguments, the config file and its errors, then the training loop.

Everything up to a validated config imports only the standard library, pydantic and yaml, so `--help` and a config
error answer in a fraction of a second; torch (`core`) is imported only to train. `--help` lists every config
field (dotted path, type, default, description), generated from the trainer's config class
(`launchgen.trainers.declarations.configs`).
"""

from __future__ import annotations

import argparse
import json
import sys
import textwrap
import types
import typing
from pathlib import Path
from typing import Any

from launchgen.trainers.declarations.algorithm_options import ordered_keys
from launchgen.trainers.declarations.config import TrainerConfig, apply_override
from launchgen.trainers.declarations.configs import CONFIGS
from launchgen.trainers.declarations.errors import TrainerSetupError, run_reporting
from pydantic import BaseModel
from pydantic_core import PydanticUndefined

from launchgen.shared.jobdir import (
    EXIT_CONFIG,  # stdlib only (trainers.checkpoint re-exports it, but imports torch)
)

_WIDTH = 110


def _type_name(annotation: Any) -> str:
    """A short, readable type: `bf16|fp16|fp32`, `int | null`, `list[str]`."""
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin is typing.Literal:
        return "|".join(str(a) for a in args)
    if origin in (typing.Union, types.UnionType):
        return " | ".join("null" if a is type(None) else _type_name(a) for a in args)
    if origin is not None:
        inner = ", ".join(_type_name(a) for a in args)
        return f"{getattr(origin, '__name__', str(origin))}[{inner}]"
    if isinstance(annotation, type):
        return annotation.__name__
    return str(annotation)


def _default(field: Any) -> str:
    if field.default is PydanticUndefined and field.default_factory is None:
        return "required"
    value = field.default_factory() if field.default_factory is not None else field.default
    if isinstance(value, BaseModel):
        value = value.model_dump(mode="json")
    elif isinstance(value, list):
        value = [v.model_dump(mode="json", exclude_defaults=True) if isinstance(v, BaseModel) else v for v in value]
    if value is None:
        return "null"
    return json.dumps(value)


def _section(model: Any, field: Any) -> type[BaseModel] | None:
    """The model a field nests (a section, or the items of a list of models)."""
    ann = field.annotation
    if isinstance(ann, type) and issubclass(ann, BaseModel):
        return ann
    args = typing.get_args(ann)
    if typing.get_origin(ann) is list and args and isinstance(args[0], type) and issubclass(args[0], BaseModel):
        return args[0]
    return None


def field_rows(model: type[BaseModel] = TrainerConfig, prefix: str = "",
               defaults: dict[str, Any] | None = None) -> list[tuple[str, str, str, str]]:
    """(dotted path, type, default, description) of every leaf field; a list of models shows its items as `x[].y`.
    A trainer's own defaults (`defaults` of its config class) replace the shared field's."""
    own = getattr(model, "defaults", {}) if defaults is None else defaults
    rows: list[tuple[str, str, str, str]] = []
    for name in ordered_keys(list(model.model_fields)):  # the GRPO options next to the algorithm knobs
        field = model.model_fields[name]
        path = prefix + name
        sub = _section(model, field)
        if sub is not None and typing.get_origin(field.annotation) is list:
            rows.append((path, "list", _default(field), field.description or ""))
            rows.extend(field_rows(sub, path + "[].", own))
        elif sub is not None:
            rows.extend(field_rows(sub, path + ".", own))
        else:
            default = json.dumps(own[path]) if path in own else _default(field)
            rows.append((path, _type_name(field.annotation), default, field.description or ""))
    return rows


def fields_help(model: type[BaseModel] = TrainerConfig) -> str:
    out = ["config fields (YAML keys of --config; --set takes the dotted path):", ""]
    for path, typ, default, desc in field_rows(model):
        out.append(f"  {path}: {typ} = {default}")
        if desc:
            out.extend(textwrap.wrap(desc, _WIDTH, initial_indent="      ", subsequent_indent="      "))
    return "\n".join(out) + "\n"


def _parser(trainer: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=f"python -m launchgen.trainers.{trainer}",
        description=f"Train with the bundled {trainer} trainer (alone or under accelerate launch).",
        epilog=fields_help(CONFIGS.get(trainer, TrainerConfig)),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--config", required=True, help="resolved trainer config (YAML), see the fields below")
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override one field (dotted path, e.g. generation.vllm_server.port=8001; the value is parsed as YAML); "
        "repeatable, applied in order before validation",
    )
    return p


def load_config(path: str, overrides: list[str]) -> TrainerConfig | str:
    """The validated config, or the one-line error to print."""
    import yaml
    from pydantic import ValidationError

    try:
        data = yaml.safe_load(Path(path).read_text())
        if not isinstance(data, dict):
            raise ValueError("expected a mapping at the top level")
        for item in overrides:
            apply_override(data, item)
        return TrainerConfig.model_validate(data)
    except ValidationError as e:
        errs = e.errors()
        loc = ".".join(str(x) for x in errs[0]["loc"]) or "(top level)"
        more = f" (+{len(errs) - 1} more)" if len(errs) > 1 else ""
        return f"error: {path}: {loc}: {errs[0]['msg']}{more}"
    except (OSError, ValueError, yaml.YAMLError) as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        return f"error: {path}: {first}"


def entry(argv: list[str] | None, trainer: str) -> int:
    """`python -m launchgen.trainers.<trainer> --config run.yaml`: config errors are one line and exit 2."""
    a = _parser(trainer).parse_args(argv)
    cfg = load_config(a.config, a.set)
    if isinstance(cfg, str):
        print(cfg, file=sys.stderr)
        return EXIT_CONFIG
    loaded = cfg

    def train() -> int:
        if loaded.trainer != trainer:
            raise TrainerSetupError(
                f"{a.config}: trainer is {loaded.trainer!r} but this is launchgen.trainers.{trainer}; "
                f"run python -m launchgen.trainers.{loaded.trainer} or fix `trainer`"
            )
        from launchgen.trainers.core import run  # torch: only now that there is something to train

        return run(loaded)

    return run_reporting(train)
