"""Which trainer arguments the spec owns: launchgen fills them in `plan.build_trainer_config`, so `train.args`
may not set them (LG902, or the contradiction check named in `checks.trainer_args_not_owned`).

One table, read by the check that reports the mistake and by the plan that asserts it is absent.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

#: `train.args` path (dotted, relative to train.args) -> the spec field that owns it.
OWNED_TOP = {
    "trainer": "train.trainer",
    "output_dir": "job.output_dir",
    "precision": "train.precision",
    "model": "model.* and train.attn_implementation / use_liger_kernel / gradient_checkpointing",
}
OWNED_GENERATION = {
    "backend": "vllm.mode (or no `vllm` section for plain generate)",
}
OWNED_SERVER = {
    "host": "vllm.bind / the allocation", "port": "vllm.port", "base_url": "vllm.port / vllm.bind",
    "group_port": "vllm.group_port", "group_host": "the allocation (VLLM_HOST_IP)",
    "health_timeout": "vllm.health_timeout", "replicas": "vllm.replicas and the allocation",
    "replica_failover": "vllm.restart_replicas",
}
OWNED_COLOCATE = {
    "tensor_parallel_size": "vllm.tensor_parallel_size",
    "gpu_memory_utilization": "vllm.gpu_memory_utilization",
    "max_model_len": "vllm.max_model_len",
    "enable_sleep_mode": "vllm.enable_sleep_mode",
    "kv_cache_memory_bytes": "vllm.kv_cache_memory_bytes",
    "enforce_eager": "vllm.enforce_eager",
}


def owned_args(args: Mapping[str, Any]) -> list[tuple[str, str]]:
    """(path relative to train.args, owning spec field) for every owned argument `args` sets, in table order."""
    found = [(k, by) for k, by in OWNED_TOP.items() if k in args]
    gen = args.get("generation")
    if not isinstance(gen, Mapping):
        return found
    found += [(f"generation.{k}", by) for k, by in OWNED_GENERATION.items() if k in gen]
    for section, table in (("vllm_server", OWNED_SERVER), ("vllm_colocate", OWNED_COLOCATE)):
        sub = gen.get(section)
        if isinstance(sub, Mapping):
            found += [(f"generation.{section}.{k}", by) for k, by in table.items() if k in sub]
    return found
