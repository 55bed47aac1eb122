"""`launchgen logs --follow`: print a log as it grows, like `tail -F`, until the job is over.

The job's state is asked for again every few seconds (the scheduler, or a local run's events): when a requeued
job starts a new attempt, following moves to the same role's log of that attempt; when the job is over, what
is left in the file is printed and following ends. A truncated or replaced file is read again from its start.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from launchgen.readback.jobfiles import last_lines_start

POLL_S = 0.5
STATE_EVERY_S = 5.0


@dataclass
class Target:
    """What to follow now, as the job's state says: the log (None while it does not exist yet) and whether the
    job is over."""

    path: str | None
    over: bool


class _Reader:
    def __init__(self, path: str, emit: Callable[[str], None]) -> None:
        self.path, self.emit = path, emit
        self.pos, self.partial = 0, b""
        self.inode: int | None = None

    def start_at_last_lines(self, n: int) -> None:
        """Begin where the last `n` lines begin (0: the whole file), so nothing is lost between them and what
        follows."""
        self.pos = 0
        try:
            with open(self.path, "rb") as fh:
                self.inode = Path(self.path).stat().st_ino
                self.pos = last_lines_start(fh, n)
        except OSError:
            return

    def read(self) -> None:
        try:
            st = Path(self.path).stat()
        except OSError:
            return
        if st.st_ino != self.inode or st.st_size < self.pos:  # replaced or truncated: start again
            self.pos, self.partial, self.inode = 0, b"", st.st_ino
        if st.st_size == self.pos:
            return
        with open(self.path, "rb") as fh:
            fh.seek(self.pos)
            data = fh.read(st.st_size - self.pos)
        self.pos += len(data)
        *lines, self.partial = (self.partial + data).split(b"\n")
        for line in lines:
            self.emit(line.decode("utf-8", errors="replace"))

    def flush(self) -> None:
        if self.partial:
            self.emit(self.partial.decode("utf-8", errors="replace"))
            self.partial = b""


def follow(first: Target, state: Callable[[], Target], emit: Callable[[str], None], note: Callable[[str], None],
           lines: int, poll_s: float = POLL_S, state_every_s: float = STATE_EVERY_S,
           sleep: Callable[[float], None] = time.sleep) -> None:
    """Print the last `lines` lines of `first.path` (0: all), then what is appended, until `state()` says the job
    is over; a log of a later attempt (or one that appears late) is printed from its start."""
    reader = _Reader(first.path, emit) if first.path else None
    if reader is not None:
        reader.start_at_last_lines(lines)
    elif not first.over:
        note("waiting for the log to appear (the job has not started this role yet)")
    target, last_state = first, time.monotonic()
    while True:
        if reader is not None:
            reader.read()
        if target.over:
            if reader is not None:
                reader.flush()
            return
        sleep(poll_s)
        if time.monotonic() - last_state >= state_every_s:
            last_state = time.monotonic()
            target = state()
            if target.path and (reader is None or target.path != reader.path):
                if reader is not None:
                    reader.read()
                    reader.flush()
                note(f"now following {target.path}")
                reader = _Reader(target.path, emit)
