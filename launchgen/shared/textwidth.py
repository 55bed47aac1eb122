"""How wide a line printed for a person may be, and wrapping to that width (stdlib only: `check` imports it).

The width is `COLUMNS` when it is set (a user's override, in a pipe too), else the terminal's when the stream is
one, else 80: a pipe, a file or CI's log is read at 80 columns. Wrapping breaks between words only: a word longer
than the line (a path, a URL) overflows whole, so it can still be copied; hyphenated names stay in one piece.
"""

from __future__ import annotations

import os
import textwrap
from typing import IO

#: a pipe, a file, CI's log
DEFAULT_WIDTH = 80
#: no narrower, however small the terminal says it is: a code and its field stay on the first line
MIN_WIDTH = 40
#: a wrapped message's later lines
INDENT = "    "


def line_width(stream: IO[str] | None = None) -> int:
    columns = os.environ.get("COLUMNS", "")
    if columns.isdigit() and int(columns) > 0:
        return max(MIN_WIDTH, int(columns))
    try:
        if stream is not None and stream.isatty():
            return max(MIN_WIDTH, os.get_terminal_size(stream.fileno()).columns)
    except (OSError, ValueError):  # closed, or not a real file (pytest's capture)
        pass
    return DEFAULT_WIDTH


def wrap(text: str, width: int, indent: str = INDENT, first: str = "") -> list[str]:
    """`text` as lines of at most `width` columns (but for a word longer than that), the first starting with
    `first`, the others with `indent`."""
    return textwrap.wrap(text, width=max(width, 20), initial_indent=first, subsequent_indent=indent,
                         break_long_words=False, break_on_hyphens=False) or [first]
