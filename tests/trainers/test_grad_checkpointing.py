"""`gradient_checkpointing: auto` (issue 39): the trainer's choice follows the plan's estimate on both sides of the
threshold, is printed at start, and an out-of-memory in the first step with it off is retried exactly once with it
on, over the same generation batch."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from launchgen.trainers import grad_checkpointing
from launchgen.trainers.core import Trainer
from launchgen.trainers.declarations.config import TrainerConfig
from toy_runs import read_metrics, toy_cfg

from launchgen.shared.estimate import MARGIN, TrainerSetup, choose_checkpointing, trainer_estimate
from launchgen.shared.modelshape import ModelShape

# Qwen2.5-1.5B's shape (the benchmark's c3): 64 rows of 32 + 256 tokens
C3 = ModelShape(hidden_size=1536, num_hidden_layers=28, num_attention_heads=12, num_key_value_heads=2,
                intermediate_size=8960, vocab_size=32768, tie_word_embeddings=True, qkv_bias=True)


def _cfg(**over: Any) -> TrainerConfig:
    data: dict[str, Any] = {"trainer": "grpo", "output_dir": "o", "precision": "bf16",
                            "model": {"name_or_path": "m", "dtype": "bfloat16"},
                            "data": {"path": "d.jsonl", "max_prompt_length": 32}, "num_generations": 8,
                            "per_device_train_batch_size": 64}
    for k, v in over.items():
        if isinstance(v, dict) and isinstance(data.get(k), dict):
            data[k] = {**data[k], **v}
        else:
            data[k] = v
    return TrainerConfig.model_validate(data)


def _peak_off() -> float:
    s = TrainerSetup(backend="ddp", processes=1, precision="bf16", weight_dtype="bfloat16", rows=64,
                     prompt_tokens=32, completion_tokens=256)
    return trainer_estimate(C3, s, None).total_gib


def test_auto_follows_the_estimate_on_both_sides_of_the_threshold() -> None:
    peak = _peak_off()
    edge = peak / (1 - MARGIN)  # the GPU size at which the peak without checkpointing is exactly at the limit
    small = grad_checkpointing.decide(_cfg(), C3, edge * 0.98)
    big = grad_checkpointing.decide(_cfg(), C3, edge * 1.02)
    assert small.auto and small.on and small.choice is not None
    assert big.auto and not big.on and big.choice is not None
    assert small.choice.peak_off_gib == pytest.approx(peak) and small.choice.peak_on_gib < peak / 2
    assert "on (auto)" in small.line() and "off (auto)" in big.line()
    # the same rule as the plan's: the shared function answers alike for the same inputs
    plan = choose_checkpointing(C3, TrainerSetup(backend="ddp", processes=1, precision="bf16",
                                                 weight_dtype="bfloat16", rows=64, prompt_tokens=32,
                                                 completion_tokens=256), edge * 0.98)
    assert plan is not None and plan.on and plan.peak_off_gib == pytest.approx(peak)


def test_a_memory_budget_is_the_limit_and_explicit_values_are_kept() -> None:
    peak = _peak_off()
    # a huge GPU, but a budget under the peak: on
    assert grad_checkpointing.decide(_cfg(memory_budget_gib=peak / 2), C3, 10 * peak).on
    assert not grad_checkpointing.decide(_cfg(memory_budget_gib=2 * peak), C3, None).on
    for value in (True, False):
        c = grad_checkpointing.decide(_cfg(model={"gradient_checkpointing": value}), C3, 1.0)
        assert c.on is value and not c.auto and "as configured" in c.line()
    cpu = grad_checkpointing.decide(_cfg(), C3, None)
    assert not cpu.on and cpu.auto and cpu.choice is None and "no GPU memory" in cpu.line()


class _Oom:
    """A forward pre-hook on the first decoder layer that runs out of memory in every training forward without
    checkpointing (or in every one, `always`): the first step's activations do not fit."""

    def __init__(self, always: bool = False) -> None:
        self.always = always
        self.raised = 0

    def __call__(self, layer: torch.nn.Module, args: Any) -> None:
        if torch.is_grad_enabled() and (self.always or not getattr(layer, "gradient_checkpointing", False)):
            self.raised += 1
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB (simulated)")


def _trainer(tmp_path: Path, model_dir: Path, out: str, oom: _Oom | None, gc: bool | None = None) -> Trainer:
    cfg = toy_cfg(tmp_path, model_dir, out, "grpo", num_generations=4, max_steps=2)
    if gc is not None:
        cfg["model"]["gradient_checkpointing"] = gc
    t = Trainer(TrainerConfig.model_validate(cfg))
    t.setup()
    if oom is not None:
        t.accelerator.unwrap_model(t.model).model.layers[0].register_forward_pre_hook(oom)
    return t


def test_an_oom_in_the_first_step_is_retried_once_with_checkpointing_on(
        tmp_path: Path, tiny_model_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    oom = _Oom()
    t = _trainer(tmp_path, tiny_model_dir, "retried", oom)
    try:
        assert t.checkpointing.auto and not t.checkpointing.on  # CPU: auto is off
        assert "[launchgen] gradient_checkpointing off (auto: no GPU memory" in capsys.readouterr().out
        assert t.train() == 0
    finally:
        t.close()
    assert oom.raised == 1
    assert "retrying the step once with it on" in capsys.readouterr().out
    assert t.checkpointing.on and t.checkpointing.retried
    assert t.accelerator.unwrap_model(t.model).is_gradient_checkpointing
    # the retried step trained the same generation batch as a run with checkpointing on from the start
    ref = _trainer(tmp_path, tiny_model_dir, "on", None, gc=True)
    try:
        assert ref.train() == 0
    finally:
        ref.close()
    got, want = read_metrics(tmp_path / "retried"), read_metrics(tmp_path / "on")
    assert len(got) == len(want) == 2
    for key in ("loss", "grad_norm", "reward"):
        assert got[0][key] == pytest.approx(want[0][key], rel=1e-5, abs=1e-7), key


def test_a_second_oom_fails_the_run_and_an_explicit_false_is_not_retried(
        tmp_path: Path, tiny_model_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    always = _Oom(always=True)
    t = _trainer(tmp_path, tiny_model_dir, "again", always)
    try:
        with pytest.raises(torch.OutOfMemoryError):
            t.train()
    finally:
        t.close()
    assert always.raised == 2  # the first try and exactly one retry
    assert capsys.readouterr().out.count("retrying the step once") == 1
    off = _Oom()
    t = _trainer(tmp_path, tiny_model_dir, "off", off, gc=False)
    try:
        with pytest.raises(torch.OutOfMemoryError):
            t.train()
    finally:
        t.close()
    assert off.raised == 1 and "retrying" not in capsys.readouterr().out
