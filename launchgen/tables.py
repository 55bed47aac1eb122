"""Text and rich tables that stay readable at any width and in pipes.

Rich squeezes a table that is wider than the console by wrapping cells and then cutting or folding words, which
breaks paths and commands mid-word. Here a table is drawn only when it fits; otherwise it is printed one record
a line (`column: value; ...`), wrapped at word boundaries. A word longer than the line (a path) is never split:
it overflows instead, so it can still be copied.
"""

from __future__ import annotations

import textwrap

from rich.console import Console
from rich.measure import Measurement
from rich.table import Table
from rich.text import Text

from launchgen.visible import visible


def wrap(text: str, width: int, indent: str = "    ") -> list[str]:
    return textwrap.wrap(text, width=max(width, 20), subsequent_indent=indent, break_long_words=False,
                         break_on_hyphens=False) or [""]


def print_text(console: Console, text: str, indent: str = "    ") -> None:
    """One logical line, wrapped at word boundaries to the console's width; control characters (from a spec
    or a log) are shown as escapes, never sent to the terminal."""
    for line in wrap(visible(text), console.width, indent):
        console.print(line, markup=False, highlight=False, soft_wrap=True)


def fits(console: Console, table: Table) -> bool:
    """Drawn at its natural width (measured without the console's limit, which rich would clamp it to)."""
    natural = Measurement.get(console, console.options.update_width(1 << 16), table).maximum
    return natural <= console.width


def _plain(cell: object) -> str:
    if isinstance(cell, Text):
        return cell.plain
    return Text.from_markup(cell).plain if isinstance(cell, str) else str(cell)


def records(table: Table) -> list[str]:
    """Each row as `header: value; ...` (empty cells left out)."""
    headers = [_plain(c.header) for c in table.columns]
    columns = [[_plain(cell) for cell in c.cells] for c in table.columns]
    out = []
    for row in zip(*columns, strict=True):
        out.append("; ".join(f"{h}: {v}" for h, v in zip(headers, row, strict=True) if v.strip()))
    return out


def print_table(console: Console, table: Table, *, records_only: bool = False) -> None:
    """The table when it fits the console (and records are not asked for), else its title and one record a line."""
    if not records_only and fits(console, table):
        console.print(table)
        return
    if table.title:
        print_text(console, f"{_plain(table.title)}:")
    for rec in records(table):
        print_text(console, f"  - {rec}", indent="      ")
