"""Scheduler differences are data (launchgen.script.schedulers), not template branches on the scheduler's name."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

from launchgen.script.schedulers import PROFILES, SchedulerProfile

ROOT = Path(__file__).resolve().parent.parent
TEMPLATES = sorted((ROOT / "templates").rglob("*.j2"))


def test_templates_never_compare_the_scheduler_name() -> None:
    # `sched` is the profile; a comparison with a name would put a scheduler decision back into a template
    compare = re.compile(r"""\bsched\s*(==|!=|\bin\b)|["'](sbatch|bash)["']\s*(==|!=)\s*sched\b""")
    hits = [f"{p.relative_to(ROOT)}:{i}" for p in TEMPLATES
            for i, line in enumerate(p.read_text().splitlines(), 1) if compare.search(line)]
    assert hits == []


def test_every_profile_field_is_read() -> None:
    # a field nothing reads is a decision that does not happen
    used = "\n".join(p.read_text() for p in TEMPLATES) + (ROOT / "launchgen" / "script" / "render.py").read_text()
    unread = [f.name for f in dataclasses.fields(SchedulerProfile) if f"sched.{f.name}" not in used]
    assert unread == []


def test_profiles_are_keyed_by_their_name() -> None:
    assert {k: p.name for k, p in PROFILES.items()} == {k: k for k in PROFILES}
