"""The memory estimate's state terms against a real trainer on CPU (issue 26): after one optimizer step, the bytes
of the policy's parameters, its AdamW state and the reference model are what `launchgen/estimate.py` says, for
full fine-tuning, LoRA and a KL reference. (Peak activations need a GPU's allocator: benchmarks/RESULTS.md.)"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from launchgen.trainers.config import TrainerConfig
from launchgen.trainers.core import Trainer
from toy_runs import toy_cfg

from launchgen.estimate import GIB, ModelShape, TrainerSetup, trainer_estimate
from launchgen.estimate_spec import lora_targets, needs_reference_copy
from launchgen.precision import trainable_weight_dtype


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
    peft = cfg.peft
    setup = TrainerSetup(
        backend="ddp", processes=1, precision=cfg.precision,
        weight_dtype=trainable_weight_dtype(cfg.model.dtype, cfg.precision, lora=peft is not None,
                                            modules_to_save=bool(peft and peft.modules_to_save)),
        lora_r=None if peft is None else peft.r,
        lora_targets=() if peft is None else lora_targets(shape, peft.target_modules),
        reference_copy=needs_reference_copy(cfg), rows=cfg.per_device_train_batch_size,
    )
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

    from launchgen.jobfiles import read_step_times

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
    from launchgen.trainers.errors import TrainerSetupError
    from launchgen.trainers.modeling import weight_dtype

    data = toy_cfg(tmp_path, tmp_path, "o", "grpo", precision="fp16")
    data["model"]["dtype"] = "float16"
    cfg = TrainerConfig.model_validate(data)
    with pytest.raises(TrainerSetupError, match="fp32 master weights"):
        weight_dtype(cfg)
