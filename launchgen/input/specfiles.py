"""Reading a file the spec names (accelerate/DeepSpeed configs, a local model's config.json, a reward module, the
data file `check` peeks at): only a regular file, and only up to a bound.

A spec is untrusted input, and so are the paths in it: `/dev/zero` read whole takes all memory, a FIFO blocks
`check` forever, `/dev/tty` waits for a key. Every read of a spec-named file goes through here, so the rule has one
owner: the file is opened without blocking (O_NONBLOCK: a FIFO with no writer opens at once instead of hanging),
must be a regular file by fstat of that same descriptor (no race between a stat and the open), and at most
`limit` bytes are read (one more tells a file over the limit from one at it).
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

#: A config file (accelerate YAML, DeepSpeed JSON, a model's config.json) larger than this is not one.
CONFIG_LIMIT = 4 << 20
#: A reward module's source, read to list the names it binds.
SOURCE_LIMIT = 8 << 20


class NotAFile(OSError):
    """The path names something other than a regular file, or one over the limit; the message says which."""


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"), (stat.S_ISDIR, "a directory")):
        if test(mode):
            return name
    return "not a regular file"


def check_regular(path: str | Path) -> None:
    """Raise NotAFile unless `path` (symlinks followed) is a regular file; OSError when it cannot be stat'ed."""
    st = os.stat(Path(path).expanduser())
    if not stat.S_ISREG(st.st_mode):
        raise NotAFile(f"{path} is {_kind(st.st_mode)}, not a regular file")


def read_bytes(path: str | Path, limit: int = CONFIG_LIMIT) -> bytes:
    """The bytes of a regular file of at most `limit` bytes; NotAFile otherwise (OSError when it cannot be read)."""
    p = Path(path).expanduser()
    fd = os.open(p, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | getattr(os, "O_CLOEXEC", 0))
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise NotAFile(f"{path} is {_kind(st.st_mode)}, not a regular file")
        if st.st_size > limit:
            raise NotAFile(f"{path} is {st.st_size} bytes; more than {limit >> 20} MiB is not a file of this kind")
        chunks: list[bytes] = []
        left = limit + 1
        while left > 0:
            chunk = os.read(fd, min(left, 1 << 20))
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
        data = b"".join(chunks)
    finally:
        os.close(fd)
    if len(data) > limit:  # it grew after the fstat
        raise NotAFile(f"{path} is more than {limit >> 20} MiB; not a file of this kind")
    return data


def read_text(path: str | Path, limit: int = CONFIG_LIMIT) -> str:
    """`read_bytes` decoded as UTF-8 (UnicodeDecodeError, a ValueError, when it is not)."""
    return read_bytes(path, limit).decode("utf-8")
