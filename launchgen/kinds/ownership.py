"""What the topology decides in the trainer's config: one table (`OWNED`) of `Owned` rows, each the argument,
the spec field that owns it, what launchgen writes into it (or who sets it instead), and its policy as data:
`REFUSE` (the bundled loop's config fields: `train.args` may not set them, LG902, or the contradiction check named
in `checks.trainer_args_not_owned`) or `MATCH` (TRL's config fields: a user value equal to launchgen's is accepted,
a different one is LG921, `trl_config.trl_issues`).

The rows are read by the check that reports the mistake, by the plan that asserts it is absent, by `launchgen
schema` (which leaves the refused ones out of `train.args`), by the config's resolution (`fill_owned`,
`trl_config.run_config_data`) and by docs/trl-names.md. Each trainer kind (`kinds.registry`) takes the rows of its
policy. A new owned argument is one row; `COPIED` and `NOT_COPIED` are derived from the refused rows.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from launchgen.planning.model import HEALTH_CLIENT_MARGIN_S
from launchgen.shared import ports

if TYPE_CHECKING:
    from launchgen.input.spec import Spec, VLLMSpec

#: colocate's gpu_memory_utilization when vllm.gpu_memory_utilization is unset (TRL's default in colocate mode).
COLOCATE_GPU_MEMORY_DEFAULT = 0.3
#: A written value that leaves the argument to the trainer's own default (a `MATCH` row: decided at run time).
SKIP = object()


@dataclass(frozen=True)
class Policy:
    """What a user value for an owned argument meets: `code`, unless it equals launchgen's and `accepts_equal`."""
    code: Literal["LG902", "LG921"]
    accepts_equal: bool


#: The bundled loop's config: the spec owns the argument outright.
REFUSE = Policy("LG902", accepts_equal=False)
#: TRL's config fields: a TRL config carried over as it is keeps the values the topology gives them anyway.
MATCH = Policy("LG921", accepts_equal=True)


@dataclass(frozen=True)
class Filled:
    """What the written values derive from."""
    spec: Spec
    precision: str  # resolved (launchgen.shared.precision.resolve_precision)
    output_dir: str  # the trainer's output_dir pattern (replaced at run time)

    @property
    def vllm(self) -> VLLMSpec:
        assert self.spec.vllm is not None  # the row's modes name only modes with a vllm section
        return self.spec.vllm

    @property
    def mode(self) -> str:
        return vllm_mode(self.spec)


@dataclass(frozen=True)
class Copied:
    path: str  # relative to train.args
    value: Callable[[Filled], Any]  # SKIP: not written
    modes: tuple[str, ...] = ("server", "colocate", "none")  # vllm.mode, or "none" without a vllm section


_ALL = ("server", "colocate", "none")
_SERVER, _COLOCATE = ("server",), ("colocate",)
_BACKEND = {"server": "vllm_server", "colocate": "vllm_colocate", "none": "hf"}


@dataclass(frozen=True)
class Owned:
    """One trainer argument the topology decides: the field that owns it and, in one place, what launchgen does
    with it: writes `value` (in `modes`), writes `fills` into the fields of a section owned whole, or leaves it to
    `set_by`; and what a user value for it meets (`policy`)."""

    path: str  # relative to train.args (a TRL field, dotted into model_init_kwargs, for `MATCH` rows)
    owner: str  # the spec field(s) that own it, as LG902 / LG921 name them
    value: Callable[[Filled], Any] | None = None
    modes: tuple[str, ...] = _ALL
    fills: tuple[Copied, ...] = ()
    set_by: str | None = None
    policy: Policy = REFUSE

    def __post_init__(self) -> None:
        if sum((self.value is not None, bool(self.fills), self.set_by is not None)) != 1:
            raise ValueError(f"owned argument {self.path}: give exactly one of value, fills, set_by")

    @property
    def copied(self) -> tuple[Copied, ...]:
        return (Copied(self.path, self.value, self.modes),) if self.value is not None else self.fills


def _replica_endpoints(f: Filled) -> Any:
    v = f.vllm
    if v.replicas <= 1:
        return SKIP
    return [{"host": "127.0.0.1", "port": ports.replica_port(v.port, k),
             "group_port": ports.replica_port(v.group_port, k)} for k in range(v.replicas)]


def _colocate_memory(f: Filled) -> Any:
    v = f.vllm
    return v.gpu_memory_utilization if "gpu_memory_utilization" in v.model_fields_set else COLOCATE_GPU_MEMORY_DEFAULT


def _or_skip(value: Any) -> Any:
    return SKIP if value is None else value


def _checkpointing(f: Filled) -> bool:
    """TRL has no `auto`, and launchgen does not estimate TRL's trainers: under `auto` the TRL config's own value
    (a config carried over as it is), else TRL's default, on."""
    value = f.spec.train.gradient_checkpointing
    if value != "auto":
        return value
    user = f.spec.train.args.get("gradient_checkpointing")
    return user if isinstance(user, bool) else True


_S, _C = "generation.vllm_server.", "generation.vllm_colocate."
_PRECISION = {"bf16": (True, False), "fp16": (False, True), "fp32": (False, False)}
_VLLM_MODES = ("server", "colocate")
_RESOLVED = "vllm.port / vllm.bind (the job resolves the server's address at run time)"


def _trl(field: str, owner: str, value: Callable[[Filled], Any], modes: tuple[str, ...] = _ALL) -> Owned:
    """A TRL config field (a field the trainer's TRL config does not have is skipped)."""
    return Owned(field, owner, value, modes, policy=MATCH)


#: Every argument the topology decides, once: the bundled loop's in the order LG902 reports them and launchgen
#: writes them, then TRL's in the order LG921 reports them and docs/trl-names.md lists them.
OWNED: tuple[Owned, ...] = (
    Owned("trainer", "train.trainer", lambda f: f.spec.train.trainer),
    Owned("output_dir", "job.output_dir", lambda f: f.output_dir),
    Owned("precision", "train.precision", lambda f: f.precision),
    Owned("model", "model.* and train.attn_implementation / use_liger_kernel / gradient_checkpointing", fills=(
        Copied("model.name_or_path", lambda f: f.spec.model.name_or_path),
        Copied("model.revision", lambda f: f.spec.model.revision),
        Copied("model.trust_remote_code", lambda f: f.spec.model.trust_remote_code),
        Copied("model.dtype", lambda f: f.spec.model.dtype),
        Copied("model.attn_implementation", lambda f: f.spec.train.attn_implementation),
        Copied("model.use_liger_kernel", lambda f: f.spec.train.use_liger_kernel),
        Copied("model.gradient_checkpointing", lambda f: f.spec.train.gradient_checkpointing),
    )),
    Owned("generation.backend", "vllm.mode (or no `vllm` section for plain generate)",
          lambda f: _BACKEND[vllm_mode(f.spec)]),
    # host and the ports are replaced at run time (--set); these are the base values
    Owned(_S + "host", "vllm.bind / the allocation", set_by="the job script, at run time (--set)"),
    Owned(_S + "port", "vllm.port", lambda f: f.vllm.port, _SERVER),
    Owned(_S + "base_url", "vllm.port / vllm.bind", set_by="nobody: host and port are used"),
    Owned(_S + "group_port", "vllm.group_port", lambda f: f.vllm.group_port, _SERVER),
    Owned(_S + "group_host", "the allocation (VLLM_HOST_IP)",
          set_by="the trainer, from VLLM_HOST_IP (the job script sets it per node)"),
    # longer than the supervisor's wait, so that the supervisor, which names the server's log, reports it
    Owned(_S + "health_timeout", "vllm.health_timeout",
          lambda f: float(f.vllm.health_timeout + HEALTH_CLIENT_MARGIN_S), _SERVER),
    # several servers: replica k's ports are the base ports shifted by k (launchgen.shared.ports.replica_port)
    Owned(_S + "replicas", "vllm.replicas and the allocation", _replica_endpoints, _SERVER),
    # vllm.restart_replicas: the trainer sets a failed replica aside and takes it back once the script restarted it
    Owned(_S + "replica_failover", "vllm.restart_replicas",
          lambda f: f.vllm.restart_replicas if f.vllm.replicas > 1 else SKIP, _SERVER),
    Owned(_C + "tensor_parallel_size", "vllm.tensor_parallel_size", lambda f: f.vllm.tensor_parallel_size, _COLOCATE),
    Owned(_C + "gpu_memory_utilization", "vllm.gpu_memory_utilization", _colocate_memory, _COLOCATE),
    Owned(_C + "max_model_len", "vllm.max_model_len", lambda f: f.vllm.max_model_len, _COLOCATE),
    Owned(_C + "enable_sleep_mode", "vllm.enable_sleep_mode", lambda f: f.vllm.enable_sleep_mode, _COLOCATE),
    # only when set, so a spec that leaves them alone gets the engine's own defaults
    Owned(_C + "kv_cache_memory_bytes", "vllm.kv_cache_memory_bytes",
          lambda f: SKIP if f.vllm.kv_cache_memory_bytes is None else f.vllm.kv_cache_memory_bytes, _COLOCATE),
    Owned(_C + "enforce_eager", "vllm.enforce_eager", lambda f: True if f.vllm.enforce_eager else SKIP, _COLOCATE),
    _trl("output_dir", "job.output_dir", lambda f: f.output_dir),
    _trl("use_cpu", "train.device", lambda f: f.spec.train.device == "cpu"),
    _trl("bf16", "train.precision", lambda f: _PRECISION[f.precision][0]),
    _trl("fp16", "train.precision", lambda f: _PRECISION[f.precision][1]),
    _trl("use_liger_kernel", "train.use_liger_kernel", lambda f: f.spec.train.use_liger_kernel),
    _trl("gradient_checkpointing", "train.gradient_checkpointing", _checkpointing),
    _trl("trust_remote_code", "model.trust_remote_code", lambda f: f.spec.model.trust_remote_code),
    _trl("model_init_kwargs.trust_remote_code", "model.trust_remote_code", lambda f: f.spec.model.trust_remote_code),
    _trl("model_init_kwargs.revision", "model.revision", lambda f: _or_skip(f.spec.model.revision)),
    _trl("model_init_kwargs.dtype", "model.dtype", lambda f: f.spec.model.dtype),
    _trl("model_init_kwargs.attn_implementation", "train.attn_implementation",
         lambda f: _or_skip(f.spec.train.attn_implementation)),
    _trl("use_vllm", "vllm (a `vllm:` section turns it on)", lambda f: f.mode != "none"),
    _trl("vllm_mode", "vllm.mode", lambda f: f.mode, _VLLM_MODES),
    _trl("vllm_server_base_url", _RESOLVED, lambda f: SKIP, _SERVER),
    _trl("vllm_server_host", _RESOLVED, lambda f: SKIP, _SERVER),
    _trl("vllm_server_port", "vllm.port", lambda f: SKIP, _SERVER),
    _trl("vllm_group_port", "vllm.group_port", lambda f: SKIP, _SERVER),
    # longer than the supervisor's wait, so that the supervisor, which names the server's log, reports it
    _trl("vllm_server_timeout", f"vllm.health_timeout (+ {HEALTH_CLIENT_MARGIN_S} s)",
         lambda f: float(f.vllm.health_timeout + HEALTH_CLIENT_MARGIN_S), _SERVER),
    _trl("vllm_tensor_parallel_size", "vllm.tensor_parallel_size", lambda f: f.vllm.tensor_parallel_size, _COLOCATE),
    _trl("vllm_gpu_memory_utilization", "vllm.gpu_memory_utilization", _colocate_memory, _COLOCATE),
    _trl("vllm_enable_sleep_mode", "vllm.enable_sleep_mode", lambda f: f.vllm.enable_sleep_mode, _COLOCATE),
    _trl("vllm_max_model_length", "vllm.max_model_len", lambda f: _or_skip(f.vllm.max_model_len), _COLOCATE),
)


def rows(policy: Policy) -> tuple[Owned, ...]:
    """The rows of one policy (a trainer kind's, `kinds.registry`), in table order."""
    return tuple(o for o in OWNED if o.policy is policy)


#: The bundled loop's owned arguments (refused in train.args).
REFUSED: tuple[Owned, ...] = rows(REFUSE)
#: TRL's fields launchgen fills (a user value must match).
MATCHED: tuple[Owned, ...] = rows(MATCH)
#: What launchgen writes into the bundled trainer's config, derived from `REFUSED` (in the vllm modes listed).
COPIED: tuple[Copied, ...] = tuple(c for o in REFUSED for c in o.copied)
#: Owned arguments launchgen does not write into the config file: who sets them instead.
NOT_COPIED: dict[str, str] = {o.path: o.set_by for o in REFUSED if o.set_by is not None}


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
    return [o.path for o in REFUSED]


def lookup(args: Mapping[str, Any], path: str) -> tuple[bool, Any]:
    """(whether `args` sets the dotted `path`, its value); a section written as something other than a mapping
    sets nothing below it."""
    *parents, leaf = path.split(".")
    node: Any = args
    for part in parents:
        node = node.get(part) if isinstance(node, Mapping) else None
    if isinstance(node, Mapping) and leaf in node:
        return True, node[leaf]
    return False, None


def owned_args(args: Mapping[str, Any]) -> list[tuple[str, str]]:
    """(path relative to train.args, owning spec field) for every owned argument `args` sets, in table order."""
    return [(o.path, o.owner) for o in REFUSED if lookup(args, o.path)[0]]


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
