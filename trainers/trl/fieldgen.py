"""Generate `fields.json`, the torch-free table of TRL's config fields that `launchgen check` validates `train.args`
against: `python -m launchgen.trainers.trl.fieldgen [--check]` (imports the installed trl).

Per config class, each field's accepted YAML kinds (`bool`, `int`, `float`, `str`, `list`, `dict`, `null`; `any`
where the annotation is not one of them), its choices (a Literal), and its default (when JSON can hold it). `tests/trainers/test_trl_fields.py` regenerates it from the installed TRL and fails when
it differs, so the table cannot drift from the TRL the tests run.
"""

from __future__ import annotations

import argparse
import dataclasses
import enum
import importlib
import json
import sys
import types
import typing
from pathlib import Path
from typing import Any

from launchgen.trainers.declarations.trl.entries import TRL_ENTRIES

TABLE = Path(__file__).parents[1] / "declarations" / "trl" / "fields.json"
_SCALARS = {bool: "bool", int: "int", float: "float", str: "str", list: "list", dict: "dict", tuple: "list"}


def _kinds(ann: Any) -> tuple[set[str], list[Any] | None]:
    """The YAML kinds an annotation accepts and, for a Literal, its values."""
    origin = typing.get_origin(ann)
    if ann is type(None):
        return {"null"}, None
    if ann in _SCALARS:
        return {_SCALARS[ann]}, None
    if origin is typing.Literal:
        vals = list(typing.get_args(ann))
        return {_SCALARS.get(type(v), "any") for v in vals}, vals
    if origin in (typing.Union, types.UnionType):
        kinds: set[str] = set()
        choices: list[Any] | None = []
        for a in typing.get_args(ann):
            k, c = _kinds(a)
            kinds |= k
            if c is None and k != {"null"}:
                choices = None
            elif choices is not None and c is not None:
                choices += c
        return kinds, (choices or None)
    if origin in _SCALARS:
        return {_SCALARS[origin]}, None
    if isinstance(ann, type) and issubclass(ann, enum.Enum):
        return {"str"}, None  # TrainingArguments accepts the enum's value as a string
    return {"any"}, None


def _default(f: dataclasses.Field[Any]) -> Any:
    value = f.default if f.default is not dataclasses.MISSING else (
        f.default_factory() if f.default_factory is not dataclasses.MISSING else None)
    if isinstance(value, enum.Enum):
        value = value.value
    try:
        json.dumps(value)
    except (TypeError, ValueError):
        return None
    return value


def config_fields(cls: type) -> dict[str, dict[str, Any]]:
    hints = typing.get_type_hints(cls)
    out: dict[str, dict[str, Any]] = {}
    for f in dataclasses.fields(cls):
        if not f.init:
            continue
        kinds, choices = _kinds(hints.get(f.name, Any))
        row: dict[str, Any] = {"kinds": sorted(kinds), "default": _default(f)}
        if choices is not None:
            row["choices"] = choices
        out[f.name] = row
    return out


def build_table() -> dict[str, Any]:
    import trl

    configs: dict[str, Any] = {}
    for entry in TRL_ENTRIES.values():
        module, _, name = entry.config.partition(":")
        configs[entry.config_class] = config_fields(getattr(importlib.import_module(module), name))
    return {"trl_version": trl.__version__, "configs": configs}


def render(table: dict[str, Any]) -> str:
    return json.dumps(table, indent=1, sort_keys=True) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--check", action="store_true", help="exit 1 when fields.json differs from the installed TRL")
    a = p.parse_args(argv)
    text = render(build_table())
    if a.check:
        if TABLE.read_text() != text:
            print(f"{TABLE} differs from the installed TRL: run python -m launchgen.trainers.trl.fieldgen",
                  file=sys.stderr)
            return 1
        return 0
    TABLE.write_text(text)
    print(f"wrote {TABLE}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
