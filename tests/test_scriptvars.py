"""The script variables have one owner (`launchgen.script.scriptvars`): a template or a rendered script that uses an
`LG_*` / `LAUNCHGEN_*` name the owner does not declare fails here, and so does a declaration nothing uses."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from render_cases import EXAMPLES, SCHEDULERS, VARIANTS, plan_for, renderable

from launchgen.script import scriptvars as V
from launchgen.script.render import render_script

ROOT = Path(__file__).resolve().parents[1]
NAME = re.compile(r"\b(?:LG|LAUNCHGEN)_[A-Z0-9_]*[A-Z0-9]")
CASES = [(n, s) for n in [*EXAMPLES, *VARIANTS] for s in SCHEDULERS if renderable(n, s)]


def _undeclared(text: str) -> set[str]:
    out = set()
    for name in NAME.findall(text):
        if name == V.PY_HEREDOC or name.startswith(V.EOF_PREFIX):
            continue
        if V.base_name(name) not in V.VARS:
            out.add(name)
    return out


def test_the_templates_use_only_declared_variables() -> None:
    found = {p.relative_to(ROOT).as_posix(): _undeclared(p.read_text()) for p in (ROOT / "templates").rglob("*.j2")}
    assert {k: v for k, v in found.items() if v} == {}


@pytest.mark.parametrize(("name", "sched"), CASES, ids=[f"{n}-{s}" for n, s in CASES])
def test_a_rendered_script_uses_only_declared_variables(name: str, sched: str) -> None:
    """What Python puts into the script (ports' variables, a plan's `Ref`s, replica copies) counts too."""
    assert _undeclared(render_script(plan_for(name), sched)) == set()


def test_every_declared_variable_is_used() -> None:
    used: set[str] = set()
    for p in (ROOT / "templates").rglob("*.j2"):
        used |= {V.base_name(n) for n in NAME.findall(p.read_text())}
    for name, sched in CASES:
        used |= {V.base_name(n) for n in NAME.findall(render_script(plan_for(name), sched))}
    for pkg in ("launchgen", "trainers"):  # read by the trainers or launchgen.jobside.rank through the constant
        for p in (ROOT / pkg).rglob("*.py"):
            if p.name != "scriptvars.py":
                used |= {V.VARS[n].name for n in re.findall(r"\bV\.([A-Z0-9_]+)\b", p.read_text()) if n in V.VARS}
    assert set(V.VARS) - used == set()


def test_a_constant_is_its_own_name() -> None:
    """`LG_JOB_DIR = _var("LG_JOB_DIR", ...)`: the Python name and the shell name cannot drift apart."""
    for attr in dir(V):
        value = getattr(V, attr)
        if attr.startswith("LG_") and isinstance(value, str):
            assert value == attr and value in V.VARS
    assert all(name == v.name for name, v in V.VARS.items())
