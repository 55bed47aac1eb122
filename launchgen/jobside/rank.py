"""Run one trainer rank for a rendered job: `python -m launchgen.jobside.rank MODULE ARGS...` (what `accelerate launch -m`
starts on every process).

It runs `python -m MODULE ARGS...` as a child and records, per rank, what the job script needs and cannot learn
through `accelerate launch`:

* `$LAUNCHGEN_PID_DIR/$LAUNCHGEN_NODE_NAME/rank<RANK>.pid`: the trainer's PID, so the script can send it the
  pre-timeout USR2 directly (`accelerate launch` runs with USR2 ignored: it neither forwards it nor survives it);
* `.../rank<RANK>.exit`: the trainer's exit status (128+N for signal N), since `accelerate launch` reports any
  failed child as 1 and the job must exit with the trainer's own status (e.g. 75 = checkpointed, requeue me).

A trainer that checkpointed on a signal and exits `EXIT_PREEMPTED` (75) is reported to `accelerate launch` as 0
when the exit file is written: accelerate would otherwise print a `CalledProcessError` traceback for a clean stop,
and the job script reads the 75 from the exit file anyway.

TERM, INT and HUP are passed on to the trainer. Without LAUNCHGEN_PID_DIR (run by hand) it only runs MODULE.
Standard library only: it must not slow the trainer's start.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path
from types import FrameType

from launchgen.shared.jobdir import (
    ENV_NODE_NAME,
    ENV_PID_DIR,
    EXIT_PREEMPTED,
    SIGNAL_NAMES,
    TRAINER_ERROR_PREFIX,
    exit_file,
    pid_file,
)


def _rank_files(rank: str) -> tuple[Path, Path] | None:
    """(pid file, exit file) of this rank; None when not run by a job script (no pid directory)."""
    root = os.environ.get(ENV_PID_DIR)
    if not root:
        return None
    node = os.environ.get(ENV_NODE_NAME) or "local"
    files = pid_file(root, node, rank), exit_file(root, node, rank)
    files[0].parent.mkdir(parents=True, exist_ok=True)
    return files


def _write(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def main(argv: list[str]) -> int:
    if not argv or argv[0].startswith("-"):
        print("usage: python -m launchgen.jobside.rank MODULE [ARGS...]", file=sys.stderr)
        return 2
    rank = os.environ.get("RANK", "0")
    child = subprocess.Popen([sys.executable, "-m", *argv])

    def forward(signum: int, _frame: FrameType | None) -> None:
        child.send_signal(signum)

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, forward)
    files = _rank_files(rank)
    if files is not None:
        _write(files[0], f"{child.pid}\n")
    status = child.wait()
    code = status if status >= 0 else 128 - status
    if status < 0 and -status not in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):  # not a stop passed on
        name = SIGNAL_NAMES.get(-status, str(-status))
        print(f"{TRAINER_ERROR_PREFIX}the trainer process (rank {rank}) was killed by SIG{name}", file=sys.stderr,
              flush=True)
    if files is not None:
        _write(files[1], f"{code}\n")
        if code == EXIT_PREEMPTED:
            return 0
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
