"""The toy task every loop test trains on: prompts that ask for a `7`, rewarded by toy_rewards.target_fraction."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def toy_data(tmp_path: Path) -> Path:
    p = tmp_path / "prompts.jsonl"
    p.write_text("\n".join(json.dumps({"prompt": f"Say {i} and 7", "answer": "7"}) for i in range(16)) + "\n")
    return p


def toy_cfg(tmp_path: Path, model: Path, out: str, trainer: str, **over: Any) -> dict[str, Any]:
    """A fast-learning fp32 CPU config (lr 0.02, 6-token completions, 12 steps); `over` replaces top-level keys."""
    cfg: dict[str, Any] = {
        "trainer": trainer,
        "output_dir": str(tmp_path / out),
        "precision": "fp32",
        "model": {"name_or_path": str(model)},
        "data": {"path": str(toy_data(tmp_path))},
        "rewards": [{"name": "toy_rewards:target_fraction"}],
        "generation": {"max_completion_length": 6},
        "per_device_train_batch_size": 16,
        "learning_rate": 0.02,
        "lr_scheduler_type": "constant",
        "max_steps": 12,
        "save_steps": 0,
        "report_to": ["jsonl"],
        "save_final_model": False,
    }
    cfg.update(over)
    return cfg


def read_metrics(out: Path) -> list[dict[str, Any]]:
    return [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]


def run_cfg(cfg: dict[str, Any]) -> int:
    from launchgen.trainers.core import run
    from launchgen.trainers.declarations.config import TrainerConfig

    return run(TrainerConfig.model_validate(cfg))
