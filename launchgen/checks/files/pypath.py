"""Where the trainer will import a user's module from, and a finder that locates it without running any code.

The trainer runs `python -m` in the submit directory, so that directory comes first; then PYTHONPATH (from
`slurm.env` when the spec sets it, else this environment's, which sbatch passes on); then the site-packages of a
virtualenv that a `slurm.setup` line activates; then this interpreter's path. A setup line we cannot follow
(`module load`, `conda activate`, an `export`) may change all of that, so callers soften "not found" then.
"""

from __future__ import annotations

import ast
import importlib.machinery
import os
import re
import sys
from dataclasses import dataclass
from importlib.machinery import ModuleSpec
from pathlib import Path
from typing import TYPE_CHECKING

from launchgen.input import specfiles

if TYPE_CHECKING:
    from launchgen.checks.context import Ctx

_ACTIVATE_RE = re.compile(r"^\s*(?:source|\.)\s+(\S+)/bin/activate\s*(?:#.*)?$")
#: setup lines that cannot change where Python imports from
_HARMLESS_RE = re.compile(r"^\s*(?:#.*|echo\b.*|set\s+-[euxo]+\b.*|ulimit\b.*|nvidia-smi\b.*|hostname\b.*|)$")


@dataclass(frozen=True)
class SearchPath:
    paths: list[str]
    #: a setup line that may change the import path in ways we cannot follow (None: every line was understood)
    opaque_setup: str | None


def _venv_site_packages(venv: str) -> list[str]:
    root = Path(os.path.expanduser(venv))
    return sorted(str(p) for p in root.glob("lib/python*/site-packages"))


def _pythonpath(ctx: Ctx) -> str:
    env = ctx.spec.slurm.env
    for scope in (env.trainer, env.all):
        if "PYTHONPATH" in scope:
            return scope["PYTHONPATH"]
    return ctx.env.get("PYTHONPATH", "")


def search_path(ctx: Ctx) -> SearchPath:
    paths = [os.getcwd()]
    paths += [p for p in _pythonpath(ctx).split(os.pathsep) if p and "$" not in p]
    opaque = None
    for line in ctx.spec.slurm.setup:
        m = _ACTIVATE_RE.match(line)
        if m and "$" not in m.group(1):
            paths += _venv_site_packages(m.group(1))
        elif not _HARMLESS_RE.match(line) and opaque is None:
            opaque = line.strip()
    paths += [p for p in sys.path if p]
    return SearchPath(paths, opaque)


def find_module(name: str, paths: list[str]) -> ModuleSpec | None:
    """The spec of `name` (dotted) on `paths`, found without importing any package on the way."""
    parts = name.split(".")
    if not all(p.isidentifier() for p in parts):
        return None
    spec = importlib.machinery.PathFinder.find_spec(parts[0], paths)
    for i in range(1, len(parts)):
        if spec is None or not spec.submodule_search_locations:
            return None
        spec = importlib.machinery.PathFinder.find_spec(".".join(parts[: i + 1]), list(spec.submodule_search_locations))
    return spec


def _bound(node: ast.stmt, out: set[str]) -> bool:
    """Add the names one top-level statement binds; False when it makes the module's names unknowable."""
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        out.add(node.name)
        return node.name != "__getattr__"
    if isinstance(node, ast.Assign):
        for t in node.targets:
            out.update(n.id for n in ast.walk(t) if isinstance(n, ast.Name))
    elif isinstance(node, (ast.AnnAssign, ast.AugAssign)) and isinstance(node.target, ast.Name):
        out.add(node.target.id)
    elif isinstance(node, ast.Import):
        out.update((a.asname or a.name).split(".")[0] for a in node.names)
    elif isinstance(node, ast.ImportFrom):
        if any(a.name == "*" for a in node.names):
            return False
        out.update(a.asname or a.name for a in node.names)
    elif isinstance(node, (ast.If, ast.Try, ast.With, ast.For, ast.While)):
        blocks = [node.body, getattr(node, "orelse", []), getattr(node, "finalbody", [])]
        blocks += [h.body for h in getattr(node, "handlers", [])]
        return all(_bound(s, out) for block in blocks for s in block)
    elif isinstance(node, ast.Expr) and isinstance(node.value, ast.Call):
        return not (isinstance(node.value.func, ast.Attribute) and node.value.func.attr == "update")  # globals().update
    return True


def top_level_names(source: str) -> set[str] | None:
    """Names a module's source binds at import; None when they cannot be known statically (star import,
    module `__getattr__`). A SyntaxError propagates: the trainer's import would fail the same way."""
    tree = ast.parse(source)
    names: set[str] = set()
    return names if all(_bound(s, names) for s in tree.body) else None


def module_source(spec: ModuleSpec) -> str | None:
    origin = spec.origin
    if not origin or not origin.endswith(".py"):
        return None
    try:
        return specfiles.read_text(origin, specfiles.SOURCE_LIMIT)
    except (OSError, UnicodeDecodeError):
        return None
