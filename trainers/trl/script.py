"""`python -m launchgen.trainers.trl.script train.py [ARGS...]` (or `-m package.module [ARGS...]`): the user's own
TRL script, run as `python train.py ARGS` would run it, with launchgen's lifecycle installed automatically.

The script needs no launchgen line: before it runs, every `transformers.Trainer` (TRL's trainers are Trainers)
is given the `LifecycleCallback` when it is built, and its `train()` resumes from the newest `checkpoint-<step>`
in its output_dir when the script passes no `resume_from_checkpoint`. A USR2/TERM makes the running step's end
save a checkpoint, and `train()` then exits the process with 75 (the job requeues; the next attempt resumes). A
`train()` that reached max_steps, in a script that then ends without an error, leaves the completion marker in
that output_dir. Metrics go to `<output_dir>/metrics.jsonl` and the trainer log's `[launchgen] step` lines.
"""

from __future__ import annotations

import runpy
import sys
from pathlib import Path
from typing import Any

from launchgen.trainers.checkpoint import EXIT_PREEMPTED, SignalFlag, write_complete_marker


class _Finished:
    """The Trainer runs of this process that reached max_steps: (output_dir, global step), for the marker."""

    def __init__(self) -> None:
        self.runs: list[tuple[Path, int, bool]] = []


def _resume_step(checkpoint: str | None) -> int | None:
    return int(Path(checkpoint).name.rpartition("-")[2]) if checkpoint else None


def install(flag: SignalFlag, finished: _Finished) -> None:
    """Wrap `Trainer.__init__` and `Trainer.train` (process-wide: this process runs one script)."""
    from launchgen.trainers.trl.callback import LifecycleCallback
    from transformers import Trainer
    from transformers.trainer_utils import get_last_checkpoint

    trainer_init, trainer_train = Trainer.__init__, Trainer.train

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        trainer_init(self, *args, **kwargs)
        callback = LifecycleCallback(flag, Path(self.args.output_dir), None)
        callback.accelerator = self.accelerator
        self.add_callback(callback)
        self._launchgen_callback = callback

    def train(self: Any, resume_from_checkpoint: Any = None, *args: Any, **kwargs: Any) -> Any:
        callback = self._launchgen_callback
        out = Path(self.args.output_dir)
        if resume_from_checkpoint is None and out.is_dir():
            resume_from_checkpoint = get_last_checkpoint(str(out))
            if resume_from_checkpoint and self.accelerator.is_main_process:
                print(f"[launchgen] resuming from {resume_from_checkpoint}", flush=True)
        callback.resumed_step = _resume_step(resume_from_checkpoint if isinstance(resume_from_checkpoint, str)
                                             else None)
        result = trainer_train(self, resume_from_checkpoint, *args, **kwargs)
        if callback.stopped_by_signal:
            if self.accelerator.is_main_process:
                print(f"[launchgen] signal {flag.received}: checkpoint-{self.state.global_step} written, exiting "
                      f"{EXIT_PREEMPTED}", flush=True)
            raise SystemExit(EXIT_PREEMPTED)
        if self.state.max_steps > 0 and self.state.global_step >= self.state.max_steps:
            finished.runs.append((out, self.state.global_step, self.accelerator.is_main_process))
        return result

    Trainer.__init__ = __init__  # type: ignore[method-assign]
    Trainer.train = train  # type: ignore[method-assign]


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__)
        return 0 if argv else 2
    as_module = argv[0] == "-m"
    if as_module:
        argv = argv[1:]
    target, rest = argv[0], argv[1:]
    flag = SignalFlag().install()
    finished = _Finished()
    install(flag, finished)
    sys.argv = [target, *rest]
    if as_module:
        runpy.run_module(target, run_name="__main__", alter_sys=True)
    else:
        sys.path.insert(0, str(Path(target).resolve().parent))
        runpy.run_path(target, run_name="__main__")
    for out, step, is_main in finished.runs:
        if is_main:
            write_complete_marker(out, step, f"script:{target}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
