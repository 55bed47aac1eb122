"""`generation.hf_engine` picks the plain-generation engine; `auto` takes the static-cache engine only where it
pays off and can work (CUDA, unsharded weights)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from launchgen.trainers.declarations.config import TrainerConfig
from launchgen.trainers.generation.backends import _static_cache_fits, make_backend


def _cfg(model_dir: Path, engine: str) -> TrainerConfig:
    return TrainerConfig.model_validate({
        "trainer": "grpo", "output_dir": "out", "precision": "fp32",
        "model": {"name_or_path": str(model_dir)}, "data": {"path": "d.jsonl"},
        "generation": {"hf_engine": engine},
    })


class _OnDevice(torch.nn.Module):
    def __init__(self, device: str) -> None:
        super().__init__()
        self.device_type = device

    def parameters(self, recurse: bool = True) -> Any:  # a parameter that reports the given device
        yield SimpleNamespace(device=SimpleNamespace(type=self.device_type))


@pytest.mark.parametrize(("device", "dist", "want"), [
    ("cuda", "NO", True), ("cuda", "MULTI_GPU", True), ("cuda", "DistributedType.FSDP", False),
    ("cuda", "DEEPSPEED", False), ("cpu", "NO", False),
])
def test_auto_takes_static_cache_only_on_cuda_with_unsharded_weights(device: str, dist: str, want: bool,
                                                                      tiny_model_dir: Path) -> None:
    acc = SimpleNamespace(distributed_type=dist)
    assert _static_cache_fits(_cfg(tiny_model_dir, "auto"), acc, _OnDevice(device)) is want


@pytest.mark.parametrize(("engine", "cls_name"), [
    ("auto", "HFGenerateBackend"), ("generate", "HFGenerateBackend"), ("static_cache", "FastGenerateBackend"),
])
def test_make_backend_honours_hf_engine_on_cpu(engine: str, cls_name: str, tiny_model_dir: Path) -> None:
    from accelerate import Accelerator
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    backend = make_backend(_cfg(tiny_model_dir, engine), Accelerator(cpu=True), model, tok)
    try:
        assert type(backend).__name__ == cls_name
    finally:
        backend.close()
