"""The one exception type for mistakes a user can fix (config, missing packages, missing caches, hardware), and how
a trainer's failure is told.

Entry points print `str(err)` of a `TrainerSetupError` as one line and exit 2, without a traceback; everything else
is a bug or an environment failure and keeps its traceback, followed by one line naming the exception and where the
user's code raised it (`run_reporting`). That line is the job's "the trainer says: ..." and what `status` and
`report` quote: without it, the last error-looking line of the log is accelerate's `CalledProcessError`, which
restates only the exit status.
"""

from __future__ import annotations

import os
import sys
import sysconfig
import traceback
from collections.abc import Callable
from pathlib import Path
from types import TracebackType

import launchgen.trainers

import launchgen
from launchgen.shared.jobdir import EXIT_CONFIG, EXIT_FAILURE, TRAINER_ERROR_PREFIX


class TrainerSetupError(Exception):
    """A user-fixable problem; the message names the config field (or package) and the fix."""


def _library_roots() -> tuple[str, ...]:
    """Directories whose code is not the user's: the standard library, installed packages, launchgen itself."""
    paths = sysconfig.get_paths()
    roots = {paths["stdlib"], paths["platstdlib"], paths["purelib"], paths["platlib"],
             str(Path(launchgen.trainers.__file__).resolve().parent), str(Path(launchgen.__file__).resolve().parent)}
    return tuple(os.path.realpath(r) + os.sep for r in roots if r)


def _users_frame(tb: TracebackType | None) -> tuple[str, int] | None:
    """(file, line) of the innermost frame in the user's code; else of the innermost frame at all."""
    roots = _library_roots()
    frames = [(f.filename, f.lineno or 0) for f in traceback.extract_tb(tb)]
    mine = [f for f in frames if not f[0].startswith("<") and "-packages" + os.sep not in f[0]
            and not os.path.realpath(f[0]).startswith(roots)]
    found = (mine or frames)[-1:] if frames else []
    return found[0] if found else None


def failure_line(exc: BaseException) -> str:
    """`error: <Type>: <first line of the message> (<file>:<line>)`: the file relative to the working directory
    when it lies below it."""
    text = str(exc).strip()
    first = text.splitlines()[0] if text else ""
    what = type(exc).__name__ + (f": {first}" if first else "")
    where = _users_frame(exc.__traceback__)
    if where is not None:
        cwd = os.getcwd() + os.sep
        name = where[0].removeprefix(cwd).rpartition("-packages" + os.sep)[2]  # `transformers/trainer.py:N`
        what += f" ({name}:{where[1]})"
    return TRAINER_ERROR_PREFIX + what


def run_reporting(main: Callable[[], int]) -> int:
    """Run a trainer's entry: a `TrainerSetupError` is its one line and exit 2; another exception its traceback,
    then `failure_line`, and exit 1 (as Python's own exit for an uncaught exception)."""
    try:
        return main()
    except TrainerSetupError as e:
        print(f"{TRAINER_ERROR_PREFIX}{e}", file=sys.stderr, flush=True)
        return EXIT_CONFIG
    except Exception as e:
        traceback.print_exc()
        print(failure_line(e), file=sys.stderr, flush=True)
        return EXIT_FAILURE
