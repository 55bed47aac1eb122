"""Checkpoints: every `save_steps`, on USR2/TERM, atomic, pruned, and resumed exactly.

Layout: `output_dir/checkpoint-<step>/` holds accelerate's state (model, optimizer, scheduler, grad scaler and
every process's python/numpy/torch/CUDA RNG states), `trainer_state.json` (global step, micro-step, data position,
config digest) and `generation_buffer-rank<i>.pt` (the not yet consumed part of a generation batch, when a
checkpoint falls inside one). Everything is first written to `output_dir/.tmp-checkpoint-<step>/` and renamed
into place by rank 0 once every rank is done, so a directory named `checkpoint-<step>` is always complete;
leftover `.tmp-*` directories from a killed save are ignored and removed at the next save.

When `max_steps` is reached, `output_dir/launchgen-complete.json` is written last (the scripts' "do not requeue"
marker).

Signals: `SignalFlag` turns USR2 (SLURM's pre-timeout signal) and TERM into a flag. The handler is installed before the model
is loaded; the loop checks the flag before every optimizer step, i.e. right after the previous one (all ranks
agree through one all-reduce, since a signal may reach only some of them), writes a checkpoint and exits with `EXIT_PREEMPTED` (75, sysexits' EX_TEMPFAIL: "try again"): the rendered script
requeues the job, and the requeued run resumes from that checkpoint.
"""

from __future__ import annotations

import json
import re
import shutil
import signal
import time
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path
from types import FrameType
from typing import Any, Protocol

import torch

# the exit codes and the marker are the job-directory contract's (launchgen.shared.jobdir, standard library only)
from launchgen.shared.jobdir import COMPLETE_MARKER as COMPLETE_MARKER
from launchgen.shared.jobdir import EXIT_CONFIG as EXIT_CONFIG
from launchgen.shared.jobdir import EXIT_FAILURE as EXIT_FAILURE
from launchgen.shared.jobdir import EXIT_OK as EXIT_OK
from launchgen.shared.jobdir import EXIT_PREEMPTED as EXIT_PREEMPTED
from launchgen.shared.jobdir import CompletionMarker

_CKPT_RE = re.compile(r"^checkpoint-(\d+)$")
STATE_FILE = "trainer_state.json"


class OwnState(Protocol):
    """A prepared model (with its optimizer) whose checkpoint files its owner writes instead of accelerate
    (`lora.ShardedAdapterState`: LoRA under FSDP2). accelerate's save_state / load_state run inside `withheld()`,
    which hides the model from them; `save` (collective) and `load` then handle it in the same directory."""

    def withheld(self) -> AbstractContextManager[None]: ...

    def save(self, directory: Path) -> None: ...

    def load(self, directory: Path) -> None: ...


def write_complete_marker(output_dir: str | Path, step: int, trainer: str) -> Path:
    root = Path(output_dir)
    tmp = root / f".{COMPLETE_MARKER}.tmp"
    tmp.write_text(json.dumps(CompletionMarker(trainer, step, time.time()).to_json()) + "\n")
    final = root / COMPLETE_MARKER
    tmp.replace(final)
    return final


class SignalFlag:
    """Sets `.received` (the signal number) on USR2/TERM; the handler does nothing else (async-signal safe).

    Until `training()` is called, after the run's first optimizer step (model loading, waiting for the server's
    health), TERM ends the process at once with `EXIT_PREEMPTED`: nothing has been trained since the last
    checkpoint, and the job's supervisor, which sends TERM to stop a trainer, would otherwise wait out its grace
    and KILL it.
    """

    SIGNALS = ("SIGUSR2", "SIGTERM")

    def __init__(self) -> None:
        self.received: int | None = None
        self._previous: dict[int, Any] = {}
        self._started = False

    def _handler(self, signum: int, frame: FrameType | None) -> None:
        self.received = signum
        if signum == signal.SIGTERM and not self._started:
            raise SystemExit(EXIT_PREEMPTED)

    def training(self) -> None:
        """From here on TERM, too, is a flag honoured before the next optimizer step (checkpoint, then exit)."""
        self._started = True

    @property
    def installed(self) -> bool:
        return bool(self._previous)

    def install(self) -> SignalFlag:
        if self._previous:
            return self
        for name in self.SIGNALS:
            sig = getattr(signal, name, None)
            if sig is not None:
                self._previous[sig] = signal.signal(sig, self._handler)
        return self

    def uninstall(self) -> None:
        for sig, prev in self._previous.items():
            signal.signal(sig, prev)
        self._previous.clear()

    def any_rank(self, accelerator: Any) -> bool:
        flag = torch.tensor([1.0 if self.received is not None else 0.0], device=accelerator.device)
        if accelerator.num_processes > 1:
            flag = accelerator.reduce(flag, reduction="sum")
        return bool(flag.item() > 0)


def list_checkpoints(output_dir: str | Path) -> list[tuple[int, Path]]:
    """Complete checkpoints, oldest first."""
    root = Path(output_dir)
    if not root.is_dir():
        return []
    found = []
    for p in root.iterdir():
        m = _CKPT_RE.match(p.name)
        if m and p.is_dir() and (p / STATE_FILE).is_file():
            found.append((int(m.group(1)), p))
    return sorted(found)


def latest_checkpoint(output_dir: str | Path) -> Path | None:
    ckpts = list_checkpoints(output_dir)
    return ckpts[-1][1] if ckpts else None


def save_checkpoint(
    accelerator: Any,
    output_dir: str | Path,
    step: int,
    trainer_state: dict[str, Any],
    buffer: Any,
    save_total_limit: int | None,
    own: OwnState | None = None,
) -> Path:
    """Collective: every rank calls it. Returns the final directory."""
    root = Path(output_dir)
    final = root / f"checkpoint-{step}"
    tmp = root / f".tmp-checkpoint-{step}"
    if accelerator.is_main_process:
        root.mkdir(parents=True, exist_ok=True)
        for stale in root.glob(".tmp-checkpoint-*"):
            shutil.rmtree(stale, ignore_errors=True)
        tmp.mkdir(parents=True)
    accelerator.wait_for_everyone()
    with own.withheld() if own is not None else nullcontext():
        accelerator.save_state(str(tmp))
    if own is not None:
        own.save(tmp)
    torch.save(buffer, tmp / f"generation_buffer-rank{accelerator.process_index}.pt")
    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        state = dict(trainer_state, saved_at=time.time(), num_processes=accelerator.num_processes)
        (tmp / STATE_FILE).write_text(json.dumps(state, indent=1, sort_keys=True) + "\n")
        if final.exists():  # re-saving the same step (e.g. signal right after a periodic save)
            shutil.rmtree(final)
        tmp.rename(final)
        if save_total_limit is not None:
            for _, old in list_checkpoints(root)[:-save_total_limit]:
                shutil.rmtree(old, ignore_errors=True)
    accelerator.wait_for_everyone()
    return final


def load_checkpoint(accelerator: Any, path: Path, own: OwnState | None = None) -> tuple[dict[str, Any], Any]:
    """Restore accelerate's state (model, optimizer, scheduler, scaler, RNG); return (trainer_state, buffer)."""
    state = json.loads((path / STATE_FILE).read_text())
    if state.get("num_processes") != accelerator.num_processes:
        from launchgen.trainers.declarations.errors import TrainerSetupError

        raise TrainerSetupError(
            f"resume: {path} was written by {state.get('num_processes')} processes, this run has "
            f"{accelerator.num_processes}; resume with the same process count or set resume: never"
        )
    with own.withheld() if own is not None else nullcontext():
        accelerator.load_state(str(path))
    if own is not None:
        own.load(path)
    buf_path = path / f"generation_buffer-rank{accelerator.process_index}.pt"
    buffer = torch.load(buf_path, weights_only=False) if buf_path.exists() else None
    return state, buffer
