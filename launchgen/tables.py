"""Text and rich tables that stay readable at any width, in a terminal and in a pipe.

The width is the console's: the terminal's, or `COLUMNS` when it is set (in a pipe too), else 80 in a pipe
(`console()`; rich reads `COLUMNS` itself). Rich squeezes a table that is wider than that by wrapping cells
and then cutting or folding words, which breaks paths and commands mid-word. Here a table is drawn only when
it fits; otherwise each row is printed as whole `column: value` items (`print_table`), or in a layout the
caller gives (`compact=`, e.g. the GPU map's runs of GPUs), wrapped between items, never inside one unless an
item alone is wider than the line, and then at its spaces. A word longer than the line (a path) is never
split: it overflows instead, so it can still be copied.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache
from typing import IO

from rich.cells import cell_len
from rich.console import Console
from rich.measure import Measurement
from rich.table import Table
from rich.text import Text

from launchgen.shared.textwidth import wrap
from launchgen.shared.visible import visible

#: between the items of a record
SEP = "; "


def console(file: IO[str] | None = None) -> Console:
    """The console tables are printed on: the terminal's width, `COLUMNS` when set, else 80 (a pipe)."""
    return Console(file=file)


def wrap_items(items: Sequence[str], width: int, first: str = "", indent: str = "    ") -> list[str]:
    """`first` then the items joined by `; `, a line break only between two items; an item wider than a line
    on its own is broken at its spaces."""
    width = max(width, 20)
    lines: list[str] = []
    line = first
    for n, item in enumerate(items):
        piece = item + (SEP.rstrip() if n < len(items) - 1 else "")
        fresh = line in (first, indent)
        candidate = line + ("" if fresh else " ") + piece
        if len(candidate) <= width or fresh:
            line = candidate
        else:
            lines.append(line)
            line = indent + piece
    lines.append(line)
    out: list[str] = []
    for ln in lines:
        if len(ln) <= width:
            out.append(ln)
        else:  # one item wider than the line
            lead = ln[: len(ln) - len(ln.lstrip())]
            out += wrap(ln.lstrip(), width, indent) if not lead else [
                lead + w.lstrip() for w in wrap(ln.lstrip(), width - len(lead), "  ")]
    return out


def _write(console: Console, line: str) -> None:
    """A plain line, as is: it is already wrapped, and `visible` made its control characters escapes."""
    console.file.write(line + "\n")


def print_text(console: Console, text: str, indent: str = "    ") -> None:
    """One logical line, wrapped at word boundaries to the console's width; control characters (from a spec
    or a log) are shown as escapes, never sent to the terminal."""
    for line in wrap(visible(text), console.width, indent):
        _write(console, line)


def print_items(console: Console, items: Sequence[str], first: str = "", indent: str = "    ") -> None:
    """A record of whole items (`wrap_items`), with control characters shown as escapes."""
    for line in wrap_items([visible(i) for i in items], console.width, visible(first), indent):
        _write(console, line)


def natural_width(table: Table) -> int:
    """The width rich draws `table` at when nothing limits it: its widest plain cell per column (header
    included), the cells' padding and the box's rules. Counted from the text: rich's own measurement of a
    64-node plan's tables takes most of `plan`'s run time (tests/test_tables_width.py checks they agree)."""
    left, right = table.padding[3], table.padding[1]
    width = 0
    for col in table.columns:
        cells = [plain_text(col.header), *(plain_text(c) for c in col.cells)]
        width += max((max((cell_len(line) for line in c.split("\n")), default=0) for c in cells), default=0)
        width += left + right
    rules = 0
    if table.box is not None:  # a rule between columns, and one at each edge
        rules = len(table.columns) - 1 + (2 if table.show_edge else 0)
    return width + rules


def measured_width(console: Console, table: Table) -> int:
    """rich's own measurement (without the console's limit, which rich would clamp it to)."""
    return Measurement.get(console, console.options.update_width(1 << 16), table).maximum


def fits(console: Console, table: Table) -> bool:
    """Drawn at its natural width."""
    return natural_width(table) <= console.width


def plain_text(cell: object) -> str:
    """A cell's text as drawn: a `Text`'s plain text, a string without its markup (parsed once per string)."""
    if isinstance(cell, Text):
        return cell.plain
    if isinstance(cell, str):
        return _markup_plain(cell) if "[" in cell else cell
    return str(cell)


@lru_cache(maxsize=4096)
def _markup_plain(cell: str) -> str:
    """A cell's text without its rich markup (parsing markup was most of a 64-node plan's printing)."""
    return Text.from_markup(cell).plain


def record_items(table: Table) -> list[list[str]]:
    """Each row as its `header: value` items (empty cells left out)."""
    headers = [plain_text(c.header) for c in table.columns]
    columns = [[plain_text(cell) for cell in c.cells] for c in table.columns]
    return [[f"{h}: {v}" for h, v in zip(headers, row, strict=True) if v.strip()]
            for row in zip(*columns, strict=True)]


def records(table: Table) -> list[str]:
    """Each row as `header: value; ...` (empty cells left out)."""
    return [SEP.join(items) for items in record_items(table)]


def print_table(console: Console, table: Table, *, records_only: bool = False,
                compact: Sequence[Sequence[str]] | None = None) -> None:
    """The table when it fits the console (and records are not asked for), else its title and one record a
    row: `compact`'s items when the caller has a narrower layout for this table, else `header: value` items."""
    if not records_only and fits(console, table):
        console.print(table)
        return
    if table.title:
        print_text(console, f"{plain_text(table.title)}:")
    for items in compact if compact is not None else record_items(table):
        print_items(console, list(items), first="  - ", indent="      ")
