"""The lifecycle launchgen's bundled trainers have, installed into TRL's trainer as a `TrainerCallback`.

* Signals: `checkpoint.SignalFlag` turns USR2 (SLURM's pre-timeout signal) and TERM into a flag; after each
  optimizer step every rank agrees on it (one all-reduce: a signal may reach only some ranks) and, when set, asks
  the Trainer to save a checkpoint (`control.should_save`, TRL's own `checkpoint-<step>`: model, optimizer,
  scheduler, RNG states, trainer state) and to stop. The runner then exits 75 and the requeued job resumes from
  that checkpoint. Before the first step ends, TERM exits 75 at once (nothing trained since the last checkpoint).
* Kind: each checkpoint gets `launchgen-trainer.json` naming the run's trainer (`trainers/rerun.py`), so a run of
  another kind refuses to continue it before loading anything.
* Metrics: every log record goes to `output_dir/metrics.jsonl` (`{"step": N, ...}`; records after a resumed
  checkpoint are dropped first) and one plain `[launchgen] step N/M loss=...` line to stdout, which the job
  script writes to the trainer log, so `launchgen logs` and grep work as for the bundled trainers.
"""

from __future__ import annotations

import json
import math
import sys
import time
from pathlib import Path
from typing import Any

from launchgen.trainers.checkpoint import SignalFlag
from launchgen.trainers.reporting import format_line, truncate_metrics
from launchgen.trainers.rerun import write_kind
from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments

from launchgen.shared.jobdir import METRICS_FILE, METRICS_WALL_KEY

#: HF's end-of-training summary record (train_runtime, train_loss, ...): not a step's metrics.
_SUMMARY_KEY = "train_runtime"


class LifecycleCallback(TrainerCallback):
    def __init__(self, flag: SignalFlag, output_dir: Path, resumed_step: int | None, kind: str) -> None:
        self.flag = flag
        self.kind = kind  # written into each checkpoint (trainers/rerun.py): another kind of run refuses it
        self.metrics_path = output_dir / METRICS_FILE
        self.resumed_step = resumed_step
        self.accelerator: Any = None  # the trainer's, set by the runner once the trainer exists
        self.stopped_by_signal = False
        self._t0 = time.perf_counter()
        self._tokens_at: float | None = None  # num_tokens (cumulative) at the previous log

    def on_train_begin(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                       **kwargs: Any) -> None:
        if state.is_world_process_zero and self.resumed_step is not None:
            truncate_metrics(self.metrics_path, self.resumed_step)
        self._t0 = time.perf_counter()

    def on_step_end(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                    **kwargs: Any) -> None:
        self.flag.training()
        if self.accelerator is not None and self.flag.any_rank(self.accelerator):
            self.stopped_by_signal = True
            control.should_save = True
            control.should_training_stop = True

    def on_save(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                **kwargs: Any) -> None:
        if state.is_world_process_zero and args.output_dir is not None:
            write_kind(Path(args.output_dir) / f"checkpoint-{state.global_step}", self.kind)

    def on_log(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
               logs: dict[str, Any] | None = None, **kwargs: Any) -> None:
        if not state.is_world_process_zero or not logs or _SUMMARY_KEY in logs:
            return
        clean = {k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in logs.items()
                 if isinstance(v, (int, float, str, bool)) or v is None}
        self.metrics_path.parent.mkdir(parents=True, exist_ok=True)
        with self.metrics_path.open("a") as f:
            # stamped as the bundled trainers' records: `report` places the step on its timeline and takes
            # tokens/s from the wall time between records
            f.write(json.dumps({"step": state.global_step, **clean, METRICS_WALL_KEY: round(time.time(), 3)}) + "\n")
        now = time.perf_counter()
        tokens = logs.get("num_tokens")
        rate = None
        if isinstance(tokens, (int, float)):
            if self._tokens_at is not None and now > self._t0:
                rate = (tokens - self._tokens_at) / (now - self._t0)
            self._tokens_at = float(tokens)
        self._t0 = now
        line = format_line(state.global_step, state.max_steps, logs, rate)
        if sys.stdout.isatty():  # by hand, beside transformers' bar: tqdm clears and redraws it around the line
            from tqdm.auto import tqdm

            tqdm.write(line)
        else:
            print(line, flush=True)
