"""The trainer's config from the spec: `train.args` plus the fields the spec owns, validated as the trainer's own
`TrainerConfig` (pydantic only, cheap to import)."""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError

from launchgen import ports
from launchgen.issues import Issue, SpecError
from launchgen.loader import PYDANTIC_FIXES as _PYDANTIC_FIXES
from launchgen.loader import LoadedSpec, issues_from_validation
from launchgen.ownership import owned_args
from launchgen.planmodel import HEALTH_CLIENT_MARGIN_S, _err, _invariant
from launchgen.spec import Spec
from launchgen.trainers.config import TrainerConfig


def build_trainer_config(spec: Spec, precision: str, output_dir: str,
                         loaded: LoadedSpec | None = None) -> TrainerConfig:
    """The resolved TrainerConfig (train.args + what the spec owns); raises SpecError (LG901)."""
    import copy

    args = copy.deepcopy(spec.train.args)
    _invariant(not owned_args(args), "train.args sets a field the spec owns (LG902)")
    v, t, m = spec.vllm, spec.train, spec.model
    data: dict[str, Any] = {
        "trainer": t.trainer,
        "output_dir": output_dir,
        "precision": precision,
        "model": {
            "name_or_path": m.name_or_path,
            "revision": m.revision,
            "trust_remote_code": m.trust_remote_code,
            "dtype": m.dtype,
            "attn_implementation": t.attn_implementation,
            "use_liger_kernel": t.use_liger_kernel,
            "gradient_checkpointing": t.gradient_checkpointing,
        },
    }
    data.update(args)
    gen = data.setdefault("generation", {})
    if not isinstance(gen, dict):
        raise SpecError([_err("LG901", "train.args.generation", "must be a mapping",
                              "Write `generation:` as a mapping of generation settings.", loaded)])
    if v is None:
        gen["backend"] = "hf"
    elif v.mode == "server":
        gen["backend"] = "vllm_server"
        srv = gen.setdefault("vllm_server", {})
        if isinstance(srv, dict):
            # host and the ports are replaced at run time (--set); these are the base values
            srv.update({"port": v.port, "group_port": v.group_port,
                        "health_timeout": float(v.health_timeout + HEALTH_CLIENT_MARGIN_S)})
            if v.replicas > 1:
                srv["replicas"] = [{"host": "127.0.0.1", "port": ports.replica_port(v.port, k),
                                    "group_port": ports.replica_port(v.group_port, k)} for k in range(v.replicas)]
                srv["replica_failover"] = v.restart_replicas
    else:
        gen["backend"] = "vllm_colocate"
        col = gen.setdefault("vllm_colocate", {})
        if isinstance(col, dict):
            col.update({
                "tensor_parallel_size": v.tensor_parallel_size,
                "gpu_memory_utilization": v.gpu_memory_utilization if "gpu_memory_utilization"
                in v.model_fields_set else 0.3,
                "max_model_len": v.max_model_len,
                "enable_sleep_mode": v.enable_sleep_mode,
            })
            # only when set, so a spec that leaves them alone gets the engine's own defaults
            if v.kv_cache_memory_bytes is not None:
                col["kv_cache_memory_bytes"] = v.kv_cache_memory_bytes
            if v.enforce_eager:
                col["enforce_eager"] = True
    try:
        return TrainerConfig.model_validate(data)
    except ValidationError as exc:
        lines = loaded.lines if loaded is not None else {}
        file = loaded.path if loaded is not None else None
        found = issues_from_validation(exc, lines, file, prefix=("train", "args"), model=TrainerConfig)
        generic = _PYDANTIC_FIXES
        raise SpecError([Issue("LG901", i.path, i.message,
                               "Fix the trainer argument (fields of launchgen.trainers.config.TrainerConfig)."
                               if i.fix in generic else i.fix, "error", i.line, i.file) for i in found]) from None
