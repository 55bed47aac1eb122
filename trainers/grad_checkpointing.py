"""`model.gradient_checkpointing`: what the policy trains with, and the first step's out-of-memory retry.

`true` / `false` are taken as written. `auto` is decided at start by the plan's rule
(`shared.estimate.choose_checkpointing`), fed by the same mapping from this run's config
(`declarations.memory_setup`) with what only the running process knows: the GPU it got, its backend and process
count, the model's own config. The choice is printed, as `plan` prints its own.

When `auto` chose off and the first optimizer step still runs out of memory in its forward/backward passes (the
estimate's activations are a rough bound), `core.Trainer` retries that step once with checkpointing on over the
same generation batch (`modeling.enable_checkpointing`) and says so; a second out-of-memory ends the run (no requeue loop: only exit 75 requeues).
The retry needs every rank to take it, and one rank's out-of-memory leaves its peers inside DDP's all-reduce, so
it is for a single training process; with several, the error names the setting to change.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import torch
from launchgen.trainers.declarations import memory_setup
from launchgen.trainers.declarations.config import TrainerConfig

from launchgen.shared.estimate import GIB, CheckpointChoice, TrainBackend, choose_checkpointing
from launchgen.shared.modelshape import ModelShape


@dataclass(frozen=True)
class Checkpointing:
    on: bool
    auto: bool  # decided here, so the first step may retry with it on
    choice: CheckpointChoice | None = None
    why: str = ""  # auto without an estimate: why it stayed off
    retried: bool = False  # the first step ran out of memory and was retried with it on

    def line(self) -> str:
        if not self.auto:
            return f"[launchgen] gradient_checkpointing {'on' if self.on else 'off'} (as configured)"
        if self.choice is not None:
            return f"[launchgen] gradient_checkpointing {self.choice.describe()}"
        return f"[launchgen] gradient_checkpointing off (auto: {self.why})"

    def retrying(self) -> Checkpointing:
        return replace(self, on=True, retried=True)


def decide(cfg: TrainerConfig, shape: ModelShape | None, gpu_gib: float | None, *, backend: TrainBackend = "ddp",
           processes: int = 1, offload_optimizer: bool = False, offload_params: bool = False) -> Checkpointing:
    """The choice for `cfg` on a GPU of `gpu_gib` (None: no GPU, or an unknown size)."""
    value = cfg.model.gradient_checkpointing
    if value != "auto":
        return Checkpointing(on=bool(value), auto=False)
    if gpu_gib is None and cfg.memory_budget_gib is None:
        return Checkpointing(on=False, auto=True, why="no GPU memory to estimate against")
    if shape is None:
        return Checkpointing(on=False, auto=True, why="the model's config.json lacks the estimate's numbers")
    gen = cfg.generation
    colocated = (gen.vllm_colocate.gpu_memory_utilization * gpu_gib if gpu_gib is not None and cfg.facts.online
                 and gen.backend == "vllm_colocate" and not gen.vllm_colocate.enable_sleep_mode else 0.0)
    setup, _ = memory_setup.trainer_setup(cfg, shape, backend=backend, processes=processes,
                                          offload_optimizer=offload_optimizer, offload_params=offload_params,
                                          colocated_gib=colocated)
    choice = choose_checkpointing(shape, setup, gpu_gib, cfg.memory_budget_gib)
    if choice is None:
        return Checkpointing(on=False, auto=True, why="no GPU memory to estimate against")
    return Checkpointing(on=choice.on, auto=True, choice=choice)


def resolve(cfg: TrainerConfig, accelerator: Any) -> Checkpointing:
    """`decide` with this process's GPU, backend and the model's config (read before the weights load)."""
    if cfg.model.gradient_checkpointing != "auto":
        return decide(cfg, None, None)
    cuda = accelerator.device.type == "cuda"
    gpu_gib = torch.cuda.get_device_properties(accelerator.device).total_memory / GIB if cuda else None
    backend, offload_opt, offload_params = _backend(accelerator)
    return decide(cfg, _model_shape(cfg) if cuda or cfg.memory_budget_gib is not None else None, gpu_gib,
                  backend=backend, processes=accelerator.num_processes, offload_optimizer=offload_opt,
                  offload_params=offload_params)


def _model_shape(cfg: TrainerConfig) -> ModelShape | None:
    from launchgen.trainers.modeling import hub_offline
    from transformers import AutoConfig

    conf = AutoConfig.from_pretrained(cfg.model.name_or_path, revision=cfg.model.revision,
                                      trust_remote_code=cfg.model.trust_remote_code, local_files_only=hub_offline())
    return ModelShape.from_config(conf.to_dict(), cfg.model.name_or_path)


def _backend(accelerator: Any) -> tuple[TrainBackend, bool, bool]:
    """(backend, optimizer offloaded, parameters offloaded) as the estimate names them."""
    from accelerate.utils import DistributedType

    kind = accelerator.distributed_type
    if kind == DistributedType.DEEPSPEED:
        plugin = accelerator.state.deepspeed_plugin
        zero = (plugin.deepspeed_config or {}).get("zero_optimization", {}) if plugin is not None else {}

        def off(key: str) -> bool:
            return str((zero.get(key) or {}).get("device", "none")) not in ("none", "None")

        stage = int(zero.get("stage", 2) or 2)
        return ("deepspeed_zero3" if stage == 3 else "deepspeed_zero2"), off("offload_optimizer"), off("offload_param")
    if kind == DistributedType.FSDP:
        plugin = accelerator.state.fsdp_plugin
        cpu = bool(getattr(getattr(plugin, "cpu_offload", None), "offload_params", False))
        return "fsdp", cpu, cpu
    return "ddp", False, False
