"""What a run does with the checkpoints its output_dir holds: which kind of trainer wrote one and whether this run may
continue it, whether the training is already complete (a re-run trains nothing), and the warning for a schedule
that ended at learning rate 0. The one owner for the bundled loop (`resume.decide`), TRL's trainers (`trl/run.py`)
and users' TRL scripts (`trl/script.py`).

The bundled loop records its whole config in `checkpoint-<step>/trainer_state.json` (`config.trainer`); a TRL run
leaves `launchgen-trainer.json` beside TRL's own files (`trl/callback.py`); a transformers checkpoint with neither
(a run outside launchgen) is "a transformers Trainer". A checkpoint of another kind cannot be continued: TRL
resuming the bundled loop's state dies in `TrainerState.__init__` after the model loaded, and the bundled loop
finds no accelerate state in TRL's. Standard library only: it is asked before anything heavy loads.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from launchgen.trainers.declarations.errors import TrainerSetupError

from launchgen.shared.jobdir import COMPLETE_MARKER

#: The file a TRL run writes into each of its checkpoints: {"trainer": "trl.grpo"} or {"trainer": "script:x.py"}.
KIND_FILE = "launchgen-trainer.json"
#: The kind of a transformers checkpoint that names no launchgen trainer.
TRANSFORMERS = "transformers"
_STATE_FILE = "trainer_state.json"


def _json(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def kind_of(checkpoint: Path) -> str | None:
    """`grpo`, `trl.grpo`, `script:train.py`, TRANSFORMERS, or None (not readable: nothing to say)."""
    mine = _json(checkpoint / KIND_FILE)
    if mine is not None and isinstance(mine.get("trainer"), str):
        return str(mine["trainer"])
    state = _json(checkpoint / _STATE_FILE)
    if state is None:
        return None
    config = state.get("config")
    if isinstance(config, dict) and isinstance(config.get("trainer"), str):
        return str(config["trainer"])
    return TRANSFORMERS if "log_history" in state else None


def write_kind(checkpoint: Path, trainer: str) -> None:
    if checkpoint.is_dir():
        (checkpoint / KIND_FILE).write_text(json.dumps({"trainer": trainer}) + "\n")


def describe(kind: str) -> str:
    if kind == TRANSFORMERS:
        return "a transformers/TRL Trainer outside launchgen"
    if kind.startswith("script:"):
        return f"the TRL script {kind.removeprefix('script:')}"
    if kind.startswith("trl."):
        return f"{kind} (TRL's own trainer)"
    return f"{kind} (launchgen's bundled trainer)"


def _bundled(kind: str) -> bool:
    return kind != TRANSFORMERS and not kind.startswith(("trl.", "script:"))


def foreign(checkpoint: Path, this: str) -> str | None:
    """Why the run `this` (its trainer's kind) cannot continue `checkpoint`; None when it can (or cannot tell)."""
    kind = kind_of(checkpoint)
    if kind is None or kind == this or (kind == TRANSFORMERS and not _bundled(this)):
        return None
    return (f"resume: {checkpoint} was written by {describe(kind)}; this run is {describe(this)}, which cannot "
            f"continue it. Start fresh in a new output directory (job.output_dir), or move "
            f"{checkpoint.parent}/checkpoint-* away (they are not deleted)")


def max_steps_of(checkpoint: Path) -> int | None:
    """The max_steps the checkpoint's run trained toward (trainer_state.json), for runs counted in epochs."""
    state = _json(checkpoint / _STATE_FILE)
    value = state.get("max_steps") if state is not None else None
    return value if isinstance(value, int) and value > 0 else None


def last_learning_rate(checkpoint: Path) -> float | None:
    """The learning rate transformers logged last before this checkpoint (its trainer_state.json)."""
    state = _json(checkpoint / _STATE_FILE) or {}
    rates = [r["learning_rate"] for r in state.get("log_history") or [] if isinstance(r, dict)
             and isinstance(r.get("learning_rate"), (int, float))]
    return float(rates[-1]) if rates else None


def complete_note(marker: Path, step: int, target: int) -> str:
    """What a re-run of a finished training prints before it does nothing."""
    return (f"[launchgen] training already complete: {marker} (step {step}, max_steps {target}); nothing to do, "
            "nothing was trained. Raise max_steps to train further, or use a new output directory.")


_CHECKPOINT = re.compile(r"^checkpoint-(\d+)$")


def newest(out: Path) -> tuple[int, Path] | None:
    """The newest `checkpoint-<step>` directory of `out`, as transformers' get_last_checkpoint finds it."""
    found = [(int(m[1]), p) for p in (out.iterdir() if out.is_dir() else ())
             if (m := _CHECKPOINT.match(p.name)) and p.is_dir()]
    return max(found) if found else None


@dataclass(frozen=True)
class TrlResume:
    checkpoint: str | None  # resume from here (TRL's resume_from_checkpoint); None: start fresh
    complete: bool = False  # the training already reached max_steps: train nothing


def decide_trl(out: Path, this: str, max_steps: int, resume: str, main: bool) -> TrlResume:
    """A TRL run's (trl.* or a script's) start: refuse a checkpoint of another kind, or one `resume: never` would
    overwrite; say "already complete" and train nothing where the marker and the newest checkpoint reached
    max_steps (max_steps <= 0, a run counted in epochs: the checkpoint's own); warn where the resumed schedule is
    at learning rate 0. `main`: this process prints and clears a marker that stops being true."""
    found = newest(out)
    if found is None:
        return TrlResume(None)
    step, last = found
    if resume == "never":
        raise TrainerSetupError(f"resume: never, but {out} holds {last.name}, which a fresh run would overwrite; use "
                                "another output_dir or resume: auto")
    refused = foreign(last, this)
    if refused is not None:
        raise TrainerSetupError(refused)
    target = max_steps if max_steps > 0 else max_steps_of(last)
    marker = out / COMPLETE_MARKER
    if marker.is_file() and target is not None and step >= target:
        if main:
            print(complete_note(marker, step, target), flush=True)
        return TrlResume(str(last), complete=True)
    if main:
        marker.unlink(missing_ok=True)  # training past a finished run: its marker stops the requeue until it ends
        if last_learning_rate(last) == 0.0:
            print(f"[launchgen] warning: {last} ended its learning-rate schedule at 0 (its max_steps was {step}); "
                  f"TRL resumes its optimizer there, so step {step + 1} trains at learning rate 0 before the "
                  f"schedule restarts over max_steps {target}. For a fresh schedule, start a new output directory "
                  "from the trained weights.", flush=True)
    return TrlResume(str(last))
