"""`launchgen schema`: the spec's JSON schema, or a markdown reference generated from the models.

The markdown is the README's spec reference (regenerate it with `launchgen schema --format markdown`), so
field documentation lives in exactly one place: the `Field(description=...)` of `launchgen/input/spec.py`.
"""

from __future__ import annotations

import json
import types
from typing import Any, Literal, Union, get_args, get_origin

import click
from pydantic import BaseModel
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

from launchgen.input.spec import Spec

HELP = """\
Print the spec schema: JSON schema (for editors and validators) or a markdown reference of every field.

\b
Examples:
  launchgen schema > topology.schema.json
  launchgen schema --format markdown > docs/spec-reference.md
"""


def type_name(tp: Any) -> str:
    """A short human name for an annotation: `int`, `"a" | "b"`, `list[int] | null`, `map[str, str]`."""
    if tp is type(None):
        return "null"
    origin = get_origin(tp)
    if origin is Literal:
        return " \\| ".join(json.dumps(a) for a in get_args(tp))
    if origin in (Union, types.UnionType):
        return " \\| ".join(type_name(a) for a in get_args(tp))
    if origin in (list, tuple, set, frozenset):
        args = [a for a in get_args(tp) if a is not Ellipsis]
        return f"list[{', '.join(type_name(a) for a in args) or 'any'}]"
    if origin is dict:
        k, v = get_args(tp) or (str, Any)
        return f"map[{type_name(k)}, {type_name(v)}]"
    if tp is Any:
        return "any"
    if isinstance(tp, type) and issubclass(tp, BaseModel):
        return "section"
    return getattr(tp, "__name__", str(tp))


def default_text(info: FieldInfo) -> str:
    if info.is_required():
        return "**required**"
    if info.default_factory is not None:
        try:
            value = info.default_factory()  # type: ignore[call-arg]
        except TypeError:
            return ""
        if isinstance(value, BaseModel):
            return "(section defaults)"
        return f"`{json.dumps(value)}`"
    if info.default is PydanticUndefined:
        return ""
    return f"`{json.dumps(info.default)}`"


def _model_of(tp: Any) -> type[BaseModel] | None:
    if isinstance(tp, type) and issubclass(tp, BaseModel):
        return tp
    for a in get_args(tp):
        m = _model_of(a)
        if m is not None:
            return m
    return None


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _upper_bound(info: FieldInfo) -> str:
    """A field's documented upper bound (launchgen.input.bounds; the loader refuses more with LG004)."""
    le = next((m.le for m in info.metadata if isinstance(getattr(m, "le", None), int)), None)
    return "" if le is None else f" At most {le:,}."


def markdown_reference(model: type[BaseModel] = Spec, prefix: str = "", note: str = "") -> str:
    """Every field of `model` and its sections: one table per section, with dotted paths."""
    rows: list[str] = []
    sections: list[tuple[str, type[BaseModel], str]] = []
    for name, info in model.model_fields.items():
        path = f"{prefix}{name}"
        sub = _model_of(info.annotation)
        if sub is not None:
            req = "Required" if info.is_required() else "Optional"
            sections.append((path, sub, f"*{req}.* {info.description or ''}".strip()))
            continue
        rows.append(f"| `{path}` | {type_name(info.annotation)} | {default_text(info)} | "
                    f"{_cell((info.description or '') + _upper_bound(info))} |")
    out: list[str] = []
    if rows:
        out.append(f"### `{prefix.rstrip('.')}`\n" if prefix else "### Top level\n")
        if note:
            out.append(note + "\n")
        out.append("| Field | Type | Default | Description |\n|---|---|---|---|")
        out.extend(rows)
        out.append("")
    for path, sub, sub_note in sections:
        out.append(markdown_reference(sub, f"{path}.", sub_note))
    return "\n".join(out)


def spec_json_schema() -> dict[str, Any]:
    """The spec's JSON Schema, with `train.args` typed as the config of the trainer `train.trainer` names
    (`kinds.registry.args_schemas_by_trainer`): an `if`/`then` per trainer, so an editor offers GRPO's options
    only under `trainer: grpo`."""
    from launchgen.input.spec import TrainSpec
    from launchgen.kinds.registry import args_schemas_by_trainer

    schema = Spec.model_json_schema()
    by_name, defs = args_schemas_by_trainer()
    schema["$defs"].update(defs)
    train = schema["$defs"]["TrainSpec"]
    field = train["properties"]["args"]
    train["properties"]["args"] = {"type": "object", "description": field.get("description", "")}
    default = TrainSpec.model_fields["trainer"].default
    branches = []
    for name, args in by_name.items():
        ref = f"trainer.args.{name}"
        schema["$defs"][ref] = args
        named: dict[str, Any] = {"properties": {"trainer": {"const": name}}, "required": ["trainer"]}
        when = {"anyOf": [{"not": {"required": ["trainer"]}}, named]} if name == default else named
        branches.append({"if": when, "then": {"properties": {"args": {"$ref": f"#/$defs/{ref}"}}}})
    train["allOf"] = branches
    # a spec file may hold a sweep (launchgen.input.sweep expands it before a point is a Spec)
    from launchgen.input.sweep import KEY, SweepSection

    schema["$defs"]["SweepSection"] = SweepSection.model_json_schema()
    schema["properties"][KEY] = {"$ref": "#/$defs/SweepSection",
                                 "description": "Many runs of this spec (docs/sweeps.md)."}
    return schema


def markdown_document() -> str:
    return ("## Spec reference\n\n"
            "Generated by `launchgen schema --format markdown` from `launchgen/input/spec.py`; unknown keys are "
            "errors (LG002). `train.args` takes the fields of `launchgen.trainers.declarations.config.TrainerConfig`.\n\n"
            + markdown_reference() + "\n" + _sweep_reference())


def _sweep_reference() -> str:
    from launchgen.input.sweep import KEY, SweepSection

    return markdown_reference(SweepSection, f"{KEY}.", "*Optional.* Many runs of this spec: each point is the spec with "
                              "its values set at their dotted paths (docs/sweeps.md).")


@click.command("schema", help=HELP)
@click.option("--format", "fmt", type=click.Choice(["json", "markdown"]), default="json", show_default=True)
def command(fmt: str) -> None:
    if fmt == "json":
        click.echo(json.dumps(spec_json_schema(), indent=2))
    else:
        click.echo(markdown_document())
