"""The memory estimate's state terms against a real trainer on CPU (issue 26): after one optimizer step, the bytes
of the policy's parameters, its AdamW state and the reference model are what `launchgen/shared/estimate.py` says, for
full fine-tuning, LoRA and a KL reference; and the trainer's measured peak on CPU (the CPU allocator's own count,
as torch's profiler receives it) is the estimate's total within 20 %. The GPU rows: benchmarks/RESULTS.md."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from launchgen.trainers.core import Trainer
from launchgen.trainers.declarations import memory_setup
from launchgen.trainers.declarations.config import TrainerConfig
from toy_runs import toy_cfg

from launchgen.shared.estimate import GIB, TrainerSetup, allocated_gib, trainer_estimate
from launchgen.shared.modelshape import ModelShape
from launchgen.shared.precision import trainable_weight_dtype


def _bytes(tensors: Any) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def _part(e: Any, name: str) -> float:
    return sum(p.gib for p in e.parts if p.name.startswith(name)) * GIB


@pytest.mark.parametrize("variant", ["full", "lora", "reference"])
def test_state_bytes_match_the_trainer_after_a_step(tmp_path: Path, tiny_model_dir: Path, variant: str) -> None:
    over: dict[str, Any] = {"num_generations": 8, "max_steps": 1}
    if variant == "lora":
        over["peft"] = {"r": 8, "lora_alpha": 16, "lora_dropout": 0.0}
    if variant == "reference":
        over["beta"] = 0.04
    cfg = TrainerConfig.model_validate(toy_cfg(tmp_path, tiny_model_dir, "out", "grpo", **over))
    t = Trainer(cfg)
    t.setup()
    t._step()
    model = t.accelerator.unwrap_model(t.model)
    params = list(model.parameters())
    trainable = [p for p in params if p.requires_grad]
    frozen = [p for p in params if not p.requires_grad]
    moments = [v for st in t.optimizer.state.values() for k, v in st.items() if k in ("exp_avg", "exp_avg_sq")]

    shape = ModelShape.from_config(json.loads((tiny_model_dir / "config.json").read_text()))
    assert shape is not None
    if variant != "lora":
        assert shape.parameter_count() == sum(p.numel() for p in params)  # config.json's count is the model's
    setup, _ = memory_setup.trainer_setup(cfg, shape, backend="ddp", processes=1)  # what plan and trainer use
    e = trainer_estimate(shape, setup, None)
    if variant == "lora":
        assert _part(e, "frozen base") == pytest.approx(_bytes(frozen))
        assert shape.parameter_count() == sum(p.numel() for p in frozen)  # the base is the model
        assert _part(e, "adapters") == pytest.approx(_bytes(trainable) + _bytes(moments))
        assert _part(e, "adapter gradients") == pytest.approx(_bytes(trainable))
    else:
        assert _part(e, "weights") == pytest.approx(_bytes(params))
        assert _part(e, "AdamW state") == pytest.approx(_bytes(moments))
        assert _part(e, "gradients") == pytest.approx(_bytes(trainable))
    if variant == "reference":
        assert t.ref_model is not None
        assert _part(e, "reference model") == pytest.approx(_bytes(t.ref_model.parameters()))
    else:
        assert not any(p.name == "reference model" for p in e.parts)
    assert trainable and all(p.dtype == torch.float32 for p in trainable)  # fp32 run: adapters and weights alike


def test_a_real_run_logs_step_times_that_plan_from_run_reads(tmp_path: Path, tiny_model_dir: Path) -> None:
    from toy_runs import run_cfg

    from launchgen.readback.jobfiles import read_step_times

    job = tmp_path / "job"
    cfg = toy_cfg(tmp_path, tiny_model_dir, "job/trainer", "grpo", num_generations=8, max_steps=3)
    assert run_cfg(cfg) == 0
    times = read_step_times(job)
    assert len(times.seconds) == 2 and all(s > 0 for s in times.seconds)  # the first step is left out
    assert "time/step" in times.source and times.steps_done == 3


@pytest.mark.parametrize(("model", "precision", "peft", "want"), [
    ({}, "bf16", None, "float32"),  # auto: fp32 master weights for autocast
    ({"dtype": "bfloat16"}, "bf16", None, "bfloat16"),  # pure-bf16 training
    ({}, "bf16", {"r": 8}, "bfloat16"),  # LoRA: the frozen base needs no master copy
    ({}, "fp16", {"r": 8, "modules_to_save": ["embed_tokens"]}, "float32"),  # saved modules train in full
    ({"dtype": "float32"}, "fp32", None, "float32"),
])
def test_the_loaded_weight_dtype_has_one_owner(tmp_path: Path, model: dict[str, Any], precision: str,
                                               peft: dict[str, Any] | None, want: str) -> None:
    from launchgen.trainers.modeling import weight_dtype

    data = toy_cfg(tmp_path, tmp_path, "o", "grpo", precision=precision)
    data["model"].update(model)
    if peft is not None:
        data["peft"] = peft
    cfg = TrainerConfig.model_validate(data)
    assert trainable_weight_dtype(cfg.model.dtype, cfg.precision, lora=cfg.peft is not None,
                                  modules_to_save=bool(cfg.peft and cfg.peft.modules_to_save)) == want
    assert weight_dtype(cfg) == getattr(torch, want)


def test_fp16_weights_with_fp16_loss_scaling_are_refused(tmp_path: Path) -> None:
    from launchgen.trainers.declarations.errors import TrainerSetupError
    from launchgen.trainers.modeling import weight_dtype

    data = toy_cfg(tmp_path, tmp_path, "o", "grpo", precision="fp16")
    data["model"]["dtype"] = "float16"
    cfg = TrainerConfig.model_validate(data)
    with pytest.raises(TrainerSetupError, match="fp32 master weights"):
        weight_dtype(cfg)


def _cpu_peak_allocated(fn: Any) -> int:
    """The peak of the bytes torch's CPU allocator held while `fn` ran (the CPU's max_memory_allocated): the
    allocator reports every allocation and free to the profiler when profile_memory is on. The kineto event list
    is read, not `prof.events()`, which drops the reports it cannot attribute to an operator."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    reports = sorted((e.start_ns(), e.nbytes()) for e in prof.profiler.kineto_results.events()
                     if e.name() == "[memory]")
    assert len(reports) > 1000, "the profiler received no allocator reports"
    peak = held = 0
    for _, nbytes in reports:
        held += nbytes
        peak = max(peak, held)
    return peak


@pytest.mark.parametrize(("hidden", "layers", "rows", "checkpointing"), [
    (256, 4, 16, False),  # the log-prob head's tiles at the end of the forward pass make the peak
    (512, 6, 16, True),  # the backward pass's start: gradients plus one recomputed layer
    (384, 3, 32, False),  # many rows: the kept activations dominate
])
def test_the_trainers_measured_peak_on_cpu_is_the_estimate_within_20_percent(
        tmp_path: Path, hidden: int, layers: int, rows: int, checkpointing: bool) -> None:
    """Two fp32 GRPO steps from model load (the second holds AdamW state through its pass). Found here: the
    activations were counted in bf16 elements whatever the precision, half of an fp32 run's (estimate/measured
    0.61, 0.92 and 0.56 on these three before, 0.88, 0.96 and 0.86 after)."""
    from launchgen.trainers.tiny import build_tiny_model

    model_dir = build_tiny_model(tmp_path / "m", hidden_size=hidden, num_layers=layers, num_heads=hidden // 64,
                                 num_kv_heads=2, vocab_size=2048)
    data = toy_cfg(tmp_path, model_dir, "out", "grpo", num_generations=8, max_steps=2,
                   per_device_train_batch_size=rows, generation={"max_completion_length": 32})
    data["model"]["gradient_checkpointing"] = checkpointing
    cfg = TrainerConfig.model_validate(data)
    t = Trainer(cfg)

    def two_steps() -> None:
        t.setup()
        t._step()
        t._step()

    measured = _cpu_peak_allocated(two_steps)
    prompts = [json.loads(line)["prompt"] for line in Path(cfg.data.path).read_text().splitlines()]
    shape = ModelShape.from_config(json.loads((model_dir / "config.json").read_text()))
    assert shape is not None
    setup = TrainerSetup(
        backend="ddp", processes=1, precision=cfg.precision, weight_dtype="float32", rows=rows,
        gradient_checkpointing=checkpointing, completion_tokens=32,
        prompt_tokens=max(len(t.tokenizer(x)["input_ids"]) for x in prompts),
    )
    e = trainer_estimate(shape, setup, None)
    estimated = allocated_gib(e) * GIB  # what an allocator counts: no CUDA context on a CPU
    assert 0.8 <= estimated / measured <= 1.2, (estimated / measured, [(p.name, p.gib * 1024) for p in e.parts])
