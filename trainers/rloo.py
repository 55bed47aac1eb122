"""RLOO: `python -m launchgen.trainers.rloo --config run.yaml` (alone, under `accelerate launch`, or in scripts).

The config is `launchgen.trainers.declarations.config.TrainerConfig` with `trainer: rloo`; semantics are TRL 1.16's RLOOTrainer
(see docs/trainers.md). Exit codes:

* 0  finished `max_steps` (final checkpoint and, with `save_final_model`, `output_dir/final` written)
* 2  config or setup error (one line on stderr naming the field and the fix; no traceback)
* 75 stopped on SIGUSR2/SIGTERM after writing a checkpoint: requeue; the next run resumes from it
* 1  anything else (a crash, with its traceback)
"""

from __future__ import annotations

from launchgen.trainers.cli import entry


def main(argv: list[str] | None = None) -> int:
    return entry(argv, "rloo")


if __name__ == "__main__":
    raise SystemExit(main())
