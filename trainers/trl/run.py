"""Build TRL's config and trainer from a `TrlRunConfig` and train, with launchgen's lifecycle (`callback.py`).

Order matters for the exit codes: everything a user can fix (data, rewards, TRL's own config validation, an
unwritable output_dir) fails before the model loads, as one line and exit 2; a signal before the first step ends
the process with 75; a signal later checkpoints and exits 75; a finished run writes `output_dir/final` and the
completion marker (the scripts' "do not requeue") and exits 0.
"""

from __future__ import annotations

import importlib
import inspect
import os
import sys
from pathlib import Path
from typing import Any

from launchgen.trainers.checkpoint import (
    EXIT_OK,
    EXIT_PREEMPTED,
    SignalFlag,
    write_complete_marker,
)
from launchgen.trainers.declarations.config import DataSection
from launchgen.trainers.declarations.errors import TrainerSetupError, run_reporting
from launchgen.trainers.declarations.trl.config import TrlRunConfig
from launchgen.trainers.declarations.trl.entries import TrlEntry
from launchgen.trainers.rerun import decide_trl


def _load(path: str) -> Any:
    module, _, name = path.partition(":")
    return getattr(importlib.import_module(module), name)


#: The row's prompt as the data file has it, when `prompt` holds the chat-templated text (`_rows`); TRL passes it to
#: the rewards as a column, and `_reward_callable` gives it back to them as `prompts`.
RAW_PROMPT = "launchgen_raw_prompt"


def _rows(data: DataSection, kind: str, tokenizer: Any = None) -> list[dict[str, Any]]:
    """launchgen's rows (local files or a Hub data set, column_mapping applied) in TRL's column names.

    A text prompt is rendered through the tokenizer's chat template here, as the bundled trainers do
    (`launchgen.trainers.data.build_prompt`): TRL would tokenize the bare text, so one spec through `grpo` and
    `trl.grpo` would generate from different prompts (tests/trainers/test_trl_consistency.py)."""
    from launchgen.trainers.data import build_prompt, read_rows

    rows = read_rows(data)
    if kind != "prompt":
        return rows
    if data.prompt_column not in rows[0]:
        raise TrainerSetupError(f"data.prompt_column {data.prompt_column!r} not in the data (columns: "
                                f"{', '.join(sorted(rows[0]))}); set data.prompt_column or data.column_mapping")
    templated = tokenizer is not None and getattr(tokenizer, "chat_template", None) is not None
    out = []
    for row in rows:
        prompt = row[data.prompt_column]
        if templated and isinstance(prompt, str):
            new = {k: v for k, v in row.items() if k != data.prompt_column}
            new["prompt"] = build_prompt(prompt, tokenizer, data.system_prompt)
            new[RAW_PROMPT] = prompt
            out.append(new)
            continue
        if data.system_prompt is not None:
            turns = prompt if isinstance(prompt, list) else [{"role": "user", "content": prompt}]
            prompt = [{"role": "system", "content": data.system_prompt}, *turns]
        new = {k: v for k, v in row.items() if k != data.prompt_column}
        new["prompt"] = prompt
        out.append(new)
    return out


def dataset(data: DataSection, kind: str, tokenizer: Any = None) -> Any:
    import datasets

    rows = _rows(data, kind, tokenizer)
    if kind == "preference":
        missing = [c for c in ("prompt", "chosen", "rejected") if c not in rows[0]]
        if missing:
            raise TrainerSetupError(f"data.path {data.path}: preference rows need prompt, chosen and rejected "
                                    f"(missing {', '.join(missing)}); use data.column_mapping")
    ds = datasets.Dataset.from_list(rows)
    return ds.shuffle(seed=0) if data.shuffle and kind != "prompt" else ds


def _reward_callable(loaded: Any) -> Any:
    """A launchgen reward (`module:function` or built-in, with its `kwargs`) in TRL's reward_funcs form; TRL logs it
    under its `__name__` (launchgen's metric name)."""
    fn, extra = loaded.fn, dict(loaded.kwargs)

    def reward(prompts: list[Any], completions: list[Any], **columns: Any) -> list[float | None]:
        prompts = columns.pop(RAW_PROMPT, prompts)  # the data file's prompts, as the bundled trainers pass them
        return list(fn(prompts=prompts, completions=completions, **columns, **extra))

    reward.__name__ = reward.__qualname__ = loaded.name
    return reward


def rewards(cfg: TrlRunConfig, device: Any) -> tuple[list[Any], list[float]]:
    from launchgen.trainers.declarations.rewards import load_rewards

    loaded = load_rewards(cfg.rewards, device)
    return [_reward_callable(r) for r in loaded], [r.weight for r in loaded]


def trl_args(cfg: TrlRunConfig, entry: TrlEntry, weights: list[float] | None) -> dict[str, Any]:
    """The keyword arguments of TRL's config class: the run config's `args` plus the server address and the rewards'
    weights (TRL's reward_weights)."""
    kw = dict(cfg.args)
    if cfg.server is not None:
        kw["vllm_server_base_url"] = cfg.server.base_url
        if entry.vllm != "server":
            kw["vllm_group_port"] = cfg.server.group_port
    if weights is not None and any(w != 1.0 for w in weights):
        if "reward_weights" in kw:
            raise TrainerSetupError("args.reward_weights: the rewards' `weight` fields set them already; set one of "
                                    "the two")
        kw["reward_weights"] = weights
    if not sys.stderr.isatty():
        kw.setdefault("disable_tqdm", True)  # a bar in a log file is a line of carriage returns
    return kw


def build_config(entry: TrlEntry, kw: dict[str, Any]) -> Any:
    cls = _load(entry.config)
    try:
        return cls(**kw)
    except (TypeError, ValueError) as e:  # TRL's own __post_init__ validation: the user's to fix
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise TrainerSetupError(f"TRL's {entry.config_class}: {first}") from None


def _quiet_printer(trainer: Any) -> None:
    """transformers prints each log record as a dict when its bar is off; the callback's plain line replaces it."""
    from transformers.trainer_callback import PrinterCallback

    trainer.remove_callback(PrinterCallback)


def _tokenizer(cfg: TrlRunConfig) -> Any:
    from transformers import AutoTokenizer

    init = cfg.args.get("model_init_kwargs") or {}
    keep = {k: init[k] for k in ("revision", "trust_remote_code") if isinstance(init, dict) and k in init}
    tok = AutoTokenizer.from_pretrained(cfg.model_name_or_path, padding_side="left", **keep)
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    return tok


def build_trainer(cfg: TrlRunConfig, entry: TrlEntry, trl_config: Any, reward_funcs: list[Any] | None,
                  callback: Any) -> Any:
    cls = _load(entry.trainer)
    assert cfg.data is not None  # TrlRunConfig: required without a script
    tokenizer = _tokenizer(cfg) if entry.data == "prompt" else None
    kwargs: dict[str, Any] = {"args": trl_config, "train_dataset": dataset(cfg.data, entry.data, tokenizer),
                              "callbacks": [callback]}
    if cfg.eval_data is not None:
        kwargs["eval_dataset"] = dataset(cfg.eval_data, entry.data, tokenizer)
    if reward_funcs is not None:
        kwargs["reward_funcs"] = reward_funcs
    if entry.teacher_field is not None:  # a teacher that TRL's trainer takes as a constructor argument
        teacher = cfg.args.get(entry.teacher_field)
        if not teacher:
            raise TrainerSetupError(f"args.{entry.teacher_field}: trl.{entry.name} distils from a teacher model; "
                                    "name it")
        kwargs["teacher_model"] = teacher
    if entry.needs_tokenizer:
        kwargs["processing_class"] = tokenizer or _tokenizer(cfg)
    accepted = inspect.signature(cls.__init__).parameters
    return cls(model=cfg.model_name_or_path, **{k: v for k, v in kwargs.items() if k in accepted})


def run(cfg: TrlRunConfig) -> int:
    flag = SignalFlag().install()
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")  # the experimental entries are chosen on purpose
    try:
        return _run(cfg, flag)
    finally:
        flag.uninstall()


def _run(cfg: TrlRunConfig, flag: SignalFlag) -> int:
    entry = cfg.entry
    from accelerate import PartialState
    from launchgen.trainers.reporting import quiet_bars_off_terminal
    from launchgen.trainers.trl.callback import LifecycleCallback
    from launchgen.trainers.trl.server import cpu_device_lookup, patch_for_transport

    quiet_bars_off_terminal()
    state = PartialState()
    if entry.cuda_only is not None and state.device.type == "cpu":  # `check` refuses the spec (LG920) already
        raise TrainerSetupError(f"trl.{entry.name} cannot train on a CPU: {entry.cuda_only}")
    start = decide_trl(cfg.output_dir, cfg.trainer, int(cfg.args.get("max_steps", -1)), cfg.resume,
                       state.is_main_process)
    if start.complete:
        return EXIT_OK  # the marker and final/ stay the finished run's
    resume_from = start.checkpoint
    reward_funcs, weights = rewards(cfg, state.device) if entry.rewards else (None, None)
    trl_config = build_config(entry, trl_args(cfg, entry, weights))
    resumed_step = int(Path(resume_from).name.rpartition("-")[2]) if resume_from else None
    callback = LifecycleCallback(flag, cfg.output_dir, resumed_step, cfg.trainer)
    patch_for_transport(trl_config)
    with cpu_device_lookup(trl_config):
        trainer = build_trainer(cfg, entry, trl_config, reward_funcs, callback)
    callback.accelerator = trainer.accelerator
    _quiet_printer(trainer)
    if resume_from and state.is_main_process:
        print(f"[launchgen] resuming from {resume_from}", flush=True)
    trainer.train(resume_from_checkpoint=resume_from)
    if callback.stopped_by_signal:
        if state.is_main_process:
            print(f"[launchgen] signal {flag.received}: checkpoint-{trainer.state.global_step} written, "
                  f"exiting {EXIT_PREEMPTED}", flush=True)
        return EXIT_PREEMPTED
    if cfg.save_final_model:
        trainer.save_model(str(cfg.output_dir / "final"))
    if state.is_main_process:
        write_complete_marker(cfg.output_dir, trainer.state.global_step, cfg.trainer)
    state.wait_for_everyone()
    return EXIT_OK


def main(argv: list[str] | None = None) -> int:
    import argparse

    from launchgen.shared.jobdir import EXIT_CONFIG

    p = argparse.ArgumentParser(prog="python -m launchgen.trainers.trl",
                                description="Train with TRL's own trainer under launchgen's lifecycle.")
    p.add_argument("--config", required=True, help="run config (YAML): launchgen.trainers.declarations.trl.config.TrlRunConfig")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override one field (dotted path, value parsed as YAML); repeatable")
    a = p.parse_args(argv)
    from pydantic import ValidationError

    try:
        cfg = TrlRunConfig.load(a.config, a.set)
    except ValidationError as e:
        err = e.errors()[0]
        loc = ".".join(str(x) for x in err["loc"]) or "(top level)"
        print(f"error: {a.config}: {loc}: {err['msg'].removeprefix('Value error, ')}", file=sys.stderr)
        return EXIT_CONFIG
    except (OSError, ValueError) as e:
        print(f"error: {a.config}: {str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__}",
              file=sys.stderr)
        return EXIT_CONFIG
    loaded = cfg

    def train() -> int:
        if loaded.script is not None:
            from launchgen.trainers.trl.script import run_script

            return run_script(loaded)
        return run(loaded)

    return run_reporting(train)
