"""Read a spec file: YAML with line numbers -> validated `Spec`, or a SpecError whose issues carry lines.

Pydantic's own messages are kept (they are precise) but mapped to stable codes by error type, and located
on the line of the offending key, so `launchgen check` can print `topology.yaml:12: error LG003 [...]`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from launchgen.issues import Issue, SpecError
from launchgen.spec import Spec

LinePath = tuple[str | int, ...]

# pydantic error type -> (code, fix)
_PYDANTIC_CODES: dict[str, tuple[str, str]] = {
    "extra_forbidden": ("LG002", "Remove the key or correct its spelling (`launchgen schema` lists every field)."),
    "missing": ("LG003", "Add the field; `launchgen init` writes a commented starter spec."),
}
_DEFAULT_CODE = ("LG004", "Give the field a value of the documented type and range (`launchgen schema`).")


@dataclass
class LoadedSpec:
    spec: Spec
    path: str
    text: str
    lines: dict[LinePath, int] = field(default_factory=dict)

    def line_of(self, path: LinePath | str) -> int | None:
        return line_of(self.lines, path)


def _walk(node: yaml.Node, prefix: LinePath, out: dict[LinePath, int]) -> None:
    if isinstance(node, yaml.MappingNode):
        for key_node, value_node in node.value:
            key = key_node.value if isinstance(key_node, yaml.ScalarNode) else str(key_node.value)
            path = (*prefix, key)
            out[path] = key_node.start_mark.line + 1
            _walk(value_node, path, out)
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            path = (*prefix, i)
            out[path] = item.start_mark.line + 1
            _walk(item, path, out)


def line_of(lines: dict[LinePath, int], path: LinePath | str) -> int | None:
    """Line of the deepest existing prefix of `path` (a missing key is reported at its parent)."""
    if isinstance(path, str):
        parts: list[str | int] = []
        for p in path.split(".") if path else []:
            parts.append(int(p) if p.isdigit() else p)
        tpath: LinePath = tuple(parts)
    else:
        tpath = path
    while tpath:
        if tpath in lines:
            return lines[tpath]
        tpath = tpath[:-1]
    return 1 if lines else None


def dotted(loc: tuple[Any, ...]) -> str:
    return ".".join(str(p) for p in loc)


def issues_from_validation(
    err: ValidationError, lines: dict[LinePath, int], file: str | None, prefix: LinePath = ()
) -> list[Issue]:
    issues = []
    for e in err.errors():
        # drop pydantic's synthetic loc parts (e.g. "function-after[...]")
        loc = tuple(p for p in (*prefix, *e["loc"]) if not (isinstance(p, str) and "[" in p))
        code, fix = _PYDANTIC_CODES.get(e["type"], _DEFAULT_CODE)
        msg = e["msg"]
        if e["type"] == "extra_forbidden":
            msg = f"unknown key `{loc[-1] if loc else ''}`"
        elif e["type"] not in ("missing",) and "input" in e and not isinstance(e["input"], (dict, list)):
            msg = f"{msg} (got {e['input']!r})"
        issues.append(Issue(code, dotted(loc), msg, fix, "error", line_of(lines, loc), file))
    return issues


def parse_yaml(text: str, file: str | None) -> tuple[Any, dict[LinePath, int]]:
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = mark.line + 1 if mark is not None else None
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise SpecError(
            [Issue("LG001", "", f"not valid YAML: {problem}", "Fix the YAML syntax at that line.", "error", line, file)]
        ) from None
    lines: dict[LinePath, int] = {}
    if node is not None:
        _walk(node, (), lines)
    return data, lines


def load_spec_text(text: str, file: str | None = None) -> LoadedSpec:
    data, lines = parse_yaml(text, file)
    if not isinstance(data, dict):
        raise SpecError(
            [Issue("LG001", "", "the spec must be a YAML mapping with sections job, model, ...",
                   "Start from `launchgen init`.", "error", 1, file)]
        )
    try:
        spec = Spec.model_validate(data)
    except ValidationError as exc:
        raise SpecError(issues_from_validation(exc, lines, file)) from None
    return LoadedSpec(spec=spec, path=file or "<spec>", text=text, lines=lines)


def load_spec(path: str | Path) -> LoadedSpec:
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as exc:
        raise SpecError(
            [Issue("LG000", "", f"cannot read {p}: {exc.strerror}", "Pass the path of an existing spec file.",
                   "error", None, str(p))]
        ) from None
    return load_spec_text(text, str(p))
