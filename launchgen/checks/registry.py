"""The check registry: `@check(codes..., stage=)` registers a function (`_doc`, which documents a code, is
`codes.py`'s, re-exported here for the check modules).

Every module that holds checks (`launchgen/checks/spec/`, `launchgen/checks/files/`, `launchgen/checks/live/`)
registers into these two tables; `launchgen.checks.run_checks` runs them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from launchgen.checks.codes import CODES, CodeDoc, _doc
from launchgen.shared.issues import Issue

if TYPE_CHECKING:
    from launchgen.checks.context import Ctx

__all__ = ["CHECKS", "CODES", "Check", "CodeDoc", "Stage", "_doc", "check"]


# --- registry ---------------------------------------------------------------------------------------------

#: `files` checks read what the spec names on disk; only `check` runs them (see launchgen.checks.files).
Stage = Literal["spec", "plan", "files"]


@dataclass(frozen=True)
class Check:
    name: str
    codes: tuple[str, ...]
    stage: Stage
    fn: Callable[[Ctx], Iterable[Issue]]


CHECKS: list[Check] = []


def check(*codes: str, stage: Stage = "spec") -> Callable[[Callable[[Ctx], Iterable[Issue]]],
                                                         Callable[[Ctx], Iterable[Issue]]]:
    def deco(fn: Callable[[Ctx], Iterable[Issue]]) -> Callable[[Ctx], Iterable[Issue]]:
        for c in codes:
            if c not in CODES:
                raise ValueError(f"check {fn.__name__}: code {c} has no CodeDoc")
        CHECKS.append(Check(fn.__name__, codes, stage, fn))
        return fn
    return deco
