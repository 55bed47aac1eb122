"""The check registry: `@check(codes..., stage=)` registers a function, `_doc` documents a code.

Every module that holds checks (`launchgen/checks/spec/`, `launchgen/checks/files/`, `launchgen/checks/live/`)
registers into these two tables; `launchgen.checks.run_checks` runs them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from launchgen.issues import Issue, Severity

if TYPE_CHECKING:
    from launchgen.checks.context import Ctx


# --- registry ---------------------------------------------------------------------------------------------

#: `files` checks read what the spec names on disk; only `check` runs them (see launchgen.checks.files).
Stage = Literal["spec", "plan", "files"]


@dataclass(frozen=True)
class CodeDoc:
    code: str
    severity: Severity  # the most severe level the code is reported at
    title: str
    fix: str


@dataclass(frozen=True)
class Check:
    name: str
    codes: tuple[str, ...]
    stage: Stage
    fn: Callable[[Ctx], Iterable[Issue]]


CHECKS: list[Check] = []
#: Every code launchgen reports, for `docs/check-codes.md` and the tests. The loader's and the plan's codes
#: are documented here too so the list is complete.
CODES: dict[str, CodeDoc] = {}


def _doc(code: str, severity: Severity, title: str, fix: str) -> None:
    CODES[code] = CodeDoc(code, severity, title, fix)


def check(*codes: str, stage: Stage = "spec") -> Callable[[Callable[[Ctx], Iterable[Issue]]],
                                                         Callable[[Ctx], Iterable[Issue]]]:
    def deco(fn: Callable[[Ctx], Iterable[Issue]]) -> Callable[[Ctx], Iterable[Issue]]:
        for c in codes:
            if c not in CODES:
                raise ValueError(f"check {fn.__name__}: code {c} has no CodeDoc")
        CHECKS.append(Check(fn.__name__, codes, stage, fn))
        return fn
    return deco
