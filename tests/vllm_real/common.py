"""What the vllm_real tests share: a trainer-side backend on the test process, and the trainer's own recompute."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any, Protocol

import torch
import yaml
from launchgen.trainers.declarations.peft_config import FUSED_GROUPS
from launchgen.trainers.generation.vllm_client import VLLMClient
from launchgen.trainers.generation.vllm_server import VLLMServerBackend
from launchgen.trainers.generation.weight_transfer import NCCLTransport

from vllm_real.harness import REPO_ROOT, free_port

#: Processed logprobs of vLLM's float32 CPU path against the trainer's log_softmax(logits / T): measured
#: 5e-7 .. 2e-6 on the tiny model; this bound still fails on a single stale weight.
LOGPROB_TOL = 2e-5


class Served(Protocol):
    """A running server, real or stand-in: what `connect` needs of it."""

    port: int


class SingleProcess:
    """The accelerate attributes the backend reads, for one process."""

    is_main_process = True
    process_index = 0
    num_processes = 1
    device = torch.device("cpu")


def connect(server: Served, **over: Any) -> VLLMServerBackend:
    """A backend as `from_config` builds it: NCCL transport by default, swapped for gloo by the server's answer."""
    client = VLLMClient("127.0.0.1", server.port, request_timeout=over.pop("request_timeout", 120),
                        control_timeout=over.pop("control_timeout", 60))
    kwargs: dict[str, Any] = dict(num_generations=2, group_port=free_port(), health_timeout=240,
                                  weight_sync_timeout=60, control_timeout=60)
    kwargs.update(over)
    backend = VLLMServerBackend(SingleProcess(), client=client, transport=NCCLTransport(), **kwargs)
    backend.connect()
    return backend


def load_model(path: Path) -> Any:
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()


def perturb(model: Any, seed: int, scale: float = 0.05) -> None:
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=g) * scale)


def trainer_logprobs(model: Any, prompt: list[int], completion: list[int], temperature: float) -> list[float]:
    with torch.no_grad():
        logits = model(torch.tensor([prompt + completion])).logits[0].float() / temperature
    lp = torch.log_softmax(logits, dim=-1)
    return [lp[len(prompt) - 1 + i, t].item() for i, t in enumerate(completion)]


def max_logprob_gap(model: Any, prompt: list[int], completions: list[list[int]], logprobs: list[list[Any]],
                    temperature: float) -> float:
    gap = 0.0
    for completion, served in zip(completions, logprobs, strict=True):
        mine = trainer_logprobs(model, prompt, completion, temperature)
        assert len(served) == len(mine)
        gap = max([gap, *(abs(float(a) - b) for a, b in zip(served, mine, strict=True))])
    return gap


#: vLLM's fused linears (loaded by its `stacked_params_mapping`) and the transformers modules each concatenates
#: along dim 0 at TP 1, in that order: peft_config's FUSED_GROUPS are the same groups.
VLLM_FUSED = dict(zip(("qkv_proj", "gate_up_proj"), FUSED_GROUPS, strict=True))


def vllm_layout(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A transformers state dict under vLLM's names and fused layout (TP 1), to compare with `worker_ext`'s."""
    out = dict(state)
    for name in list(state):
        parent, _, rest = name.rpartition(".")
        module_path, _, leaf = parent.rpartition(".")
        for fused, members in VLLM_FUSED.items():
            if leaf == members[0]:
                parts = [out.pop(f"{module_path}.{m}.{rest}") for m in members]
                out[f"{module_path}.{fused}.{rest}"] = torch.cat(parts, dim=0)
    return out


# -- a trainer run through the bundled CLI, as a job script starts it -------------------------------------------

def trainer_config(tmp_path: Path, model: Path, server: Served, trainer: str, steps: int) -> dict[str, Any]:
    """A small run of `trainer` against `server` that learns the toy task and saves its final model."""
    data = tmp_path / "prompts.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"Say {i} and 7", "answer": "7"}) + "\n" for i in range(16)))
    return {
        "trainer": trainer,
        "output_dir": str(tmp_path / "out"),
        "precision": "fp32",
        "model": {"name_or_path": str(model)},
        "data": {"path": str(data)},
        "rewards": [{"name": "toy_rewards:target_fraction"}],
        "generation": {
            "backend": "vllm_server",
            "max_completion_length": 6,
            "vllm_server": {"host": "127.0.0.1", "port": server.port, "group_port": free_port(),
                            "health_timeout": 120, "weight_sync_timeout": 120, "control_timeout": 60},
        },
        "per_device_train_batch_size": 8,
        "num_generations": 4 if trainer == "grpo" else 2,
        "learning_rate": 0.02,
        "lr_scheduler_type": "constant",
        "max_steps": steps,
        "logging_steps": 1,
        "save_steps": 0,
        "report_to": ["jsonl"],
        "save_final_model": True,
    }


def trainer_command(tmp_path: Path, cfg: dict[str, Any]) -> tuple[list[str], dict[str, str]]:
    """argv and environment of the CLI run of `cfg` (its config written to tmp_path; tests/trainers' rewards)."""
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(cfg))
    env = dict(os.environ, TOKENIZERS_PARALLELISM="false",
               PYTHONPATH=os.pathsep.join([str(REPO_ROOT / "tests" / "trainers"), os.environ.get("PYTHONPATH", "")]))
    return [sys.executable, "-m", f"launchgen.trainers.{cfg['trainer']}", "--config", str(path)], env


def read_metrics(cfg: dict[str, Any]) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (Path(cfg["output_dir"]) / "metrics.jsonl").read_text().splitlines()]


def train(tmp_path: Path, cfg: dict[str, Any]) -> list[dict[str, Any]]:
    """Run `cfg` to the end; its metrics, one dict per logged step."""
    argv, env = trainer_command(tmp_path, cfg)
    run = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=540)
    assert run.returncode == 0, run.stderr[-4000:]
    return read_metrics(cfg)
