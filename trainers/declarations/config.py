"""The resolved trainer config: what `launchgen render` writes into the job, and what a user may write by hand.

`python -m launchgen.trainers.grpo --config run.yaml` reads exactly this model. It imports only pydantic
(never torch), so `launchgen check` and `render` can validate trainer arguments on a login node.

Names follow TRL's configs (GRPOConfig / RLOOConfig) wherever TRL has the knob, so users can carry their
settings over; defaults are TRL 1.16's unless a field's description says otherwise.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Literal

import yaml
from launchgen.trainers.declarations.algorithm_options import ordered_dump
from launchgen.trainers.declarations.capabilities import CAPABILITIES
from launchgen.trainers.declarations.declaration import (
    DeclaredConfig,
    any_config_adapter,
    config_class,
    declared,
    facts_of,
    names_where,
    spoken_list,
)
from launchgen.trainers.declarations.peft_config import PeftSection, combination_errors
from pydantic import BaseModel, ConfigDict, Field, model_validator

from launchgen.shared import ports

Precision = Literal["bf16", "fp16", "fp32"]
LossType = Literal["grpo", "dapo", "dr_grpo", "bnpo", "cispo", "sapo", "luspo", "vespo", "sigmoid", "ipo"]
DPO_LOSS_TYPES = frozenset({"sigmoid", "ipo"})
ScaleRewards = Literal["group", "batch", "none"]
ISMode = Literal["token_truncate", "token_mask", "sequence_truncate", "sequence_mask"]
Backend = Literal["vllm_server", "vllm_colocate", "hf"]
ReportTarget = Literal["jsonl", "tensorboard", "wandb"]
#: The `trainer` field's description (each config class narrows the field to its own name).
TRAINER_DOC = "The trainer this config is for (its config class in launchgen.trainers.declarations.configs picks the defaults)."
_DEFAULT_REPORT_TO: tuple[ReportTarget, ...] = ("jsonl", "tensorboard")

#: Built-in attention implementations transformers accepts by name.
BUILTIN_ATTN = frozenset(
    {"eager", "sdpa", "flash_attention_2", "flash_attention_3", "flex_attention", "paged_attention"}
)
#: `org/repo[@revision][:function]`, the form transformers' hub-kernel loader accepts.
#: Anchored with \A...\Z and without blanks: `$` would accept a trailing newline even under re.match.
HUB_KERNEL_RE = re.compile(r"\A(?:[^/:|\s]+\|)?[^/:@\s]+/[^/:@\s]+(?:@[^/:@\s]+)?(?::[^/:@\s]+)?\Z")


class _Strict(BaseModel):
    # built with the trainer config that holds it, on first validation: not on import (login-node verbs)
    model_config = ConfigDict(extra="forbid", frozen=False, validate_default=True, defer_build=True)


class ModelSection(_Strict):
    name_or_path: str = Field(description="Hub model id or local directory (must be in the local cache on offline nodes).")
    revision: str | None = Field(default=None, description="Hub revision (branch, tag or commit) to load.")
    trust_remote_code: bool = Field(default=False, description="Allow the model repo's own modeling code.")
    dtype: Literal["auto", "bfloat16", "float16", "float32"] = Field(
        default="auto", description="dtype the weights are loaded in; `auto` follows the precision setting."
    )
    attn_implementation: str | None = Field(
        default=None,
        description="Built-in (`sdpa`, `eager`, `flash_attention_2`, ...) or a Hub kernel `org/repo[@revision]`.",
    )
    use_liger_kernel: bool = Field(
        default=False, description="Patch the model with Liger ops and use Liger's fused linear GRPO loss."
    )
    liger_grpo_loss: bool = Field(
        default=False,
        description="With use_liger_kernel: compute the GRPO loss with Liger's fused linear GRPO loss instead of the "
        "trainer's chunked log-prob head (TRL 1.16 also uses a chunked head; Liger's walks the batch one sequence at "
        "a time and is ~4x slower at 151k vocab).",
    )
    gradient_checkpointing: bool | Literal["auto"] = Field(
        default="auto",
        description="Trade compute for activation memory. `auto`: on when the memory estimate of the training peak "
        "without it exceeds 90 % of the GPU (or memory_budget_gib), decided at start and logged; an out-of-memory "
        "in the first step then retries that step once with it on.",
    )
    logits_chunk_mib: int = Field(
        default=256, ge=1,
        description="fp32 logits per chunk of the log-prob head (the vocab x length logits are never whole; each chunk "
        "is recomputed in backward). Smaller lowers peak memory at large vocabularies, at the cost of reading the LM "
        "head weight once more per chunk.",
    )
    compile: bool | Literal["auto"] = Field(
        default="auto",
        description="torch.compile each decoder layer (one compiled graph shared by all layers; fuses norms, RoPE, "
        "SwiGLU and residual adds) and the log-prob head's tile math. `auto` on CUDA: the head always, the layers for "
        "a single process or DDP without Liger (its kernels are already fused); the first step pays the compile.",
    )

    @model_validator(mode="after")
    def _attn_syntax(self) -> ModelSection:
        a = self.attn_implementation
        if a is not None and a not in BUILTIN_ATTN and not HUB_KERNEL_RE.match(a):
            raise ValueError(
                f"attn_implementation {a!r} is neither a built-in ({', '.join(sorted(BUILTIN_ATTN))}) "
                "nor a Hub kernel of the form org/repo[@revision]"
            )
        return self


class DataSection(_Strict):
    path: str = Field(
        description="Local .jsonl/.json/.parquet file, a `datasets` save_to_disk folder (a DatasetDict uses `split`), "
        "or a Hub data set name (needs the `datasets` package)."
    )
    split: str = Field(default="train", description="Split of a Hub data set.")
    config_name: str | None = Field(default=None, description="Hub data set configuration name.")
    prompt_column: str = Field(default="prompt", description="Column holding the prompt (text or chat messages).")
    column_mapping: dict[str, str] = Field(
        default_factory=dict, description="Rename columns before use: {source_name: target_name}."
    )
    system_prompt: str | None = Field(default=None, description="Prepended as a system message for chat templates.")
    max_prompt_length: int | None = Field(default=None, ge=1, description="Left-truncate prompts to this many tokens.")
    shuffle: bool = Field(default=True, description="Shuffle prompts each epoch (seeded).")


class RewardSpec(_Strict):
    name: str | None = Field(
        default=None,
        description="Built-in (`accuracy`, `format`, `length`) or `package.module:function` with TRL's call "
        "convention f(prompts, completions, **columns) -> list[float | None]; with `model`, the metric name "
        "(default: the model folder's name).",
    )
    model: str | None = Field(
        default=None,
        description="A sequence-classification reward model (local folder or Hub id, one output): scores prompt + "
        "completion (its chat template for conversational data), batched, on the trainer's device, bf16 on GPU.",
    )
    batch_size: int = Field(default=32, ge=1, description="With `model`: completions per forward pass.")
    weight: float = Field(default=1.0, description="Weight in the weighted sum of rewards.")
    kwargs: dict[str, Any] = Field(default_factory=dict, description="Extra keyword arguments for the function.")

    @model_validator(mode="after")
    def _one_source(self) -> RewardSpec:
        if self.name is None and self.model is None:
            raise ValueError("a reward needs `name` (a function) or `model` (a reward model)")
        return self


class ReplicaAddress(_Strict):
    """One `vllm serve` replica: its HTTP endpoint and the port trainer rank 0 hosts its weight-transfer group on."""

    host: str = Field(description="Address of this replica's `vllm serve`.")
    port: int = Field(ge=1, le=65535, description="HTTP port of this replica.")
    group_port: int = Field(ge=1, le=65535, description="Weight-transfer rendezvous port for this replica's group.")


class VLLMServerSection(_Strict):
    host: str = Field(default="127.0.0.1", description="Address of the `vllm serve` process.")
    port: int = Field(default=ports.SERVER_HTTP_DEFAULT, ge=1, le=65535, description="HTTP port of the server.")
    base_url: str | None = Field(default=None, description="Overrides host and port when set.")
    group_port: int = Field(
        default=ports.GROUP_DEFAULT, ge=1, le=65535,
        description="Port trainer rank 0 binds for the NCCL weight-transfer rendezvous (the server connects to it).",
    )
    group_host: str | None = Field(
        default=None,
        description="Address the server's workers use to reach trainer rank 0; default: VLLM_HOST_IP or this host's IP.",
    )
    health_timeout: float = Field(default=240.0, gt=0, description="Seconds to wait for /health before giving up.")
    request_timeout: float = Field(default=600.0, gt=0, description="Seconds for one generation request.")
    weight_sync_timeout: float = Field(default=1800.0, gt=0, description="Seconds for one weight update.")
    control_timeout: float = Field(default=300.0, gt=0, description="Seconds for control calls (start/finish/reset).")
    rendezvous_timeout: float = Field(
        default=180.0, gt=0,
        description="Seconds for the weight-transfer rendezvous (the group init, both ends): a server whose workers "
        "cannot reach trainer rank 0's group port fails the run after this, naming both ends.",
    )
    replicas: list[ReplicaAddress] = Field(
        default_factory=list,
        description="Several independent servers (launchgen's `vllm.replicas`): prompt groups are spread over them and "
        "every weight update goes to all of them. Empty: the one server at host/port/group_port.",
    )
    replica_failover: bool = Field(
        default=False,
        description="With several replicas: a replica that fails is set aside (generation continues on the others) "
        "and taken back, with the current weights pushed first, once it is healthy again at a weight sync "
        "(launchgen's `vllm.restart_replicas`). Off: a failed replica fails the run.",
    )

    @model_validator(mode="after")
    def _distinct_replicas(self) -> VLLMServerSection:
        ports = [r.group_port for r in self.replicas]
        if len(set(ports)) != len(ports):
            raise ValueError(f"replicas: every replica needs its own group_port (got {ports})")
        return self


class VLLMColocateSection(_Strict):
    tensor_parallel_size: int = Field(default=1, ge=1, description="TP size of the in-process engine.")
    gpu_memory_utilization: float = Field(default=0.3, gt=0, le=1, description="Fraction of each GPU for vLLM.")
    max_model_len: int | None = Field(default=None, ge=1, description="Context length of the engine.")
    enable_sleep_mode: bool = Field(default=False, description="Sleep (level 2) between generations.")
    max_num_batched_tokens: int = Field(default=4096, ge=1, description="vLLM scheduler token budget.")
    kv_cache_memory_bytes: int | None = Field(
        default=None, ge=1,
        description="KV cache size in bytes (vLLM's `kv_cache_memory_bytes`); on CPU vLLM's default takes 90 % "
        "of the RAM, on GPU it replaces gpu_memory_utilization's share for the cache.",
    )
    enforce_eager: bool = Field(default=False, description="No CUDA graphs / torch.compile in the engine.")


class ImportanceSamplingSection(_Strict):
    enabled: bool = Field(default=True, description="Correct for vLLM/trainer log-prob mismatch (GRPO with vLLM).")
    mode: ISMode = Field(default="sequence_mask", description="Truncated or masked, per token or per sequence.")
    clip_max: float | None = Field(default=3.0, gt=0, description="C_max.")
    clip_min: float | None = Field(default=None, ge=0, description="C_min; must be below C_max.")
    sequence_reduction: Literal["sum", "mean"] = Field(
        default="sum",
        description="sequence_* modes: `sum` of token log-ratios (TRL: a product, masks long completions easily) "
        "or `mean` (geometric mean of the token ratios, length-independent).",
    )

    @model_validator(mode="after")
    def _bounds(self) -> ImportanceSamplingSection:
        if self.clip_min is not None and self.clip_max is not None and self.clip_min >= self.clip_max:
            raise ValueError("clip_min must be below clip_max")
        if self.mode.endswith("_truncate") and self.clip_min is None and self.clip_max is None:
            raise ValueError(f"mode {self.mode} needs clip_min or clip_max")
        return self


class GenerationSection(_Strict):
    backend: Backend = Field(default="hf", description="`vllm_server`, `vllm_colocate` or `hf` (plain generate).")
    hf_engine: Literal["auto", "static_cache", "generate"] = Field(
        default="auto",
        description="Engine of the `hf` backend: `static_cache` (preallocated KV cache, CUDA-graph decode; "
        "unsharded weights only), `generate` (transformers' generate), `auto` (static_cache on CUDA with "
        "unsharded weights, else generate).",
    )
    max_completion_length: int = Field(default=256, ge=1, description="Max new tokens per completion.")
    keep_kv_cache: bool | Literal["lend"] = Field(
        default="lend",
        description="`hf` backend, static_cache engine: what the KV cache (and LoRA's merged weights) do between "
        "generation calls. `lend`: their memory goes back to the allocator for training and is taken again next call, "
        "the captured CUDA graphs replaying where it comes back at the same address; true: held (training cannot use "
        "it); false: freed with the graphs and recaptured every call (a few ms per length bucket).",
    )
    temperature: float = Field(
        default=1.0, gt=0, description="Sampling temperature; online_dpo uses 0.9 (TRL's OnlineDPOConfig) when unset."
    )
    top_p: float = Field(default=1.0, gt=0, le=1, description="Nucleus sampling: keep the smallest set of tokens of this total probability.")
    top_k: int = Field(default=0, ge=0, description="0 disables top-k.")
    min_p: float = Field(default=0.0, ge=0, le=1, description="Drop tokens below this fraction of the most likely token's probability.")
    repetition_penalty: float = Field(default=1.0, gt=0, description=">1 discourages tokens already in the prompt or completion.")
    generation_kwargs: dict[str, Any] = Field(default_factory=dict, description="Merged into the vLLM request last.")
    vllm_server: VLLMServerSection = Field(default_factory=VLLMServerSection)
    vllm_colocate: VLLMColocateSection = Field(default_factory=VLLMColocateSection)
    importance_sampling: ImportanceSamplingSection = Field(default_factory=ImportanceSamplingSection)
    max_staleness: int = Field(
        default=0, ge=0,
        description="Bounded staleness: with k >= 1 the next generation batches are generated (on the server) while "
        "the current one trains, from weights at most k optimizer steps old; the importance-sampling correction "
        "covers the difference. 0: generate, then train (synchronous). vllm_server backend and grpo only.",
    )
    in_flight_at_push: Literal["finish", "pause"] = Field(
        default="finish",
        description="With max_staleness >= 1, what a weight push does with generation still in flight: `finish` "
        "waits for it, `pause` freezes it in place (`/pause?mode=keep` ... `/resume`) and lets it continue with the "
        "new weights. See benchmarks/RESULTS.md for what each costs.",
    )


def staleness_refusals(trainer: str, backend: str, correction_enabled: bool) -> list[tuple[str, str, str]]:
    """Why `generation.max_staleness >= 1` cannot be honoured, as (reason, field, message); [] when it can.

    The one owner of these rules: the trainer config refuses the first, `launchgen check` reports each
    (launchgen.checks.spec.staleness, LG350-LG352). Reasons: `backend` (no separate engine to generate ahead on),
    `trainer` (its loss has no sampler/trainer correction), `correction` (the correction is switched off).
    """
    out = []
    caps = CAPABILITIES.get(backend)
    if caps is None or not caps.generates_ahead:
        out.append(("backend", "generation.backend",
                    f"generation.max_staleness needs the vllm_server backend (a server that generates while the "
                    f"trainer trains); {backend} generates with the trainer's own weights or GPUs"))
    facts = facts_of(trainer)
    if facts is None or not facts.corrects_stale_samples:
        able = names_where(lambda f: f.corrects_stale_samples)
        out.append(("trainer", "trainer",
                    f"generation.max_staleness needs an importance-sampling correction of stale samples, which "
                    f"{trainer} does not have (only {', '.join(sorted(able))})"))
    elif not correction_enabled:
        out.append(("correction", "generation.importance_sampling.enabled",
                    "generation.max_staleness generates from older weights than it trains: the importance-sampling "
                    "correction must stay enabled"))
    return out


class TrainerConfig(DeclaredConfig):
    """The config of the trainers that run the bundled loop (`core.Trainer`): one subclass per trainer in
    `launchgen.trainers.declarations.configs`, chosen by `trainer` (`TrainerConfig.model_validate` picks it)."""

    model_config = ConfigDict(extra="forbid", frozen=False, validate_default=True)

    trainer: str = Field(description=TRAINER_DOC)
    output_dir: str = Field(description="Checkpoints, metrics.jsonl and the final model go here.")
    seed: int = Field(
        default=42,
        description="Random seed (torch's is offset by the process index; the prompt order is the same on every process).",
    )
    precision: Precision = Field(default="bf16", description="bf16 (Ampere+), fp16 with loss scaling, or fp32.")
    model: ModelSection
    data: DataSection
    rewards: list[RewardSpec] = Field(
        default_factory=lambda: [RewardSpec(name="accuracy")],
        description="Reward functions, summed with their weights (online trainers).",
    )
    generation: GenerationSection = Field(default_factory=GenerationSection)
    peft: PeftSection | None = Field(
        default=None,
        description="Train LoRA adapters instead of the full model (see launchgen.trainers.declarations.peft_config); the "
        "frozen base is loaded in the compute dtype when model.dtype is auto.",
    )

    # algorithm (TRL names)
    num_generations: int | None = Field(
        default=None, ge=2, description="Completions per prompt (GRPO 8, RLOO 2, online_dpo 2 and only 2)."
    )
    beta: float | None = Field(
        default=None, ge=0,
        description="KL coefficient (GRPO 0.0, RLOO 0.05); online_dpo: DPO's beta (0.1, must be > 0).",
    )
    loss_type: LossType = Field(
        default="dapo",
        description="GRPO loss (TRL 1.16): grpo, dapo, dr_grpo, bnpo (normalisers of the clipped loss), cispo, sapo, "
        "luspo, vespo; online_dpo: sigmoid (default when unset) or ipo.",
    )
    epsilon: float = Field(default=0.2, gt=0, description="Lower clip range.")
    epsilon_high: float | None = Field(default=None, gt=0, description="Upper clip range; defaults to epsilon.")
    scale_rewards: ScaleRewards = Field(default="group", description="Std scaling of GRPO advantages.")
    num_iterations: int = Field(default=1, ge=1, description="Optimisation passes per generation batch.")
    use_bias_correction_kl: bool = Field(default=True, description="Multiply the k3 KL by the (live) ratio.")
    normalize_advantages: bool = Field(default=False, description="RLOO: whiten advantages over the batch.")
    reward_clip_range: tuple[float, float] | None = Field(default=None, description="RLOO: clamp rewards.")
    mask_truncated_completions: bool = Field(default=False, description="Zero the loss of completions cut at max length.")

    # optimisation
    learning_rate: float = Field(
        default=1e-6, gt=0, description="AdamW learning rate; when unset: sft 2e-5, online_dpo 5e-7 (TRL's defaults)."
    )
    lr_scheduler_type: Literal["constant", "linear", "cosine", "constant_with_warmup"] = Field(
        default="linear", description="Learning-rate schedule over max_steps (after warmup_steps)."
    )
    warmup_steps: int = Field(default=0, ge=0, description="Optimizer steps of linear warm-up from 0.")
    weight_decay: float = Field(default=0.0, ge=0, description="AdamW weight decay.")
    adam_beta1: float = Field(default=0.9, gt=0, lt=1, description="AdamW beta1.")
    adam_beta2: float = Field(default=0.999, gt=0, lt=1, description="AdamW beta2.")
    adam_epsilon: float = Field(default=1e-8, gt=0, description="AdamW epsilon.")
    max_grad_norm: float = Field(default=1.0, ge=0, description="0 disables clipping.")
    per_device_train_batch_size: int = Field(
        default=8, ge=1,
        description="Completions per device per micro-batch (online_dpo: even, 2 per prompt; sft: sequences).",
    )
    gradient_accumulation_steps: int = Field(default=1, ge=1, description="Micro-batches per optimizer step.")
    max_tokens_per_forward: int | None = Field(
        default=None, ge=1,
        description="Split each micro-batch into forward/backward passes of at most this many tokens (rows x padded "
        "length; at least one row, online_dpo one pair). The gradient is the micro-batch's (same loss normalisation), "
        "only activation memory shrinks. null: the whole micro-batch in one pass, as TRL.",
    )
    memory_budget_gib: float | None = Field(
        default=None, gt=0,
        description="Peak device memory (GiB, allocated) one training process should fit: the trainer measures its "
        "weights, gradients and optimizer state, estimates a pass's activations and sets max_tokens_per_forward "
        "(and, when tight, model.logits_chunk_mib) to fit, printing the choice at start. Memory-only: the gradient is "
        "the same. null: the knobs as set.",
    )
    steps_per_generation: int | None = Field(default=None, ge=1, description="Defaults to gradient_accumulation_steps.")
    max_steps: int = Field(default=100, ge=1, description="Optimizer steps to run (unless num_train_epochs is set).")
    num_train_epochs: float | None = Field(
        default=None, gt=0,
        description="When set, train this many passes over the data (fractions allowed) instead of max_steps: the "
        "step count is ceil(epochs x rows / rows per optimizer step), rows being prompts (online trainers) or "
        "examples (sft), known once the data and the process count are (the trainer prints it).",
    )

    # sft
    max_length: int | None = Field(
        default=1024, ge=2, description="sft: truncate each tokenized example to this many tokens (null: no limit)."
    )
    completion_only_loss: bool = Field(
        default=True,
        description="sft: loss only on the completion (prompt/completion rows) or the assistant turns (`messages` "
        "rows); false trains on every token. `text` rows always train on every token.",
    )

    # checkpoints and logs
    save_strategy: Literal["steps", "epoch", "no"] = Field(
        default="steps",
        description="When to checkpoint besides on a signal and at the end (those two always happen: requeue and "
        "the completion marker rely on them): `steps` every save_steps, `epoch` at each pass over the data, `no` never.",
    )
    save_steps: int = Field(default=50, ge=0, description="Checkpoint every N optimizer steps (0: only on signal/end).")
    save_total_limit: int | None = Field(default=2, ge=1, description="Keep at most N checkpoints.")
    save_final_model: bool = Field(default=True, description="Write the final model to output_dir/final.")
    eval_data: DataSection | None = Field(
        default=None,
        description="Evaluation prompts (same fields as `data`; online trainers): each evaluation generates "
        "num_generations completions per prompt with the training sampling settings and logs their reward metrics "
        "under `eval/`.",
    )
    eval_strategy: Literal["no", "steps"] = Field(
        default="no", description="`steps`: evaluate on eval_data every eval_steps optimizer steps and after the last."
    )
    eval_steps: int | None = Field(default=None, ge=1, description="Steps between evaluations (default: logging_steps).")
    logging_steps: int = Field(
        default=1, ge=1, description="Log every N optimizer steps (each key averaged over the window, as TRL)."
    )
    report_to: list[ReportTarget] = Field(
        default_factory=lambda: list(_DEFAULT_REPORT_TO),
        description="Where metrics go besides the trainer log's plain line per logging step: `jsonl` "
        "(output_dir/metrics.jsonl; always written), `tensorboard` (output_dir/runs; warns once when not installed), "
        "`wandb` (the launchgen[wandb] extra; WANDB_MODE=offline writes output_dir/wandb without network).",
    )
    run_name: str | None = Field(default=None, description="Name of the wandb run (default: wandb's own).")
    resume: Literal["auto", "never", "force"] = Field(
        default="auto",
        description="auto: resume from the newest checkpoint in output_dir when it was trained with this config "
        "(except max_steps, save/log settings and the server address: launchgen.trainers.resume.MAY_CHANGE), refuse "
        "otherwise; force: resume even if the config differs; never: start fresh (refused where output_dir holds "
        "checkpoints, which a fresh run would overwrite).",
    )

    @classmethod
    def model_validate(cls, obj: Any, **kwargs: Any) -> TrainerConfig:
        """On `TrainerConfig` itself: the config class `obj`'s `trainer` names (the discriminated union)."""
        if "facts" in cls.__dict__ or not isinstance(obj, dict):
            return super().model_validate(obj, **kwargs)
        sub = config_class(str(obj.get("trainer")))
        if sub is None or not issubclass(sub, TrainerConfig):
            found = any_config_adapter().validate_python(obj, **kwargs)  # raises: the union's error names the tags
            raise TypeError(f"trainer {found.trainer_name!r} does not run the bundled loop")
        return sub.model_validate(obj, **kwargs)

    @classmethod
    def other_trainers_options(cls) -> dict[str, type[TrainerConfig]]:
        """Options another bundled trainer has and this one does not (GRPO's loss options), with their owner."""
        return {k: c for c in declared() if issubclass(c, TrainerConfig)
                for k in c.model_fields if k not in cls.model_fields}

    @classmethod
    def without_other_trainers_defaults(cls, data: dict[str, Any]) -> dict[str, Any]:
        """`data` less other trainers' options at their defaults: a config resolved before the options moved to
        their trainer's class wrote every option (a checkpoint's recorded config, a resolved config file)."""
        foreign = cls.other_trainers_options()
        return {k: v for k, v in data.items()
                if k not in foreign or v != foreign[k].model_fields[k].default}

    @model_validator(mode="before")
    @classmethod
    def _options_of_other_trainers(cls, data: Any) -> Any:
        """Another trainer's option: dropped at its default, else refused (naming it) rather than ignored."""
        if not isinstance(data, dict) or "facts" not in cls.__dict__:
            return data
        data = cls.without_other_trainers_defaults(data)
        foreign = cls.other_trainers_options()
        named = sorted(k for k in data if k in foreign)
        if named:
            raise ValueError(f"{named[0]} is a {foreign[named[0]].__name__.removesuffix('Config')} option; trainer "
                             f"{cls.trainer_name} does not use it: remove it")
        return data

    @model_validator(mode="after")
    def _resolve(self) -> TrainerConfig:
        self._apply_defaults()
        self._own_rules()
        if self.epsilon_high is None:
            self.epsilon_high = self.epsilon
        if self.steps_per_generation is None:
            self.steps_per_generation = self.gradient_accumulation_steps
        self._shared_rules()
        return self

    def _apply_defaults(self) -> None:
        """The trainer's `defaults` where the user left the field unset or null (assignment marks the field as set,
        so a resolved config written back with to_yaml() reads back unchanged)."""
        for path, value in self.defaults.items():
            *parents, leaf = path.split(".")
            node: BaseModel = self
            for part in parents:
                node = getattr(node, part)
            if leaf not in node.model_fields_set or getattr(node, leaf) is None:
                setattr(node, leaf, value)

    def _own_rules(self) -> None:
        """The trainer's own cross-field rules; the policy-gradient trainers' refuse DPO's loss types."""
        if self.loss_type in DPO_LOSS_TYPES:
            raise ValueError(f"loss_type {self.loss_type} is for online_dpo; {self.trainer} takes grpo, dapo, dr_grpo, "
                             "bnpo, cispo, sapo, luspo or vespo")

    def _shared_rules(self) -> None:
        facts = self.facts
        if not facts.online and self.generation.backend != "hf":
            raise ValueError(f"{self.trainer} does not generate: generation.backend must stay `hf`")
        if self.eval_strategy == "steps" and self.eval_data is None:
            raise ValueError("eval_strategy: steps needs eval_data (the evaluation prompts)")
        if self.eval_data is not None and not facts.takes_eval_data:
            able = spoken_list(names_where(lambda f: f.takes_eval_data))
            raise ValueError(f"eval_data: {self.trainer} does not generate; evaluation is for {able}")
        g = self.generation
        if g.max_staleness:
            refusals = staleness_refusals(self.trainer, g.backend, g.importance_sampling.enabled)
            if refusals:
                raise ValueError(refusals[0][2])
        if self.peft is not None:
            errors = combination_errors(use_liger_kernel=self.model.use_liger_kernel)
            if errors:
                raise ValueError(f"peft: {errors[0][1]}")

    @classmethod
    def from_yaml(cls, path: str | Path, overrides: list[str] | None = None) -> TrainerConfig:
        """Load `path`, then apply `--set dotted.key=value` overrides (values parsed as YAML).

        The rendered scripts use overrides for what is only known on the node at run time (the server's
        host, ports shifted by the job-id offset), so the embedded config file stays a static artefact.
        """
        data = yaml.safe_load(Path(path).read_text())
        if not isinstance(data, dict):
            raise ValueError(f"{path}: expected a mapping at the top level")
        for item in overrides or []:
            apply_override(data, item)
        return cls.model_validate(data)

    def to_yaml(self) -> str:
        return yaml_text(ordered_dump(self.model_dump(mode="json")), sort_keys=False)


#: libyaml's emitter where PyYAML was built with it: the same text as the pure-Python one in about a third of the
#: time (a plan writes three of these files: 15-20 ms of every `check`, `plan` and `render`).
_YAML_DUMPER = getattr(yaml, "CSafeDumper", yaml.SafeDumper)


def yaml_text(data: Any, *, sort_keys: bool) -> str:
    """`yaml.safe_dump(data, sort_keys=...)`'s text."""
    return yaml.dump(data, Dumper=_YAML_DUMPER, sort_keys=sort_keys)


def set_dotted(data: dict[str, Any], parts: list[str], value: Any, *, what: str) -> None:
    """Set `value` at the dotted path `parts` of `data` in place, making the mappings on the way (the one path
    walker of `--set` and of the spec's sweeps). A number names an existing list item. `what` begins the errors."""
    node: Any = data
    for i, part in enumerate(parts):
        last = i == len(parts) - 1
        if isinstance(node, list) and part.isdigit():
            if int(part) >= len(node):
                raise ValueError(f"{what}: {'.'.join(parts[:i])} has {len(node)} item(s), no item {part}")
            if last:
                node[int(part)] = value
            else:
                node = node[int(part)]
            continue
        if not isinstance(node, dict):
            raise ValueError(f"{what}: {'.'.join(parts[:i]) or parts[0]} is not a mapping")
        if last:
            node[part] = value
        else:
            if node.get(part) is None:
                node[part] = {}
            node = node[part]


def apply_override(data: dict[str, Any], item: str) -> None:
    """Apply one `dotted.key=value` override in place (the trainers' `--set` and `from_yaml`).

    The value is YAML, so `8000` is an int, `'x'` a string and an empty value null, as an empty YAML scalar is:
    `--set data.system_prompt=` clears the field; `--set data.system_prompt=''` sets the empty string.
    """
    key, sep, raw = item.partition("=")
    key = key.strip()
    if not sep or not key:
        raise ValueError(f"--set {item!r}: expected KEY=VALUE (a dotted key, e.g. generation.vllm_server.port=8001)")
    set_dotted(data, key.split("."), yaml.safe_load(raw) if raw.strip() else None, what=f"--set {item!r}")
