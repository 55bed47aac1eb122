"""Text from a spec or a log, made safe to print on a terminal: control characters become visible escapes.

A spec value or a log line can hold escape sequences (`\\x1b]0;...`, `\\x1b[2J`) that retitle, clear or rewrite the
user's terminal, and bidirectional-override characters that make a line read differently from what it is. Every
human-facing output (check messages, the plan view, status) passes user-derived text through `visible`; JSON
output needs nothing (json.dumps escapes control characters itself).
"""

from __future__ import annotations

import re

#: C0 controls but tab, DEL, C1 controls, and the Unicode bidi embeddings/overrides/isolates and marks.
_UNSAFE = re.compile("[\x00-\x08\x0a-\x1f\x7f-\x9f\u200e\u200f\u202a-\u202e\u2066-\u2069]")
_NAMED = {"\n": "\\n", "\r": "\\r"}


def _escape(m: re.Match[str]) -> str:
    c = m.group()
    if c in _NAMED:
        return _NAMED[c]
    return f"\\x{ord(c):02x}" if ord(c) < 0x100 else f"\\u{ord(c):04x}"


def visible(text: str) -> str:
    """`text` with every terminal-controlling character written as an escape (`\\x1b`, `\\n`, `\\u202e`)."""
    return _UNSAFE.sub(_escape, text)
