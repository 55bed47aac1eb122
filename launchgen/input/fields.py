"""The value types of the spec's fields: one-line words, arguments, barewords, addresses, sizes, SLURM times.

Each is a pure function (raises ValueError with the words a user reads) wrapped as a pydantic `Annotated` type;
the section models in `launchgen.input.spec` use them, and `parse_time_limit` is read back by the checks.
"""

from __future__ import annotations

import ipaddress
import re
from typing import Annotated

from pydantic import AfterValidator

from launchgen.input import directives

# Patterns are applied with fullmatch: `$` alone lets a trailing newline through, which splits an #SBATCH line.
JOB_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
ENV_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
#: sbatch's --time forms: M, M:S, H:M:S, D-H, D-H:M, D-H:M:S
_TIME_RE = re.compile(r"(?P<days>\d+)-(?P<dh>\d+)(?::(?P<dm>\d+)(?::(?P<ds>\d+))?)?"
                      r"|(?P<a>\d+)(?::(?P<b>\d+)(?::(?P<c>\d+))?)?")
_HOSTNAME_RE = re.compile(r"(?=.{1,253}\Z)[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
                          r"(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*\.?")
_CONTROL_RE = re.compile(r"[\x00-\x1f\x7f-\x9f]")



def one_line(v: str) -> str:
    """No line breaks, tabs, escape sequences or other control characters (they corrupt the generated lines)."""
    m = _CONTROL_RE.search(v)
    if m:
        raise ValueError(f"must not contain control characters (found {m.group()!r} at position {m.start()})")
    return v


def argument(v: str) -> str:
    """A value that becomes one command-line word: one line, not empty, no surrounding blanks, no leading `-`
    (which the program would read as an option)."""
    one_line(v)
    if not v.strip():
        raise ValueError("must not be empty")
    if v != v.strip():
        raise ValueError("must not start or end with blanks")
    if v.startswith("-"):
        raise ValueError("must not start with `-` (it would be read as an option)")
    return v


def bareword(v: str) -> str:
    """An `argument` without any blank inside."""
    argument(v)
    if any(c.isspace() for c in v):
        raise ValueError("must not contain blanks")
    return v


def bind_address(v: str) -> str:
    """`node`, an IP address (IPv6 optionally in brackets) or a host name."""
    bareword(v)
    # an all-numeric name is meant as an IPv4 address, so it must be one
    if v == "node" or (_HOSTNAME_RE.fullmatch(v) and not re.fullmatch(r"[\d.]+", v)):
        return v
    try:
        ipaddress.ip_address(v[1:-1] if v.startswith("[") and v.endswith("]") else v)
    except ValueError:
        raise ValueError("must be `node`, an IP address or a host name") from None
    return v


def sbatch_value(v: str) -> str:
    """A value launchgen writes into an `#SBATCH` line: one line, no `$VAR` (sbatch never expands it)."""
    return directives.no_variables(one_line(v))


def _pattern(regex: str, what: str) -> AfterValidator:
    compiled = re.compile(regex)

    def check(v: str) -> str:
        if not compiled.fullmatch(v):
            raise ValueError(f"must be {what}")
        return v
    return AfterValidator(check)


def path_lengths(v: str) -> str:
    """Linux refuses a path component over 255 bytes and a path over 4095 ("File name too long") at run time."""
    if any(len(part.encode()) > 255 for part in v.split("/")) or len(v.encode()) > 4095:
        raise ValueError("has a path component longer than 255 bytes or is longer than 4095 bytes")
    return v


OneLine = Annotated[str, AfterValidator(one_line)]
SbatchValue = Annotated[str, AfterValidator(sbatch_value)]
Argument = Annotated[str, AfterValidator(argument)]
Bareword = Annotated[str, AfterValidator(bareword)]


def command(v: str | list[str]) -> str | list[str]:
    """A program as one bareword, or a list of words: the program a bareword, later words (`-m`, ...) one line."""
    if isinstance(v, str):
        return bareword(v)
    if not v:
        raise ValueError("must name a program: give at least one word")
    bareword(v[0])
    for word in v[1:]:
        one_line(word)
        if not word:
            raise ValueError("must not contain an empty word")
    return v


Command = Annotated[str | list[str], AfterValidator(command)]
GresType = Annotated[str, _pattern(r"[A-Za-z0-9][A-Za-z0-9_.-]*", "a GRES type name (letters, digits, `_`, `.`, `-`)")]
SlurmRelease = Annotated[str, _pattern(r"[0-9]{2}\.[0-9]{2}(\.[0-9]+)?", "a Slurm release such as `23.11` or `23.11.4`")]
MemSize = Annotated[str, _pattern(r"[0-9]+[KMGTkmgt]?", "a size sbatch reads: a number of MB, or with a K/M/G/T "
                                  "suffix (`0` = all of the node's memory)")]
Version = Annotated[str, _pattern(r"[0-9]+(?:\.[0-9]+){0,2}", "a version like `12.8`")]


class FixedValueError(ValueError):
    """A refused value whose fix is known from the value itself (`hints.value_fix` puts it in the Fix column)."""

    def __init__(self, message: str, fix: str) -> None:
        super().__init__(message)
        self.fix = fix


_UNIT_TIME = re.compile(r"\s*(\d+)\s*(d|day|days|h|hr|hrs|hour|hours|m|min|mins|minutes?)\s*", re.IGNORECASE)


def _time_fix(value: str) -> str:
    m = _UNIT_TIME.fullmatch(value)
    unit = m[2].lower()[0] if m else ""
    n = int(m[1]) if m else 0
    written = {"d": f"{n}-00:00:00", "h": f"{n}:00:00" if n < 24 else f"{n // 24}-{n % 24:02d}:00:00",
               "m": f"{n}"}.get(unit)
    if written is not None:
        return f"Write `time: \"{written}\"` (SLURM reads D-HH:MM:SS, HH:MM:SS or minutes, with no unit letters)."
    return "Write it as SLURM reads it: `\"04:00:00\"` (HH:MM:SS), `\"1-00:00:00\"` (D-HH:MM:SS) or minutes (`240`)."


def parse_time_limit(value: str) -> int:
    """SLURM time -> seconds, read as sbatch reads it: `M`, `M:S`, `H:M:S`, `D-H`, `D-H:M`, `D-H:M:S`."""
    m = _TIME_RE.fullmatch(value)
    if not m:
        raise FixedValueError(f"{value!r} is not a SLURM time limit (use HH:MM:SS, D-HH:MM:SS or minutes)",
                              _time_fix(value))
    if m["days"] is not None:
        days, hours, minutes, seconds = (int(g or 0) for g in (m["days"], m["dh"], m["dm"], m["ds"]))
    else:
        parts = [int(g) for g in (m["a"], m["b"], m["c"]) if g is not None]
        days = 0
        hours, minutes, seconds = {1: (0, parts[0], 0), 2: (0, *parts), 3: tuple(parts)}[len(parts)]
    return ((days * 24 + hours) * 60 + minutes) * 60 + seconds
