"""LG730 (`check --live`): a `slurm.setup` line sources a file that is not there (`source .venv/bin/activate`).

`set -e` stops the batch script at such a line, a second after the job starts, after the whole queue wait.
Setup lines run in the submit directory, so a relative file is looked up from the current directory. Only a
literal path is checked: one built from variables other than $HOME / ~ cannot be known before the job runs.
"""

from __future__ import annotations

import os
import re
import shlex
from collections.abc import Iterator
from pathlib import Path

from launchgen.checks.context import Ctx
from launchgen.checks.registry import _doc
from launchgen.shared.issues import Issue

_SOURCE_RE = re.compile(r"^\s*(?:source|\.)\s+(.+)$")

_doc("LG730", "error", "--live: a slurm.setup line sources a file that does not exist here.",
     "Create it first (e.g. python -m venv .venv) or fix the path; setup lines run in the submit directory.")


def sourced_file(line: str, home: str) -> str | None:
    """The literal file a `source FILE` / `. FILE` line reads, or None (not such a line, or not literal)."""
    m = _SOURCE_RE.match(line)
    if not m:
        return None
    try:
        words = shlex.split(m.group(1), comments=True)
    except ValueError:
        return None
    if not words or any(ch in m.group(1) for ch in ";&|`") or "$(" in words[0]:
        return None
    target = words[0].replace("${HOME}", home).replace("$HOME", home)
    if target == "~" or target.startswith("~/"):
        target = home + target[1:]
    return None if "$" in target or target.startswith("~") else target


def probe_setup(ctx: Ctx) -> Iterator[Issue]:
    home = ctx.env.get("HOME", os.path.expanduser("~"))
    for i, line in enumerate(ctx.spec.slurm.setup):
        target = sourced_file(line, home)
        if target is None:
            continue
        p = Path(target)
        if not p.is_file():
            yield ctx.issue("LG730", f"slurm.setup.{i}",
                            f"`{line.strip()}` sources {p if p.is_absolute() else f'{p} (= {Path.cwd() / p})'}, "
                            "which does not exist: the job would stop at this line right after it starts")
