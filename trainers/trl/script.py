"""`python -m launchgen.trainers.trl.script train.py [ARGS...]` (or `-m package.module [ARGS...]`): the user's own
TRL script, run as `python train.py ARGS` would run it, with launchgen's lifecycle installed automatically.

The script needs no launchgen line: before it runs, every `transformers.Trainer` (TRL's trainers are Trainers)
is given the `LifecycleCallback` when it is built, and its `train()` resumes from the newest `checkpoint-<step>`
in its output_dir when the script passes no `resume_from_checkpoint`. A USR2/TERM makes the running step's end
save a checkpoint, and `train()` then exits the process with 75 (the job requeues; the next attempt resumes). A
`train()` that reached max_steps, in a script that then ends without an error, leaves the completion marker in
that output_dir. Metrics go to the job's `<trainer output_dir>/metrics.jsonl` (`metrics_dir`) and the trainer
log's `[launchgen] step` lines.
"""

from __future__ import annotations

import json
import os
import runpy
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from launchgen.trainers.checkpoint import EXIT_PREEMPTED, SignalFlag, write_complete_marker
from launchgen.trainers.rerun import decide_trl

if TYPE_CHECKING:
    from launchgen.trainers.declarations.trl.config import TrlRunConfig

#: A script whose source names one of these parses TRL's config fields from its command line.
ARG_PARSERS = ("TrlParser", "HfArgumentParser")
#: A script whose source names this parses TRL's ModelConfig (--model_name_or_path, --dtype, ...).
MODEL_CONFIG = "ModelConfig"
#: Every value launchgen passes is also in the environment as LAUNCHGEN_TRL_<FIELD> (for scripts that parse nothing).
ENV_PREFIX = "LAUNCHGEN_TRL_"
#: ModelConfig's flag for each model_init_kwargs key launchgen fills.
_MODEL_FLAGS = {"dtype": "dtype", "attn_implementation": "attn_implementation", "revision": "model_revision"}


class _Finished:
    """The Trainer runs of this process that reached max_steps: (output_dir, global step), for the marker."""

    def __init__(self) -> None:
        self.runs: list[tuple[Path, int, bool]] = []


def _resume_step(checkpoint: str | None) -> int | None:
    return int(Path(checkpoint).name.rpartition("-")[2]) if checkpoint else None


def install(flag: SignalFlag, finished: _Finished, kind: str) -> None:
    """Wrap `Trainer.__init__` and `Trainer.train` (process-wide: this process runs one script)."""
    from launchgen.trainers.trl.callback import LifecycleCallback
    from transformers import Trainer
    from transformers.trainer_callback import ProgressCallback

    trainer_init, trainer_train = Trainer.__init__, Trainer.train

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        trainer_init(self, *args, **kwargs)
        if not sys.stderr.isatty():  # a bar in a log file is one line of carriage returns the step lines would join
            self.remove_callback(ProgressCallback)
        callback = LifecycleCallback(flag, metrics_dir(Path(self.args.output_dir)), None, kind)
        callback.accelerator = self.accelerator
        self.add_callback(callback)
        self._launchgen_callback = callback

    def train(self: Any, resume_from_checkpoint: Any = None, *args: Any, **kwargs: Any) -> Any:
        callback = self._launchgen_callback
        out = Path(self.args.output_dir)
        if resume_from_checkpoint is None:
            start = decide_trl(out, kind, int(self.args.max_steps), "auto", self.accelerator.is_main_process)
            if start.complete:  # the script's own output_dir: stop before it saves an untrained model over it
                raise SystemExit(0)
            resume_from_checkpoint = start.checkpoint
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


def metrics_dir(output_dir: Path) -> Path:
    """Where a script's metrics.jsonl goes: the job's trainer directory when the job runs it (its output_dir,
    LAUNCHGEN_TRL_OUTPUT_DIR), so `report` and `status` find a script's metrics even where it trains into its own
    output_dir (a script that parses no flags); else the Trainer's output_dir."""
    job = os.environ.get(ENV_PREFIX + "OUTPUT_DIR")
    return Path(job) if job else output_dir


def _words(value: Any) -> list[str]:
    """A value as HfArgumentParser reads it: true/false, one word per list item, JSON for a mapping."""
    if isinstance(value, bool):
        return ["true" if value else "false"]
    if isinstance(value, (list, tuple)):
        return [str(v) for v in value] or ["none"]
    if isinstance(value, dict):
        return [json.dumps(value, sort_keys=True)]
    return [str(value)]


def launch_values(cfg: TrlRunConfig) -> tuple[dict[str, Any], dict[str, Any]]:
    """(TRL config fields, ModelConfig fields) launchgen passes to a script: the run config's `args` (what the
    topology decided and the user's train.args) with the server's address, and the model's loading options."""
    values = {k: v for k, v in cfg.args.items() if v is not None}
    if cfg.server is not None:
        values["vllm_server_base_url"] = cfg.server.base_url
        if cfg.entry.vllm != "server":
            values["vllm_group_port"] = cfg.server.group_port
    model: dict[str, Any] = {"model_name_or_path": cfg.model_name_or_path}
    init = values.get("model_init_kwargs")
    if isinstance(init, dict):
        model.update({flag: init[key] for key, flag in _MODEL_FLAGS.items() if init.get(key) is not None})
    return values, model


def script_command(cfg: TrlRunConfig, source: str) -> tuple[list[str], dict[str, str]]:
    """The flags before the user's script_args, and the LAUNCHGEN_TRL_* environment (docs/trl-names.md)."""
    values, model = launch_values(cfg)
    flags: list[str] = []
    if any(p in source for p in ARG_PARSERS):
        for key, value in values.items():
            flags += [f"--{key}", *_words(value)]
    if MODEL_CONFIG in source:
        for key, value in model.items():
            flags += [f"--{key}", *_words(value)]
    env = {ENV_PREFIX + k.upper(): " ".join(_words(v)) for k, v in {**values, **model}.items()}
    return [*flags, *cfg.script_args], env


def run_script(cfg: TrlRunConfig) -> int:
    """A job's `train.script`: the flags and environment from the run config, then the script under `main`. A
    training that already reached max_steps in the job's output_dir runs nothing (the script would load its model
    and data, train one more step at learning rate 0 and save over the finished run)."""
    assert cfg.script is not None
    if decide_trl(cfg.output_dir, f"script:{cfg.script}", int(cfg.args.get("max_steps", -1)), cfg.resume,
                  os.environ.get("RANK", "0") == "0").complete:
        return 0
    as_module = not cfg.script.endswith(".py")
    source = _source(cfg.script, as_module)
    argv, env = script_command(cfg, source)
    os.environ.update(env)
    return main(["-m", cfg.script, *argv] if as_module else [cfg.script, *argv])


def _source(target: str, as_module: bool) -> str:
    if not as_module:
        return Path(target).read_text()
    import importlib.util

    spec = importlib.util.find_spec(target)
    origin = spec.origin if spec is not None else None
    return Path(origin).read_text() if origin and origin.endswith(".py") else ""


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
    install(flag, finished, f"script:{target}")
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
