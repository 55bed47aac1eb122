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


#: ECMA-48 sequences a program writes into its log: CSI (colours, cursor moves: ESC [ or C1 0x9b, parameters, a final
#: byte), the string controls OSC/DCS/SOS/PM/APC (terminal title, OSC 52 clipboard writes, hyperlinks: ESC ] P X
#: ^ _ or their C1 forms, up to BEL or ST, or to the end of the line when unterminated) and two-byte escapes.
_SEQUENCE = re.compile(r"(?:\x1b\[|\x9b)[0-?]*[ -/]*[@-~]?"
                       r"|(?:\x1b[\]PX^_]|[\x90\x98\x9d\x9e\x9f])[^\x07\x1b\x9c]*(?:\x07|\x1b\\|\x9c)?"
                       r"|\x1b[ -/]*[0-~]?")


def log_line(line: str) -> str:
    """One line of a log as the terminal would end up showing it, with nothing left that drives the terminal:
    escape sequences removed (a colour is lost, a title or clipboard write never happens), a progress bar's
    carriage returns resolved to the last text written, any other control character made visible."""
    text = _SEQUENCE.sub("", line)
    if "\r" in text:
        text = next((part for part in reversed(text.split("\r")) if part), "")
    return visible(text)
