"""What a run reports at each logging step, on the main process only.

* `metrics.jsonl` in output_dir: one JSON record per logging step, stamped with `time/wall` (always; the file the tests, `report` and plots
  read). Records of steps after a resumed checkpoint are dropped first (those steps are about to be redone).
* One plain text line per logging step on stdout (always), which the job script writes to the trainer log, so
  `tail -f` and `grep '^\\[launchgen\\] step'` work without a terminal:
  `[launchgen] step 3/12 reward=0.5120 loss=0.01230 kl=0.000000 tokens/s=1234 generate=0.53s score=0.01s ...`
* A tqdm progress bar, only when stderr is a terminal (in a log file it is noise: one carriage return per update).
* TensorBoard (`report_to: [tensorboard]`): `output_dir/runs`; warns once when the package is missing.
* wandb (`report_to: [wandb]`, the `launchgen[wandb]` extra): one run per output_dir (its id is kept in
  `output_dir/wandb-run-id`, so a requeued job continues the same run); `WANDB_MODE=offline` writes it under
  `output_dir/wandb` with no network call; WANDB_PROJECT names the project (default `launchgen`).

The plain line's fields are the logged window's means (as metrics.jsonl) except tokens/s: the window's real tokens
(prompt and completion, all processes) trained on, over the window's wall time.
"""

from __future__ import annotations

import json
import math
import os
import secrets
import sys
import time
from pathlib import Path
from typing import Any

from launchgen.trainers.declarations.config import TrainerConfig
from launchgen.trainers.declarations.errors import TrainerSetupError

from launchgen.shared.jobdir import METRICS_FILE, METRICS_WALL_KEY, STEP_LINE_PREFIX

#: Metrics shown on the plain line, in order, with their formats (shown when the window produced them).
LINE_METRICS = (("reward", ".4f"), ("loss", ".5g"), ("kl", ".6f"))
#: Per-phase times shown on the plain line: metric key -> label.
LINE_TIMES = (("time/generate", "generate"), ("time/score", "score"), ("time/train", "train"),
              ("time/sync_weights", "sync"), ("time/eval", "eval"))
#: Formats of the progress-bar fields a batch source names.
POSTFIX = {"reward": ".3f", "loss": ".4g"}
#: File in output_dir holding the wandb run id, so a resumed run continues the same wandb run.
WANDB_ID_FILE = "wandb-run-id"
WANDB_MISSING = "report_to lists wandb but the wandb package is not installed: pip install 'launchgen[wandb]'"


def require_backends(cfg: TrainerConfig) -> None:
    """Refuse a missing wandb before any model loads (TensorBoard only warns: it was on by default)."""
    if "wandb" in cfg.report_to:
        try:
            import wandb  # noqa: F401
        except ImportError:
            raise TrainerSetupError(WANDB_MISSING) from None


def quiet_bars_off_terminal() -> None:
    """Off a terminal, also the libraries' own bars (transformers' "Loading weights", the Hub's downloads) stay out
    of the log: each is a line of carriage returns there."""
    if sys.stderr.isatty():
        return
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()


def truncate_metrics(path: Path, step: int) -> None:
    """Drop records of steps after the resumed checkpoint (they are about to be redone), so plots stay single-valued."""
    if not path.is_file():
        return
    kept = []
    for line in path.read_text().splitlines():
        try:
            if int(json.loads(line).get("step", 0)) <= step:
                kept.append(line)
        except (ValueError, TypeError, AttributeError):
            continue  # a line torn by a kill mid-write
    tmp = path.with_suffix(".jsonl.tmp")
    tmp.write_text("".join(x + "\n" for x in kept))
    tmp.replace(path)


def format_line(step: int, max_steps: int, metrics: dict[str, Any], tokens_per_s: float | None) -> str:
    """The plain text line of one logging step (missing or NaN fields are left out)."""
    parts = [f"{STEP_LINE_PREFIX}{step}/{max_steps}"]
    for key, fmt in LINE_METRICS:
        v = metrics.get(key)
        if isinstance(v, (int, float)) and not math.isnan(v):
            parts.append(f"{key}={v:{fmt}}")
    if tokens_per_s is not None and math.isfinite(tokens_per_s):
        parts.append(f"tokens/s={tokens_per_s:.0f}")
    for key, label in LINE_TIMES:
        v = metrics.get(key)
        if isinstance(v, (int, float)) and not math.isnan(v):
            parts.append(f"{label}={v:.2f}s")
    return " ".join(parts)


def _tensorboard(out: Path) -> Any:
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:
        print(
            "warning: report_to lists tensorboard but the tensorboard package is not installed (pip install "
            "tensorboard); nothing is written to runs/ (metrics.jsonl still has every metric)",
            file=sys.stderr, flush=True,
        )
        return None
    return SummaryWriter(str(out / "runs"))


def _wandb(cfg: TrainerConfig, out: Path) -> Any:
    import wandb

    id_file = out / WANDB_ID_FILE
    run_id = id_file.read_text().strip() if id_file.is_file() else secrets.token_hex(4)  # wandb ids: [a-z0-9]
    id_file.write_text(run_id + "\n")
    try:
        return wandb.init(
            project=os.environ.get("WANDB_PROJECT", "launchgen"),
            name=cfg.run_name,
            id=run_id,
            resume="allow",
            dir=str(out),
            config=cfg.model_dump(mode="json"),
        )
    except Exception as e:  # wandb raises its own kinds (login, network, settings): all are the user's to fix
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise TrainerSetupError(
            f"report_to wandb: wandb.init failed ({type(e).__name__}: {first}); on nodes without network set "
            "WANDB_MODE=offline (slurm.env) and `wandb sync` the run later"
        ) from None


class Reporter:
    """The main process's sinks; on other processes every method does nothing."""

    def __init__(self, cfg: TrainerConfig, out: Path, is_main: bool, initial_step: int, resumed: bool) -> None:
        self.cfg, self.out, self.is_main = cfg, out, is_main
        self.metrics_path = out / METRICS_FILE
        self._tokens = 0.0
        self._t0 = time.perf_counter()
        self.bar: Any = None
        self.tb: Any = None
        self.wandb: Any = None
        if not is_main:
            return
        if resumed:
            truncate_metrics(self.metrics_path, initial_step)
        if "tensorboard" in cfg.report_to:
            self.tb = _tensorboard(out)
        if "wandb" in cfg.report_to:
            self.wandb = _wandb(cfg, out)
        if sys.stderr.isatty():
            try:
                from tqdm.auto import tqdm

                self.bar = tqdm(total=cfg.max_steps, initial=initial_step, desc=cfg.trainer, dynamic_ncols=True)
            except ImportError:
                pass

    def count_tokens(self, n: float) -> None:
        """Tokens (all processes) trained on in one optimizer step, for the window's tokens/s."""
        self._tokens += n

    def progress(self, step_metrics: dict[str, float], keys: tuple[str, ...]) -> None:
        """One optimizer step done: the bar moves (showing `keys` when the step produced all of them)."""
        if self.bar is None:
            return
        if all(k in step_metrics for k in keys):
            self.bar.set_postfix({k: f"{step_metrics[k]:{POSTFIX[k]}}" for k in keys}, refresh=False)
        self.bar.update(1)

    def log(self, step: int, metrics: dict[str, float], line: bool = True) -> None:
        """One record to every sink; `line`: also the plain text line (and restart the tokens/s window)."""
        if not self.is_main:
            return
        clean = {k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in metrics.items()}
        with self.metrics_path.open("a") as f:
            f.write(json.dumps({"step": step, **clean, METRICS_WALL_KEY: round(time.time(), 3)}) + "\n")
        numeric = {k: v for k, v in metrics.items() if isinstance(v, (int, float)) and not math.isnan(v)}
        if self.tb is not None:
            for k, v in numeric.items():
                self.tb.add_scalar(k, v, step)
        if self.wandb is not None:
            self.wandb.log(numeric, step=step)
        if line:
            now = time.perf_counter()
            rate = self._tokens / (now - self._t0) if self._tokens and now > self._t0 else None
            self._tokens, self._t0 = 0.0, now
            self.say(format_line(step, self.cfg.max_steps, metrics, rate))

    def say(self, text: str) -> None:
        """A line on stdout (above the bar when there is one)."""
        if not self.is_main:
            return
        if self.bar is not None:
            self.bar.write(text)
        else:
            print(text, flush=True)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
        if self.tb is not None:
            self.tb.close()
        if self.wandb is not None:
            self.wandb.finish()
        self.bar = self.tb = self.wandb = None
