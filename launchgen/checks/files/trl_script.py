"""LG922-LG923 (files stage): `train.script` exists, and its source shows a TrlParser / HfArgumentParser (else the
job passes launchgen's values as LAUNCHGEN_TRL_* variables only). The codes are documented in
`launchgen.checks.spec.trl`; a module name (no `.py`) is looked up on the nodes, not here."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from launchgen.checks.context import Ctx
from launchgen.checks.registry import check
from launchgen.input import specfiles
from launchgen.shared.issues import Issue

#: launchgen.trainers.trl.script.ARG_PARSERS (that module imports torch)
_PARSERS = ("TrlParser", "HfArgumentParser")


@check("LG922", "LG923", stage="files")
def script_exists_and_parses_flags(ctx: Ctx) -> Iterator[Issue]:
    script = ctx.spec.train.script
    if script is None or not script.endswith(".py"):
        return
    path = Path(script)
    if not path.exists():
        yield ctx.issue("LG922", "train.script", f"train.script {script} does not exist (looked in {Path.cwd()})")
        return
    try:
        source = specfiles.read_text(path, specfiles.SOURCE_LIMIT)
    except (OSError, UnicodeDecodeError) as e:
        yield ctx.issue("LG922", "train.script", f"train.script {script} cannot be read: {e}")
        return
    if not any(p in source for p in _PARSERS):
        yield ctx.issue("LG923", "train.script",
                        f"{script} shows no TrlParser or HfArgumentParser: the job passes launchgen's values as "
                        "LAUNCHGEN_TRL_* environment variables only")
