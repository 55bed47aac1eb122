"""Turning a pydantic error into what a user needs: "did you mean", the TRL pointer, and words, not class names.

Used by the loader for the spec (LG002/LG004) and by the plan for train.args (LG901), so both read the same.
"""

from __future__ import annotations

import difflib
import re
import types
from typing import Any, Union, get_args, get_origin

from pydantic import BaseModel

from launchgen.input import trlnames

_MAPPING_ERRORS = ("model_type", "model_attributes_type", "dict_type")
_QUOTED = re.compile(r"'([^']*)'")


def _is_model(tp: Any) -> bool:
    return isinstance(tp, type) and issubclass(tp, BaseModel)


def _alternatives(tp: Any) -> tuple[Any, ...]:
    return get_args(tp) if get_origin(tp) in (Union, types.UnionType) else (tp,)


def child(tp: Any, part: str | int) -> Any:
    """The annotation one step below `tp` (a model field, a list item, a dict value), or None."""
    for alt in _alternatives(tp):
        if _is_model(alt) and isinstance(part, str):
            field = alt.model_fields.get(part)
            return field.annotation if field is not None else None
        if get_origin(alt) is list and isinstance(part, int):
            return get_args(alt)[0]
        if get_origin(alt) is dict and isinstance(part, str):
            return get_args(alt)[1]
    return None


def model_at(root: type[BaseModel], loc: tuple[str | int, ...]) -> type[BaseModel] | None:
    """The model class that validates the mapping at `loc` (relative to `root`), if it is one."""
    current: Any = root
    for part in loc:
        current = child(current, part)
    return next((alt for alt in _alternatives(current) if _is_model(alt)), None)


def closest(word: str, choices: list[str]) -> str | None:
    """The choice `word` most likely meant: a case-only difference first, then the nearest spelling."""
    for c in choices:
        if c.lower() == word.lower():
            return c
    # a short form of one choice (`zero3` for `deepspeed_zero3`), too short for difflib's ratio to find
    within = [c for c in choices if len(word) >= 3 and word.lower() in c.lower()]
    if len(within) == 1:
        return within[0]
    found = difflib.get_close_matches(word.lower(), [c.lower() for c in choices], n=1, cutoff=0.75)
    return next((c for c in choices if found and c.lower() == found[0]), None)


def unknown_key_fix(root: type[BaseModel], loc: tuple[str | int, ...], path: str) -> str | None:
    """Fix text for an unknown key: where TRL's name lives here, else the closest key of that section."""
    trl = trlnames.hint_for(path)
    if trl is not None:
        return trl
    model = model_at(root, loc[:-1])
    key = str(loc[-1]) if loc else ""
    if model is None:
        return None
    guess = closest(key, list(model.model_fields))
    if guess is not None:
        return f"Did you mean `{guess}`?"
    return None


def choice_fix(error: dict[str, Any]) -> str | None:
    """For a value outside a fixed set (`mode: sever`): the choice it most likely meant."""
    expected = (error.get("ctx") or {}).get("expected", "")
    value = error.get("input")
    if not isinstance(value, str):
        return None
    from launchgen.trainers.declarations.trl.entries import PREFIX, TRL_GONE

    if value.removeprefix(PREFIX) in TRL_GONE and value.startswith(PREFIX):  # a TRL trainer the seeds name
        return f"{TRL_GONE[value.removeprefix(PREFIX)]}; run it from your own TRL script (train.script) instead."
    guess = closest(value, _QUOTED.findall(expected))
    return f"Did you mean `{guess}`?" if guess is not None else None


_RANGE = re.compile(r"\s*(\d+)\s*(?:-|\.\.)\s*(\d+)\s*")


def list_fix(error: dict[str, Any]) -> str | None:
    """For a scalar where a list is wanted (`gpus: 0-3`, `gpus: 0,1`, `gpus: 2`): the list it stands for."""
    value = error.get("input")
    items: list[str] = []
    if isinstance(value, int) and not isinstance(value, bool):
        items = [str(value)]
    elif isinstance(value, str) and (m := _RANGE.fullmatch(value)) and int(m[1]) <= int(m[2]) <= int(m[1]) + 1024:
        items = [str(i) for i in range(int(m[1]), int(m[2]) + 1)]
    elif isinstance(value, str) and re.fullmatch(r"\s*\w+(\s*,\s*\w+)*\s*,?\s*", value):
        items = [w.strip() for w in value.split(",") if w.strip()]
    elif isinstance(value, str) and len(words := value.split()) > 1:  # a command line (script_args): its words
        return f"Write a YAML list, one item per word: `[{', '.join(words)}]`."
    example = f"[{', '.join(items)}]" if items else "[0, 1, 2, 3]"
    return f"Write a YAML list, one item per entry: `{example}` (a range like `0-3` is not expanded)."


def value_fix(error: dict[str, Any]) -> str | None:
    """The fix a validator knew from the value (`fields.FixedValueError`)."""
    raised = (error.get("ctx") or {}).get("error")
    fix = getattr(raised, "fix", None)
    return fix if isinstance(fix, str) else None


def _kind(value: Any) -> str:
    if isinstance(value, list):
        return "a list"
    if value is None:
        return "nothing (null)"
    return repr(value)


def message(error: dict[str, Any]) -> str:
    """pydantic's message without class names; a section given a scalar or a list says what a section is."""
    if error["type"] in _MAPPING_ERRORS:
        return f"must be a mapping of `key: value` settings (got {_kind(error.get('input'))})"
    msg: str = error["msg"].removeprefix("Value error, ")
    return re.sub(r" or instance of [A-Z]\w*", "", msg)
