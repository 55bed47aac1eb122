"""The codes table: `_doc(code, severity, title, fix)` documents a code once, beside the check that reports it.

`Ctx.issue` reads a code's severity and fix here, `registry.check` refuses a code without a doc, and
`runner.codes_markdown` generates `docs/check-codes.md` from it. The loader's and the plan's codes are documented
here too, so the list is complete.
"""

from __future__ import annotations

from dataclasses import dataclass

from launchgen.shared.issues import Severity


@dataclass(frozen=True)
class CodeDoc:
    code: str
    severity: Severity  # the most severe level the code is reported at
    title: str
    fix: str


#: Every code launchgen reports, for `docs/check-codes.md` and the tests.
CODES: dict[str, CodeDoc] = {}


def _doc(code: str, severity: Severity, title: str, fix: str) -> None:
    CODES[code] = CodeDoc(code, severity, title, fix)
