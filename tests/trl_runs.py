"""Run configs of `python -m launchgen.trainers.trl` for the CPU tests: each TRL entry on the tiny model, 2 steps,
with data of the kind it reads (prompts, SFT rows, preference pairs) written next to the run."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from launchgen.trainers.declarations.trl.entries import TRL_ENTRIES


def write_rows(path: Path, rows: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def data_for(kind: str, tmp_path: Path) -> Path:
    if kind == "prompt":
        return write_rows(tmp_path / "prompts.jsonl",
                          [{"prompt": f"Say {i} and 7", "answer": "7"} for i in range(16)])
    if kind == "preference":
        return write_rows(tmp_path / "pairs.jsonl",
                          [{"prompt": f"Say {i} and 7", "chosen": " 7 7", "rejected": f" {i}"} for i in range(16)])
    return write_rows(tmp_path / "chats.jsonl", [{"messages": [
        {"role": "user", "content": f"Say {i} and 7"}, {"role": "assistant", "content": f"{i} and 7"}]}
        for i in range(16)])


#: Per-entry TRL arguments that keep a CPU step small (TRL's field names).
_SMALL: dict[str, dict[str, Any]] = {
    "grpo": {"num_generations": 4, "max_completion_length": 6},
    "rloo": {"num_generations": 4, "max_completion_length": 6},
    "online_dpo": {"max_new_tokens": 6},
    "sft": {"max_length": 32},
    "dpo": {"max_length": 32},
    "gkd": {"max_length": 32, "max_new_tokens": 6},
    "async_grpo": {"num_generations": 4, "max_completion_length": 6},
}


def trl_cfg(tmp_path: Path, model: Path, name: str, **args: Any) -> dict[str, Any]:
    """A 2-step fp32 CPU run config of `name` (TRL's bf16 default is on, CPU included); `args` replaces TRL
    arguments."""
    entry = TRL_ENTRIES[name]
    base: dict[str, Any] = {
        "output_dir": str(tmp_path / "out"), "max_steps": 2, "per_device_train_batch_size": 4,
        "learning_rate": 1e-3, "use_cpu": True, "bf16": False, "logging_steps": 1, "save_steps": 100, "report_to": [],
        "seed": 0, **_SMALL[name],
    }
    if entry.teacher_field is not None:
        base[entry.teacher_field] = str(model)
    cfg: dict[str, Any] = {"trainer": f"trl.{name}", "model_name_or_path": str(model),
                           "data": {"path": str(data_for(entry.data, tmp_path))},
                           "save_final_model": False, "args": {**base, **args}}
    if entry.rewards:
        cfg["rewards"] = [{"name": "toy_rewards:target_fraction"}]
    return cfg


def metric_steps(out: Path) -> list[int]:
    return [json.loads(x)["step"] for x in (out / "metrics.jsonl").read_text().splitlines()]
