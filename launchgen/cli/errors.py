"""The one spelling of a verb's fatal error line, `launchgen: error: ...` on stderr with exit status 2, so every
verb reads alike in a log and a wrapper can grep one prefix. Kept apart from `common` so the job-side verbs
(`status`, `logs`, `report`) do not import the spec checks."""

from __future__ import annotations

import sys
from typing import NoReturn

import click

from launchgen.shared.textwidth import line_width, wrap
from launchgen.shared.visible import visible

EXIT_USAGE = 2  # the same status as a spec error: the command could not do what was asked


def fail(message: str) -> NoReturn:
    text = visible(f"launchgen: error: {message}")
    click.echo("\n".join(wrap(text, line_width(sys.stderr))), err=True)
    raise click.exceptions.Exit(EXIT_USAGE)
