"""The accelerate config file the trainer step passes to `accelerate launch` (per distributed backend)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from launchgen.input import specfiles
from launchgen.input.spec import DistributedSection
from launchgen.shared.precision import MIXED_PRECISION


def read_user_config(path: str) -> dict[str, Any]:
    """A user's accelerate config file (YAML mapping); LG633 reports what this raises before the plan is built."""
    try:
        data = yaml.safe_load(specfiles.read_text(path))
    except yaml.YAMLError as exc:
        raise ValueError(f"{path}: not YAML ({exc})") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a YAML mapping (an accelerate config file)")
    return data


def accelerate_config(backend: str, precision: str, num_machines: int, num_processes: int,
                      device: str, dist: DistributedSection | None = None) -> dict[str, Any]:
    """The accelerate config file (num_machines/num_processes/machine_rank are also passed on the CLI): the user's
    own file (`train.distributed.accelerate_config`) as the base, launchgen's keys over it, the knobs last."""
    dist = dist or DistributedSection()
    cfg = _generated(backend, precision, num_machines, num_processes, device)
    if dist.accelerate_config:
        user = read_user_config(dist.accelerate_config)
        for section in ("deepspeed_config", "fsdp_config"):
            if section in cfg and isinstance(user.get(section), dict):
                cfg[section] = {**cfg[section], **user[section]}  # the user's tuning wins over launchgen's defaults
        cfg = {**{k: v for k, v in user.items() if k not in ("deepspeed_config", "fsdp_config")}, **cfg}
    if "deepspeed_config" in cfg:
        ds = cfg["deepspeed_config"]
        if dist.deepspeed_config:
            # accelerate refuses a config file next to the knobs it owns: the file decides stage and offload
            ds = {"deepspeed_multinode_launcher": ds.get("deepspeed_multinode_launcher", "standard"),
                  "deepspeed_config_file": str(Path(dist.deepspeed_config).expanduser().resolve())}
            if ds_zero3_init(dist, backend) is not None:
                ds["zero3_init_flag"] = ds_zero3_init(dist, backend)
        else:
            if dist.offload_optimizer:
                ds["offload_optimizer_device"] = "cpu"
            if dist.offload_params:
                ds["offload_param_device"] = "cpu"
            if dist.zero3_init_flag is not None:
                ds["zero3_init_flag"] = dist.zero3_init_flag
        cfg["deepspeed_config"] = ds
    if "fsdp_config" in cfg and dist.offload_params:
        cfg["fsdp_config"]["fsdp_offload_params"] = True
    return cfg


def ds_zero3_init(dist: DistributedSection, backend: str) -> bool | None:
    """zero3_init_flag beside a DeepSpeed file: the user's, else true under ZeRO-3 (as without a file)."""
    if dist.zero3_init_flag is not None:
        return dist.zero3_init_flag
    return True if backend == "deepspeed_zero3" else None


def _generated(backend: str, precision: str, num_machines: int, num_processes: int, device: str) -> dict[str, Any]:
    mixed = MIXED_PRECISION[precision]
    cfg: dict[str, Any] = {
        "compute_environment": "LOCAL_MACHINE",
        "debug": False,
        "machine_rank": 0,
        "main_training_function": "main",
        "mixed_precision": mixed,
        "num_machines": num_machines,
        "num_processes": num_processes,
        "rdzv_backend": "static",
        "same_network": True,
        "use_cpu": device == "cpu",
    }
    if device == "cpu":
        cfg["distributed_type"] = "MULTI_CPU" if num_processes > 1 else "NO"
        return cfg
    cfg["gpu_ids"] = "all"
    if backend == "ddp":
        cfg["distributed_type"] = "MULTI_GPU" if num_processes > 1 else "NO"
    elif backend == "fsdp":
        cfg["distributed_type"] = "FSDP"
        cfg["fsdp_config"] = {
            "fsdp_version": 2,
            "fsdp_auto_wrap_policy": "TRANSFORMER_BASED_WRAP",
            "fsdp_cpu_ram_efficient_loading": True,
            "fsdp_offload_params": False,
            "fsdp_reshard_after_forward": True,
            "fsdp_state_dict_type": "SHARDED_STATE_DICT",
        }
    else:
        stage = 3 if backend == "deepspeed_zero3" else 2
        cfg["distributed_type"] = "DEEPSPEED"
        cfg["deepspeed_config"] = {
            "deepspeed_multinode_launcher": "standard",
            "offload_optimizer_device": "none",
            "offload_param_device": "none",
            "zero3_init_flag": stage == 3,
            "zero3_save_16bit_model": stage == 3,
            "zero_stage": stage,
        }
    return cfg
