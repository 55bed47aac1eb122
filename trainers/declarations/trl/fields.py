"""`train.args` of a `trl.*` trainer checked against TRL's own config fields, without importing TRL: the table is
`fields.json`, generated from the installed TRL's dataclasses by `fieldgen` (a test keeps it equal). Standard
library only, so `launchgen check` answers in its usual time on a login node.
"""

from __future__ import annotations

import difflib
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from launchgen.trainers.declarations.trl.entries import LAUNCHGEN_KEYS, TRL_ENTRIES

_TABLE = Path(__file__).with_name("fields.json")


@lru_cache(maxsize=1)
def table() -> dict[str, Any]:
    data: dict[str, Any] = json.loads(_TABLE.read_text())
    return data


def table_version() -> str:
    return str(table()["trl_version"])


def fields_of(name: str) -> dict[str, dict[str, Any]]:
    """TRL's config fields of trainer `name` (`grpo`, ...): field -> {kinds, default[, choices]}."""
    out: dict[str, dict[str, Any]] = table()["configs"][TRL_ENTRIES[name].config_class]
    return out


def yaml_kind(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "bool"
    for t, k in ((int, "int"), (float, "float"), (str, "str"), (list, "list"), (tuple, "list"), (dict, "dict")):
        if isinstance(value, t):
            return k
    return "any"


#: A number YAML 1.2 reads as a float but PyYAML (YAML 1.1, which wants a dot and a signed exponent) leaves as a
#: string: `1e-5`, `5e-7`, `1E5`. The bundled trainers' pydantic config takes it as a float; so do TRL's fields.
_YAML11_TEXT_FLOAT = re.compile(r"[-+]?(\d+\.?\d*|\.\d+)[eE][-+]?\d+")


def yaml11_float(value: Any) -> float | None:
    """`value` as a float where it is a number YAML 1.1 left as text, else None."""
    return float(value) if isinstance(value, str) and _YAML11_TEXT_FLOAT.fullmatch(value.strip()) else None


def kind_accepted(value: Any, kinds: list[str]) -> bool:
    k = yaml_kind(value)
    return ("any" in kinds or k in kinds or (k == "int" and "float" in kinds)
            or ("float" in kinds and yaml11_float(value) is not None))


def coerce(name: str, args: Mapping[str, Any]) -> dict[str, Any]:
    """`args` with the YAML-1.1 text numbers of `name`'s float fields as floats (TRL's dataclasses would keep the
    string)."""
    fields = fields_of(name)
    out = dict(args)
    for key, value in args.items():
        row = fields.get(key)
        number = yaml11_float(value)
        if row is not None and number is not None and "float" in row["kinds"] and "str" not in row["kinds"]:
            out[key] = number
    return out


@dataclass(frozen=True)
class FieldProblem:
    key: str  # the train.args key
    message: str
    fix: str


def _kind_text(kinds: list[str]) -> str:
    return " or ".join(k if k != "null" else "null" for k in kinds)


def suggest(key: str, name: str) -> list[str]:
    return difflib.get_close_matches(key, [*fields_of(name), *LAUNCHGEN_KEYS], n=1, cutoff=0.75)


def problems(name: str, args: Mapping[str, Any], owned: frozenset[str] = frozenset()) -> list[FieldProblem]:
    """What in `args` (TRL's fields only: launchgen's keys are checked by their own models) TRL's config of
    `name` would refuse: an unknown key (with the closest field), a value of the wrong kind, a value not among
    a Literal's choices. `owned` keys are skipped (the topology's; reported elsewhere)."""
    fields = fields_of(name)
    cls = TRL_ENTRIES[name].config_class
    out: list[FieldProblem] = []
    for key, value in args.items():
        if key in LAUNCHGEN_KEYS or key in owned:
            continue
        row = fields.get(key)
        if row is None:
            close = suggest(key, name)
            hint = f"did you mean `{close[0]}`? " if close else ""
            out.append(FieldProblem(key, f"`{key}` is not a field of TRL's {cls} (TRL {table_version()})",
                                    f"{hint}Use {cls}'s field names (docs/trl-names.md), or launchgen's "
                                    f"{', '.join(LAUNCHGEN_KEYS)}."))
            continue
        if not kind_accepted(value, row["kinds"]):
            yaml11 = yaml11_float(value) is not None
            why = (" (YAML 1.1 reads a number with an exponent but no dot as text)" if yaml11 else "")
            fix = (f"Write `{key}` as an integer, e.g. {int(float(value))}." if yaml11 and "int" in row["kinds"]
                   else f"Write `{key}` as {_kind_text(row['kinds'])}.")
            out.append(FieldProblem(key, f"{cls}.{key} takes {_kind_text(row['kinds'])}, got {yaml_kind(value)} "
                                    f"{value!r}{why}", fix))
            continue
        choices = row.get("choices")
        if choices is not None and value not in choices:
            out.append(FieldProblem(key, f"{cls}.{key} is one of {', '.join(map(str, choices))}, got {value!r}",
                                    f"Pick one of {', '.join(map(str, choices))}."))
    return out
