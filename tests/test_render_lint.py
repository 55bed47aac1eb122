"""Every rendered script and every step script it embeds passes `bash -n` and shellcheck with no finding.

shellcheck runs at its default (style) severity; the templates carry only targeted disables, each with a reason.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from render_cases import EXAMPLES, SCHEDULERS, VARIANTS, plan_for, renderable
from tools import tool

from launchgen.script.render import render_script, render_steps

CASES = [(n, s) for n in [*EXAMPLES, *VARIANTS] for s in SCHEDULERS if renderable(n, s)]


def _files(name: str, scheduler: str) -> dict[str, str]:
    plan = plan_for(name)
    files = {"job": render_script(plan, scheduler)}  # type: ignore[arg-type]
    files.update(render_steps(plan, scheduler))  # type: ignore[arg-type]
    return files


@pytest.mark.parametrize(("name", "scheduler"), CASES)
def test_bash_n(tmp_path: Path, name: str, scheduler: str) -> None:
    for rel, text in _files(name, scheduler).items():
        path = tmp_path / rel.replace("/", "_")
        path.write_text(text)
        res = subprocess.run(["bash", "-n", str(path)], capture_output=True, text=True)
        assert res.returncode == 0, f"{name}/{scheduler}/{rel}: {res.stderr}"


@pytest.mark.parametrize(("name", "scheduler"), CASES)
def test_shellcheck_clean(tmp_path: Path, name: str, scheduler: str) -> None:
    paths = []
    for rel, text in _files(name, scheduler).items():
        path = tmp_path / rel.replace("/", "_")
        path.write_text(text)
        paths.append(str(path))
    res = subprocess.run([tool("shellcheck"), "--shell=bash", "--severity=style", *paths], capture_output=True,
                         text=True)
    assert res.returncode == 0, f"{name}/{scheduler}:\n{res.stdout}"


def test_no_blanket_shellcheck_disables() -> None:
    templates = Path(__file__).resolve().parent.parent / "templates"
    for path in templates.rglob("*.j2"):
        for line in path.read_text().splitlines():
            if "shellcheck disable" in line:
                assert "#" in line.split("shellcheck disable", 1)[1], f"{path.name}: disable without a reason: {line}"
                assert "=all" not in line.lower(), f"{path.name}: blanket disable: {line}"
