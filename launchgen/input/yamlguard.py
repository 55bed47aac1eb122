"""Reading untrusted YAML safely: bytes -> text -> node graph, with limits, before anything is constructed.

A spec is a few kilobytes written by hand, so the limits are generous for that and small enough that `check`
stays fast and linear: an alias bomb (billion laughs) is refused from its node graph, where aliases are shared
nodes, before anything expands it; a recursive alias and very deep nesting are refused the same way. The YAML
1.1 traps users fall into (an unquoted `8:00:00` is the base-60 number 28800, a repeated key silently keeps the
last value) are found on the nodes too, where the exact line is known.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import yaml

#: A spec is a few KB; 1 MiB leaves room for long reward/data settings and keeps parsing under a second or two.
MAX_SPEC_BYTES = 1 << 20
#: Values after expanding aliases; a real spec has a few hundred.
MAX_NODES = 100_000
#: Nesting levels; a real spec has five or six.
MAX_DEPTH = 64

#: libyaml's parser where PyYAML was built with it: ~10x faster, and it caps nesting itself (the pure-Python
#: composer recurses instead, which the RecursionError branch of `compose` catches).
_LOADER: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
_MERGE_TAG = "tag:yaml.org,2002:merge"
_NUMBER_TAGS = ("tag:yaml.org,2002:int", "tag:yaml.org,2002:float")
_SEXAGESIMAL = re.compile(r"[-+]?[0-9][0-9_]*(?::[0-5]?[0-9])+(?:\.[0-9_]*)?")


@dataclass(frozen=True)
class Problem:
    """A defect found while reading: `path` is the key path (when known), `line` 1-based."""

    kind: str  # "syntax" (LG001), "duplicate" (LG006), "value" (LG004)
    message: str
    fix: str
    line: int | None
    path: tuple[str | int, ...] = ()


class GuardError(Exception):
    def __init__(self, problems: list[Problem]) -> None:
        super().__init__(problems[0].message if problems else "")
        self.problems = problems


def _fail(message: str, fix: str, line: int | None = None) -> GuardError:
    return GuardError([Problem("syntax", message, fix, line)])


def decode(raw: bytes) -> str:
    """Spec bytes -> text; size, encoding and NUL bytes are refused here with the line they are on."""
    if len(raw) > MAX_SPEC_BYTES:
        # only MAX_SPEC_BYTES + 1 bytes are ever read, so the real size is unknown: say "more than"
        raise _fail(f"the spec is larger than 1 MiB; launchgen reads at most {MAX_SPEC_BYTES:,} bytes "
                    "(a spec is a few KB)", "Pass the topology spec itself, not a data or model file.")
    if raw.startswith(b"\xef\xbb\xbf"):
        raw = raw[3:]
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw.count(b"\n", 0, exc.start) + 1
        raise _fail(f"not UTF-8 text (byte 0x{raw[exc.start]:02x} at offset {exc.start}); is this a binary file?",
                    "Save the spec as UTF-8 text.", line) from None
    nul = text.find("\x00")
    if nul >= 0:
        raise _fail("the file contains a NUL byte; is this a binary file?", "Save the spec as plain UTF-8 text.",
                    text.count("\n", 0, nul) + 1)
    return text


def compose(text: str) -> yaml.Node | None:
    """Text -> the single document's node graph, with YAML errors as GuardError (line included)."""
    loader: Any = None
    try:
        loader = _LOADER(text)  # the reader refuses control characters already here
        return loader.get_single_node()
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        problem = exc.problem or exc.context or str(exc).splitlines()[0]
        if "nesting depth" in problem:  # libyaml's own cap
            raise _deep() from None
        lines = text.splitlines()
        # a tab where YAML wants indentation: the parser's words ("cannot start any token") do not say so
        tab = mark is not None and mark.line < len(lines) and "\t" in lines[mark.line][:mark.column + 1]
        fix = ("YAML indents with spaces only: replace the tab(s) on that line with spaces." if tab
               else "Fix the YAML syntax at that line.")
        said = f" (a tab at column {mark.column + 1})" if tab and mark is not None and "tab" not in problem else ""
        raise _fail(f"not valid YAML: {problem}{said}", fix, mark.line + 1 if mark is not None else None) from None
    except yaml.reader.ReaderError as exc:
        line = text.count("\n", 0, exc.position) + 1
        raise _fail(f"not valid YAML: character {exc.character!r} is not allowed in a YAML file",
                    "Remove the control character (write it as an escape inside double quotes if meant).",
                    line) from None
    except yaml.YAMLError as exc:
        raise _fail(f"not valid YAML: {str(exc).splitlines()[0]}", "Fix the YAML syntax.") from None
    except RecursionError:
        raise _deep() from None
    finally:
        if loader is not None:
            loader.dispose()


def _children(node: yaml.Node) -> list[yaml.Node]:
    if isinstance(node, yaml.MappingNode):
        return [n for pair in node.value for n in pair]
    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    return []


def check_shape(root: yaml.Node) -> None:
    """Refuse recursive aliases, alias expansion beyond MAX_NODES and nesting beyond MAX_DEPTH.

    One pass over the distinct nodes (an alias is the anchored node itself, so it is visited once), with the
    expanded size and depth computed bottom-up; the work is linear in the file, whatever the aliases multiply.
    """
    size: dict[int, int] = {}
    depth: dict[int, int] = {}
    visiting: set[int] = set()
    stack: list[tuple[yaml.Node, bool]] = [(root, False)]
    while stack:
        node, finished = stack.pop()
        nid = id(node)
        if finished:
            kids = _children(node)
            size[nid] = 1 + sum(size[id(k)] for k in kids)
            depth[nid] = 1 + max((depth[id(k)] for k in kids), default=0)
            visiting.discard(nid)
            _limit(node, size[nid], depth[nid])
            continue
        if nid in size:
            continue
        if nid in visiting:
            raise _fail("a recursive alias (an anchor used inside itself) has no finite value",
                        "Replace the alias with the value it should have.", node.start_mark.line + 1)
        visiting.add(nid)
        stack.append((node, True))
        stack.extend((k, False) for k in _children(node))


def _limit(node: yaml.Node, size: int, depth: int) -> None:
    line = node.start_mark.line + 1
    if size > MAX_NODES:
        raise _fail(f"the spec expands to more than {MAX_NODES:,} values (aliases repeating aliases: an "
                    "alias bomb?)", "Write the values out, or use aliases that do not multiply.", line)
    if depth > MAX_DEPTH:
        raise _deep(line)


def _deep(line: int | None = None) -> GuardError:
    return _fail(f"the YAML is nested too deeply (more than {MAX_DEPTH} levels)",
                 "Flatten the spec; it has a handful of sections a few levels deep.", line)


def _key(node: yaml.Node) -> str | int:
    # a complex key (a mapping used as a key) has no dotted name; its line still locates it
    return node.value if isinstance(node, yaml.ScalarNode) else f"<{type(node).__name__}>"


Located = tuple[tuple[str | int, ...], yaml.Node, "yaml.Node | None", bool]


def walk(root: yaml.Node) -> Iterator[Located]:
    """(path, value node, key node, first) in document order; an alias is yielded but not re-entered."""
    seen: set[int] = set()
    stack: list[tuple[tuple[str | int, ...], yaml.Node, yaml.Node | None]] = [((), root, None)]
    while stack:
        path, node, key = stack.pop()
        first = id(node) not in seen
        yield path, node, key, first
        if not first:
            continue
        seen.add(id(node))
        if isinstance(node, yaml.MappingNode):
            stack.extend(((*path, _key(k)), v, k) for k, v in reversed(node.value))
        elif isinstance(node, yaml.SequenceNode):
            stack.extend(((*path, i), v, None) for i, v in reversed(list(enumerate(node.value))))


def value_problems(root: yaml.Node) -> list[Problem]:
    """Duplicate keys, NUL characters (from escapes) and unquoted base-60 numbers, each with its line."""
    out: list[Problem] = []
    for path, node, key, first in walk(root):
        if isinstance(key, yaml.ScalarNode):
            out.extend(_scalar_problems(path, key))
        if not first:
            continue
        if isinstance(node, yaml.MappingNode):
            out.extend(_duplicates(path, node))
        elif isinstance(node, yaml.ScalarNode):
            out.extend(_scalar_problems(path, node))
    return out


def _duplicates(path: tuple[str | int, ...], node: yaml.MappingNode) -> Iterator[Problem]:
    first: dict[tuple[str, str], int] = {}
    for k, _v in node.value:
        if not isinstance(k, yaml.ScalarNode) or k.tag == _MERGE_TAG:
            continue
        line = k.start_mark.line + 1
        ident = (k.tag, k.value)
        if ident in first:
            yield Problem("duplicate", f"duplicate key `{k.value}` (first at line {first[ident]}); YAML would "
                          "silently keep only the last one", "Keep one of the two entries.", line, (*path, k.value))
        else:
            first[ident] = line


def _scalar_problems(path: tuple[str | int, ...], n: yaml.ScalarNode) -> Iterator[Problem]:
    line = n.start_mark.line + 1
    if "\x00" in n.value:
        yield Problem("value", "contains a NUL character, which no script, environment or command line can carry",
                      "Remove the \\0 escape.", line, path)
    # plain style is None from PyYAML and "" from libyaml
    if not n.style and n.tag in _NUMBER_TAGS and _SEXAGESIMAL.fullmatch(n.value):
        number = yaml.safe_load(n.value)
        yield Problem("value", f"unquoted `{n.value}` is read by YAML 1.1 as the base-60 number {number}",
                      f'Quote it: "{n.value}".', line, path)
