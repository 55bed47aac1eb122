"""Read a spec file: YAML with line numbers -> validated `Spec`, or a SpecError whose issues carry lines.

Pydantic's own messages are kept (they are precise) but mapped to stable codes by error type, and located
on the line of the offending key, so `launchgen check` can print `topology.yaml:12: error LG003 [...]`.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from launchgen.input import hints, yamlguard
from launchgen.input.spec import Spec
from launchgen.input.yamlguard import GuardError
from launchgen.shared.issues import Issue, SpecError

LinePath = tuple[str | int, ...]

# pydantic error type -> (code, fix)
_PYDANTIC_CODES: dict[str, tuple[str, str]] = {
    "extra_forbidden": ("LG002", "Remove the key or correct its spelling (`launchgen schema` lists every field)."),
    "missing": ("LG003", "Add the field; `launchgen init` writes a commented starter spec."),
}
_DEFAULT_CODE = ("LG004", "Give the field a value of the documented type and range (`launchgen schema`).")
#: the generic fixes above; a caller that has a better generic fix replaces only these
PYDANTIC_FIXES = frozenset(f for _c, f in (*_PYDANTIC_CODES.values(), _DEFAULT_CODE))


@dataclass
class LoadedSpec:
    spec: Spec
    path: str
    text: str
    lines: dict[LinePath, int] = field(default_factory=dict)
    #: issues found while reading that do not stop loading (an empty `vllm:`); reported by `check`
    warnings: list[Issue] = field(default_factory=list)

    def line_of(self, path: LinePath | str) -> int | None:
        return line_of(self.lines, path)


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


def _user_loc(raw: tuple[Any, ...], lines: dict[LinePath, int]) -> LinePath:
    """pydantic's loc without its synthetic parts (`function-after[...]`, `list[int]`); a key the user wrote
    is kept even when it contains brackets."""
    kept: list[str | int] = []
    for p in raw:
        if isinstance(p, str) and "[" in p and (*kept, p) not in lines:
            continue
        kept.append(p)
    return tuple(kept)


def issues_from_validation(
    err: ValidationError, lines: dict[LinePath, int], file: str | None, prefix: LinePath = (),
    model: type[BaseModel] = Spec,
) -> list[Issue]:
    """One issue per pydantic error; `model` is the class that raised it (at `prefix` of the spec)."""
    issues = []
    for e in err.errors():
        loc = _user_loc((*prefix, *e["loc"]), lines)
        code, fix = _PYDANTIC_CODES.get(e["type"], _DEFAULT_CODE)
        msg = hints.message(dict(e))
        if e["type"] == "extra_forbidden":
            msg = f"unknown key `{loc[-1] if loc else ''}`"
            fix = hints.unknown_key_fix(model, loc[len(prefix):], dotted(loc)) or fix
        elif e["type"] == "literal_error":
            fix = hints.choice_fix(dict(e)) or fix
        elif e["type"] == "list_type":
            fix = hints.list_fix(dict(e)) or fix
        elif e["type"] == "value_error":
            fix = hints.value_fix(dict(e)) or fix
        if e["type"] not in ("missing", *_NO_GOT) and "input" in e and not isinstance(e["input"], (dict, list)):
            msg = f"{msg} (got {e['input']!r})"
        issues.append(Issue(code, dotted(loc), msg, fix, "error", line_of(lines, loc), file))
    return sorted(issues, key=lambda i: i.line or 0)


_NO_GOT = ("extra_forbidden", "model_type", "model_attributes_type", "dict_type")
_GUARD_CODES = {"syntax": "LG001", "duplicate": "LG006", "value": "LG004"}
#: Top-level sections whose empty form (`slurm:` with every child commented out) means "all defaults".
_DEFAULTED_SECTIONS = ("job", "slurm", "model", "train")


def _guard_issues(exc: GuardError, file: str | None) -> SpecError:
    return SpecError([Issue(_GUARD_CODES[p.kind], dotted(p.path), p.message, p.fix, "error", p.line, file)
                      for p in sorted(exc.problems, key=lambda p: p.line or 0)])


def _lines(root: yaml.Node) -> dict[LinePath, int]:
    out: dict[LinePath, int] = {}
    for path, node, key, _first in yamlguard.walk(root):
        if path:
            out[path] = (key or node).start_mark.line + 1
    return out


def _parse(text: str, file: str | None) -> tuple[Any, dict[LinePath, int], yaml.Node | None]:
    try:
        node = yamlguard.compose(text)
        if node is None:
            return None, {}, None
        yamlguard.check_shape(node)
        problems = yamlguard.value_problems(node)
        if problems:
            raise yamlguard.GuardError(problems)
    except yamlguard.GuardError as exc:
        raise _guard_issues(exc, file) from None
    try:
        data = yaml.SafeLoader("").construct_document(node)
    except yaml.MarkedYAMLError as exc:
        # a tag no safe constructor knows (`!python/object`, a bare `=`)
        mark = exc.problem_mark or exc.context_mark
        raise SpecError([Issue("LG001", "", f"not valid YAML: {exc.problem or exc.context}",
                               "Write plain mappings with text keys, lists, strings and numbers (no tags, no "
                               "complex keys).", "error", mark.line + 1 if mark is not None else None, file)]) from None
    return data, _lines(node), node


def parse_yaml(text: str, file: str | None) -> tuple[Any, dict[LinePath, int]]:
    """Text -> (data, line of every key path); hostile or mistaken YAML raises SpecError (LG001/LG004/LG006)."""
    data, lines, _node = _parse(text, file)
    return data, lines


_YAML_KINDS = {"int": "number", "float": "number", "bool": "boolean", "timestamp": "date", "null": "null"}


def _type_mismatch(issue: Issue) -> bool:
    return issue.code == "LG004" and "valid string" in issue.message


def _quote_hint(issue: Issue, nodes: dict[str, yaml.Node]) -> Issue:
    """A text field given what YAML read as a number, a boolean or a date (`revision: 1.10` is 1.1, `on` is
    true): say so, and how to quote it."""
    node = nodes.get(issue.path)
    if not _type_mismatch(issue) or not isinstance(node, yaml.ScalarNode) or node.style:
        return issue
    kind = _YAML_KINDS.get(node.tag.rsplit(":", 1)[-1])
    if kind is None:
        return issue
    message = f"unquoted `{node.value}` is read by YAML as a {kind}, but this is a text field"
    return Issue(issue.code, issue.path, message, f'Quote it: "{node.value}".', issue.severity, issue.line,
                 issue.file)


def _nodes_by_path(root: yaml.Node | None) -> dict[str, yaml.Node]:
    if root is None:
        return {}
    return {dotted(p): node for p, node, _key, _first in yamlguard.walk(root)}


def _blank_keys(root: yaml.Node | None) -> set[str]:
    """Top-level keys written with nothing after the colon (not an explicit `null` or `~`)."""
    if not isinstance(root, yaml.MappingNode):
        return set()
    return {k.value for k, v in root.value
            if isinstance(k, yaml.ScalarNode) and isinstance(v, yaml.ScalarNode) and v.value == "" and not v.style}


def _empty_sections(data: dict[Any, Any], blank: set[str], lines: dict[LinePath, int],
                    file: str | None) -> list[Issue]:
    """`vllm:` with everything under it commented out is null, i.e. no vLLM at all, which is rarely what was
    meant: a warning. Other empty sections mean their defaults, as if the keys were absent."""
    for name in _DEFAULTED_SECTIONS:
        if name in data and data[name] is None:
            data[name] = {}
    if "vllm" not in blank:
        return []
    return [Issue("LG005", "vllm", "the vllm section is empty (its keys commented out?), so there is no vLLM and "
                  "the trainer generates with plain transformers generate",
                  "Delete the `vllm:` line for no vLLM, or write `vllm: {}` (server mode defaults) or its fields.",
                  "warning", lines.get(("vllm",)), file)]


@dataclass
class SpecData:
    """A spec file read but not yet validated: its data, the line of every key path, the YAML tree."""

    data: dict[str, Any]
    text: str
    file: str | None
    lines: dict[LinePath, int]
    root: yaml.Node | None = None
    warnings: list[Issue] = field(default_factory=list)


def read_spec_data(text: str, file: str | None = None) -> SpecData:
    """The spec's YAML as data (LG001/LG004/LG006 for what is not a YAML mapping a spec can be)."""
    data, lines, root = _parse(text, file)
    if data is None:
        raise SpecError([Issue("LG001", "", "the spec is empty", "Start from `launchgen init`.", "error", 1, file)])
    if not isinstance(data, dict):
        raise SpecError(
            [Issue("LG001", "", "the spec must be a YAML mapping with sections job, model, ...",
                   "Start from `launchgen init`.", "error", 1, file)]
        )
    return SpecData(data, text, file, lines, root, _empty_sections(data, _blank_keys(root), lines, file))


def validate_spec_data(sd: SpecData) -> LoadedSpec:
    """Read data -> a validated `Spec` (LG002-LG004 with the line of each key)."""
    try:
        spec = Spec.model_validate(sd.data)
    except ValidationError as exc:
        found = issues_from_validation(exc, sd.lines, sd.file)
        nodes = _nodes_by_path(sd.root) if any(_type_mismatch(i) for i in found) else {}
        raise SpecError([_quote_hint(i, nodes) for i in found]) from None
    return LoadedSpec(spec=spec, path=sd.file or "<spec>", text=sd.text, lines=sd.lines, warnings=sd.warnings)


def load_spec_text(text: str, file: str | None = None) -> LoadedSpec:
    return validate_spec_data(read_spec_data(text, file))


def read_spec_file(path: str | Path) -> SpecData:
    """A spec file's data (`-`: stdin, reported as `<stdin>`), for callers that expand it before validating."""
    file = "<stdin>" if str(path) == "-" else str(path)
    try:
        text = yamlguard.decode(read_spec_bytes(path))
    except yamlguard.GuardError as exc:
        raise _guard_issues(exc, file) from None
    return read_spec_data(text, file)


def load_spec_bytes(raw: bytes, file: str | None = None) -> LoadedSpec:
    try:
        text = yamlguard.decode(raw)
    except yamlguard.GuardError as exc:
        raise _guard_issues(exc, file) from None
    return load_spec_text(text, file)


def read_spec_bytes(path: str | Path) -> bytes:
    """The spec's bytes (`-` is stdin), at most one byte over the limit so a huge file is never read whole."""
    if str(path) == "-":
        return sys.stdin.buffer.read(yamlguard.MAX_SPEC_BYTES + 1)
    p = Path(path)
    try:
        if p.is_dir():
            raise IsADirectoryError(21, "is a directory")
        with p.open("rb") as f:
            return f.read(yamlguard.MAX_SPEC_BYTES + 1)
    except OSError as exc:
        raise SpecError(
            [Issue("LG000", "", f"cannot read {p}: {exc.strerror}", "Pass the path of an existing spec file.",
                   "error", None, str(p))]
        ) from None


def load_spec(path: str | Path) -> LoadedSpec:
    """Load a spec file (`-`: stdin, reported as `<stdin>`)."""
    file = "<stdin>" if str(path) == "-" else str(path)
    return load_spec_bytes(read_spec_bytes(path), file)
