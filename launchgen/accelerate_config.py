"""The accelerate config file the trainer step passes to `accelerate launch` (per distributed backend)."""

from __future__ import annotations

from typing import Any

from launchgen.precision import MIXED_PRECISION


def accelerate_config(backend: str, precision: str, num_machines: int, num_processes: int,
                      device: str) -> dict[str, Any]:
    """The accelerate config file (num_machines/num_processes/machine_rank are also passed on the CLI)."""
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
