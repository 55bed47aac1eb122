"""Which trainer arguments the spec owns, and what launchgen writes into each: `train.args` may not set them
(LG902, or the contradiction check named in `checks.trainer_args_not_owned`), and
`trainer_config.build_trainer_config` fills them from `COPIED`.

The tables are read by the check that reports the mistake, by the plan that asserts it is absent, by
`launchgen schema` (which leaves them out of `train.args`) and by the trainer config's resolution. A new owned
argument is one row in an `OWNED_*` table and one `Copied` row (or a `NOT_COPIED` entry saying who sets it);
`tests/test_ownership.py` fails until both exist.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from launchgen import ports
from launchgen.planmodel import HEALTH_CLIENT_MARGIN_S

if TYPE_CHECKING:
    from launchgen.spec import Spec, VLLMSpec

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
}
OWNED_COLOCATE = {
    "tensor_parallel_size": "vllm.tensor_parallel_size",
    "gpu_memory_utilization": "vllm.gpu_memory_utilization",
    "max_model_len": "vllm.max_model_len",
    "enable_sleep_mode": "vllm.enable_sleep_mode",
    "kv_cache_memory_bytes": "vllm.kv_cache_memory_bytes",
    "enforce_eager": "vllm.enforce_eager",
}


#: Owned arguments launchgen does not write into the config file: who sets them instead.
NOT_COPIED = {
    "generation.vllm_server.host": "the job script, at run time (--set)",
    "generation.vllm_server.base_url": "nobody: host and port are used",
    "generation.vllm_server.group_host": "the trainer, from VLLM_HOST_IP (the job script sets it per node)",
}
#: colocate's gpu_memory_utilization when vllm.gpu_memory_utilization is unset (TRL's default in colocate mode).
COLOCATE_GPU_MEMORY_DEFAULT = 0.3
#: A `Copied.value` that leaves the argument to the trainer's own default.
SKIP = object()


@dataclass(frozen=True)
class Filled:
    """What the copied values derive from."""
    spec: Spec
    precision: str  # resolved (launchgen.precision.resolve_precision)
    output_dir: str  # the trainer's output_dir pattern (replaced at run time)

    @property
    def vllm(self) -> VLLMSpec:
        assert self.spec.vllm is not None  # the row's modes name only modes with a vllm section
        return self.spec.vllm


@dataclass(frozen=True)
class Copied:
    path: str  # relative to train.args
    value: Callable[[Filled], Any]  # SKIP: not written
    modes: tuple[str, ...] = ("server", "colocate", "none")  # vllm.mode, or "none" without a vllm section


_SERVER, _COLOCATE = ("server",), ("colocate",)
_BACKEND = {"server": "vllm_server", "colocate": "vllm_colocate", "none": "hf"}

def _replica_endpoints(f: Filled) -> Any:
    v = f.vllm
    if v.replicas <= 1:
        return SKIP
    return [{"host": "127.0.0.1", "port": ports.replica_port(v.port, k),
             "group_port": ports.replica_port(v.group_port, k)} for k in range(v.replicas)]


#: What launchgen writes into the trainer's config for each owned argument (in the vllm modes listed).
COPIED: tuple[Copied, ...] = (
    Copied("trainer", lambda f: f.spec.train.trainer),
    Copied("output_dir", lambda f: f.output_dir),
    Copied("precision", lambda f: f.precision),
    Copied("model.name_or_path", lambda f: f.spec.model.name_or_path),
    Copied("model.revision", lambda f: f.spec.model.revision),
    Copied("model.trust_remote_code", lambda f: f.spec.model.trust_remote_code),
    Copied("model.dtype", lambda f: f.spec.model.dtype),
    Copied("model.attn_implementation", lambda f: f.spec.train.attn_implementation),
    Copied("model.use_liger_kernel", lambda f: f.spec.train.use_liger_kernel),
    Copied("model.gradient_checkpointing", lambda f: f.spec.train.gradient_checkpointing),
    Copied("generation.backend", lambda f: _BACKEND[vllm_mode(f.spec)]),
    # host and the ports are replaced at run time (--set); these are the base values
    Copied("generation.vllm_server.port", lambda f: f.vllm.port, _SERVER),
    Copied("generation.vllm_server.group_port", lambda f: f.vllm.group_port, _SERVER),
    # longer than the supervisor's wait, so that the supervisor, which names the server's log, reports it
    Copied("generation.vllm_server.health_timeout",
           lambda f: float(f.vllm.health_timeout + HEALTH_CLIENT_MARGIN_S), _SERVER),
    # several servers: replica k's ports are the base ports shifted by k (launchgen.ports.replica_port)
    Copied("generation.vllm_server.replicas", _replica_endpoints, _SERVER),
    Copied("generation.vllm_colocate.tensor_parallel_size", lambda f: f.vllm.tensor_parallel_size, _COLOCATE),
    Copied("generation.vllm_colocate.gpu_memory_utilization",
           lambda f: f.vllm.gpu_memory_utilization if "gpu_memory_utilization" in f.vllm.model_fields_set
           else COLOCATE_GPU_MEMORY_DEFAULT, _COLOCATE),
    Copied("generation.vllm_colocate.max_model_len", lambda f: f.vllm.max_model_len, _COLOCATE),
    Copied("generation.vllm_colocate.enable_sleep_mode", lambda f: f.vllm.enable_sleep_mode, _COLOCATE),
    # only when set, so a spec that leaves them alone gets the engine's own defaults
    Copied("generation.vllm_colocate.kv_cache_memory_bytes",
           lambda f: SKIP if f.vllm.kv_cache_memory_bytes is None else f.vllm.kv_cache_memory_bytes, _COLOCATE),
    Copied("generation.vllm_colocate.enforce_eager", lambda f: True if f.vllm.enforce_eager else SKIP, _COLOCATE),
)


def vllm_mode(spec: Spec) -> str:
    return "none" if spec.vllm is None else spec.vllm.mode


def fill_owned(data: dict[str, Any], filled: Filled) -> None:
    """Write every `COPIED` value of this spec's mode into `data` (train.args without owned arguments), in place.
    A section the user wrote as something other than a mapping is left for the config's validation (LG901)."""
    mode = vllm_mode(filled.spec)
    for c in COPIED:
        if mode not in c.modes or (value := c.value(filled)) is SKIP:
            continue
        *parents, leaf = c.path.split(".")
        node: Any = data
        for part in parents:
            node = node.setdefault(part, {}) if isinstance(node, dict) else None
        if isinstance(node, dict):
            node[leaf] = value


def owned_paths() -> list[str]:
    """Every owned argument's path relative to train.args, in table order (what `launchgen schema` leaves out of
    the trainer config's schema for train.args)."""
    return [*OWNED_TOP, *(f"generation.{k}" for k in OWNED_GENERATION),
            *(f"generation.vllm_server.{k}" for k in OWNED_SERVER),
            *(f"generation.vllm_colocate.{k}" for k in OWNED_COLOCATE)]


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


def without_owned(args: Mapping[str, Any]) -> dict[str, Any]:
    """A copy of `args` without the arguments the spec owns (what the trainer's config is resolved from while
    LG902 reports them, so the checks still read the rest)."""
    out = copy.deepcopy(dict(args))
    for path, _ in owned_args(args):
        *parents, leaf = path.split(".")
        node = out
        for part in parents:
            node = node[part]
        del node[leaf]
    return out
