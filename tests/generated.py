"""Generated files: a test compares each with what its generator gives now, and `LAUNCHGEN_UPDATE_GOLDEN=1`
makes the same test write it instead, so every generated file has one command that regenerates it (the table in
docs/architecture.md, "Generated files")."""

from __future__ import annotations

import os
from pathlib import Path

UPDATE = os.environ.get("LAUNCHGEN_UPDATE_GOLDEN") == "1"


def check_generated(path: Path, want: str, command: str, *, begin: str | None = None, end: str | None = None) -> None:
    """`path` is `want`; or, with `begin` and `end`, its text from the `begin` line up to the `end` line is. The
    markers are the generator's first line and a line after its block, so a regenerated block replaces the old one
    whatever its length."""
    text = path.read_text()
    start, stop = 0, len(text)
    if begin is not None and end is not None:
        assert begin in text and end in text, f"{path} lost its generated-block markers ({begin!r} ... {end!r})"
        start, stop = text.index(begin), text.index(end)
    if text[start:stop] != want and UPDATE:
        path.write_text(text[:start] + want + text[stop:])
        return
    assert text[start:stop] == want, f"{path} is stale: regenerate it with `{command}`"
