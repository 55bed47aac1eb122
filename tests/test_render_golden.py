"""Golden files: every example x scheduler renders exactly to tests/golden/<example>.<scheduler>.sh.

A change to the templates or the plan shows up as a diff here; review it like code. To accept it:
    LAUNCHGEN_UPDATE_GOLDEN=1 python -m pytest tests/test_render_golden.py
"""

from __future__ import annotations

import difflib
import os
from pathlib import Path

import pytest
from render_cases import EXAMPLES, SCHEDULERS, plan_for, renderable

from launchgen.script.render import render_script
from launchgen.shared.issues import SpecError

GOLDEN = Path(__file__).parent / "golden"
UPDATE = os.environ.get("LAUNCHGEN_UPDATE_GOLDEN") == "1"
CASES = [(e, s) for e in EXAMPLES for s in SCHEDULERS]


@pytest.mark.parametrize(("example", "scheduler"), CASES)
def test_golden(example: str, scheduler: str) -> None:
    golden = GOLDEN / f"{example}.{scheduler}.sh"
    if not renderable(example, scheduler):
        with pytest.raises(SpecError) as exc:
            render_script(plan_for(example), scheduler)  # type: ignore[arg-type]
        assert [i.code for i in exc.value.issues] in (["LG909"], ["LG254"])  # several nodes; pyxis needs srun
        assert not golden.exists(), f"{golden} is stale: this layout cannot render for --bash"
        return
    text = render_script(plan_for(example), scheduler)  # type: ignore[arg-type]
    if UPDATE:
        GOLDEN.mkdir(exist_ok=True)
        golden.write_text(text)
    assert golden.exists(), f"{golden} is missing; create it with LAUNCHGEN_UPDATE_GOLDEN=1 and review it"
    expected = golden.read_text()
    if text != expected:
        diff = "".join(difflib.unified_diff(expected.splitlines(True), text.splitlines(True),
                                            str(golden), "rendered", n=2))
        pytest.fail(f"rendered script differs from {golden.name} (if intended, regenerate with "
                    f"LAUNCHGEN_UPDATE_GOLDEN=1 and review the diff):\n{diff[:6000]}")


def test_no_orphan_golden_files() -> None:
    expected = {f"{e}.{s}.sh" for e, s in CASES if renderable(e, s)}
    assert {p.name for p in GOLDEN.glob("*.sh")} == expected


def test_render_is_deterministic() -> None:
    for example in EXAMPLES:
        assert render_script(plan_for(example), "sbatch") == render_script(plan_for(example), "sbatch")
