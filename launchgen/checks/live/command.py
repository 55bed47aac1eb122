"""Running one `check --live` probe: a command with a hard timeout (`run_command`), its `Result`, `ProbeSkipped`."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
from collections.abc import Callable
from dataclasses import dataclass

PROBE_TIMEOUT = 10.0


@dataclass(frozen=True)
class Result:
    returncode: int
    stdout: str
    stderr: str = ""


class ProbeSkipped(Exception):
    """The probe could not run; the message says why."""


#: (argv, timeout seconds) -> Result; raises ProbeSkipped when the command is missing or times out.
Runner = Callable[[list[str], float], Result]


def run_command(argv: list[str], timeout: float) -> Result:
    """Run a probe with a hard timeout; the whole process group is killed so no grandchild keeps a pipe open."""
    if shutil.which(argv[0]) is None:
        raise ProbeSkipped(f"`{argv[0]}` is not on PATH")
    try:
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL,
                                text=True, start_new_session=True)
    except OSError as exc:
        raise ProbeSkipped(f"`{argv[0]}` could not run: {exc.strerror}") from None
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        raise ProbeSkipped(f"`{' '.join(argv)}` did not answer within {timeout:g} s") from None
    return Result(proc.returncode, out, err)
