"""What users see when something is wrong: an Issue with a stable code, the field path, the YAML line and a fix.

Codes are stable API: scripts and CI grep for them, and the README lists each one. Never renumber; retire.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from launchgen.shared.textwidth import INDENT, wrap
from launchgen.shared.visible import visible

Severity = Literal["error", "warning", "info"]


@dataclass(frozen=True)
class Issue:
    code: str  # e.g. "LG201"
    path: str  # dotted field path, e.g. "vllm.tensor_parallel_size"
    message: str  # what is wrong, one sentence
    fix: str = ""  # how to fix it, one sentence
    severity: Severity = "error"
    line: int | None = None  # 1-based line in the spec file, when known
    file: str | None = None

    def located(self, file: str | None, line: int | None) -> Issue:
        return Issue(self.code, self.path, self.message, self.fix, self.severity, line, file)

    def format(self) -> str:
        """The whole issue on one line (what `SpecError` carries; `lines` is what a person reads)."""
        head, message, fix = self._parts()
        return " ".join(p for p in (head, message, fix) if p)

    def lines(self, width: int) -> list[str]:
        """The issue as printed: one line when it fits in `width`; else the first line is `file:line: severity
        CODE [field]` (never broken: grep finds the code there) and as much of the message as fits, the rest of
        the message wrapped at word boundaries and the fix on lines of its own, every later line indented."""
        one = self.format()
        if len(one) <= width:
            return [one]
        head, message, fix = self._parts()
        out = [ln.rstrip() for ln in wrap(message, width, first=head + " ")]
        return out + (wrap(fix, width, first=INDENT) if fix else [])

    def _parts(self) -> tuple[str, str, str]:
        where = self.file or "<spec>"
        if self.line is not None:
            where = f"{where}:{self.line}"
        # a file-level problem (not YAML, too large) has no field: no empty `[]`
        field = f" [{self.path}]" if self.path else ""
        # nothing from the spec (a key, a value) may drive the terminal
        return (visible(f"{where}: {self.severity} {self.code}{field}"), visible(self.message),
                visible(f"Fix: {self.fix}") if self.fix else "")


@dataclass
class SpecError(Exception):
    """Raised when a spec cannot be loaded or planned; carries every issue found, not just the first."""

    issues: list[Issue] = field(default_factory=list)

    def __str__(self) -> str:
        return "\n".join(i.format() for i in self.issues)
