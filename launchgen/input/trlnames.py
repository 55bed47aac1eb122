"""Where the settings of TRL's GRPOConfig / RLOOConfig / OnlineDPOConfig (and the TRL scripts' ModelConfig /
ScriptArguments) live in a launchgen spec.

One table, two uses: `check` points a TRL-style key written in the wrong place to its launchgen path, and
`docs/trl-names.md` is generated from it (a test keeps the page current).
"""

from __future__ import annotations

from dataclasses import dataclass

from launchgen.shared import ports

GRPO, RLOO, DPO, SCRIPT = "GRPOConfig", "RLOOConfig", "OnlineDPOConfig", "ModelConfig/ScriptArguments"
#: accelerate's config file / `accelerate launch` flags: users coming from `accelerate config` bring these too
ACCEL = "accelerate config"
_ONLINE = (GRPO, RLOO, DPO)
_GR = (GRPO, RLOO)


@dataclass(frozen=True)
class TrlName:
    trl: str  # the TRL field name
    configs: tuple[str, ...]  # the TRL classes that have it
    path: str  # where it goes in a launchgen spec; "" when launchgen decides it
    note: str = ""  # how the value translates, or why launchgen owns it

    def hint(self) -> str:
        """The fix for a key of this name written where launchgen does not read it."""
        if not self.path:
            return f"{self.owner}'s `{self.trl}` has no launchgen key: {self.note}."
        note = f" ({self.note})" if self.note else ""
        if self.path.rsplit(".", 1)[-1] == self.trl:
            # the same name, one level off (`train.learning_rate`): where it goes is all there is to say
            return f"`{self.trl}` goes in `{self.path}`{note}."
        return f"{self.owner}'s `{self.trl}` is `{self.path}` in a launchgen spec{note}."

    @property
    def owner(self) -> str:
        return "accelerate" if self.configs == (ACCEL,) else "TRL"


_A = "train.args"
_G = "train.args.generation"
_RESOLVED = "launchgen resolves the server address from the allocation at run time; vllm.bind sets what it binds"

TRL_NAMES: tuple[TrlName, ...] = (
    # --- vLLM ---
    TrlName("use_vllm", _ONLINE, "vllm", "a `vllm:` section turns vLLM on; without one the trainer uses generate"),
    TrlName("vllm_mode", _ONLINE, "vllm.mode", "`server` or `colocate`, as in TRL"),
    TrlName("vllm_server_host", _ONLINE, "", _RESOLVED),
    TrlName("vllm_server_base_url", _ONLINE, "", _RESOLVED),
    TrlName("vllm_server_port", _ONLINE, "vllm.port"),
    TrlName("vllm_server_timeout", _ONLINE, "vllm.health_timeout",
            "seconds to wait for the server's /health (launchgen writes vllm.health_timeout + 60 s, so the "
            "supervisor, which names the server's log, reports first)"),
    TrlName("vllm_group_port", _ONLINE, "vllm.group_port", f"TRL's 51216 is in the ephemeral range; {ports.GROUP_DEFAULT} here"),
    TrlName("vllm_gpu_memory_utilization", _ONLINE, "vllm.gpu_memory_utilization",
            "the server's share in server mode, each trainer GPU's share in colocate mode"),
    TrlName("vllm_tensor_parallel_size", _ONLINE, "vllm.tensor_parallel_size"),
    TrlName("vllm_max_model_length", _ONLINE, "vllm.max_model_len"),
    TrlName("vllm_enable_sleep_mode", _ONLINE, "vllm.enable_sleep_mode"),
    TrlName("vllm_model_impl", _ONLINE, "vllm.extra_args", "as `--model-impl=...`"),
    TrlName("vllm_importance_sampling_correction", _GR, f"{_G}.importance_sampling.enabled"),
    TrlName("vllm_importance_sampling_mode", _GR, f"{_G}.importance_sampling.mode"),
    TrlName("vllm_importance_sampling_cap", _GR, f"{_G}.importance_sampling.clip_max"),
    TrlName("vllm_importance_sampling_clip_min", _GR, f"{_G}.importance_sampling.clip_min"),
    # --- generation ---
    TrlName("max_completion_length", _GR, f"{_G}.max_completion_length"),
    TrlName("max_new_tokens", (DPO,), f"{_G}.max_completion_length"),
    TrlName("temperature", _ONLINE, f"{_G}.temperature"),
    TrlName("top_p", _ONLINE, f"{_G}.top_p"),
    TrlName("top_k", _ONLINE, f"{_G}.top_k"),
    TrlName("min_p", _ONLINE, f"{_G}.min_p"),
    TrlName("repetition_penalty", _ONLINE, f"{_G}.repetition_penalty"),
    TrlName("generation_kwargs", _ONLINE, f"{_G}.generation_kwargs"),
    TrlName("num_generations", _GR, f"{_A}.num_generations", "online DPO compares 2 and takes 2 only"),
    TrlName("steps_per_generation", _GR, f"{_A}.steps_per_generation"),
    # --- data ---
    TrlName("max_prompt_length", _ONLINE, f"{_A}.data.max_prompt_length"),
    TrlName("dataset_name", (SCRIPT,), f"{_A}.data.path", "a Hub data set id or a local file"),
    TrlName("dataset_config", (SCRIPT,), f"{_A}.data.config_name"),
    TrlName("dataset_train_split", (SCRIPT,), f"{_A}.data.split"),
    TrlName("shuffle_dataset", _GR, f"{_A}.data.shuffle"),
    TrlName("reward_funcs", _ONLINE, f"{_A}.rewards", "a list of `{name: ..., weight: ...}`"),
    TrlName("reward_weights", _GR, f"{_A}.rewards", "the `weight` of each reward entry"),
    # --- model and precision ---
    TrlName("model_name_or_path", (SCRIPT,), "model.name_or_path"),
    TrlName("model_revision", (SCRIPT,), "model.revision"),
    TrlName("trust_remote_code", (SCRIPT,), "model.trust_remote_code"),
    TrlName("torch_dtype", (SCRIPT,), "model.dtype", "`auto` follows train.precision"),
    TrlName("dtype", (SCRIPT,), "model.dtype", "`auto` follows train.precision"),
    TrlName("attn_implementation", (SCRIPT,), "train.attn_implementation"),
    TrlName("model_init_kwargs", _ONLINE, "model", "dtype, revision and trust_remote_code are model.* fields"),
    TrlName("bf16", _ONLINE, "train.precision", "`bf16: true` is `precision: bf16`"),
    TrlName("fp16", _ONLINE, "train.precision", "`fp16: true` is `precision: fp16`"),
    TrlName("gradient_checkpointing", _ONLINE, "train.gradient_checkpointing"),
    TrlName("use_liger_kernel", _ONLINE, "train.use_liger_kernel"),
    TrlName("use_liger_loss", (GRPO,), "train.use_liger_kernel", "with train.args.model.liger_grpo_loss: true"),
    TrlName("deepspeed", _ONLINE, "train.distributed.deepspeed_config",
            "the DeepSpeed JSON file; train.backend deepspeed_zero2 or deepspeed_zero3"),
    TrlName("fsdp", _ONLINE, "train.backend", "fsdp (FSDP2)"),
    TrlName("ds3_gather_for_generation", _GR, "", "weights are pushed to vLLM from gathered shards automatically"),
    # --- optimisation and run ---
    TrlName("output_dir", _ONLINE, "job.output_dir"),
    TrlName("num_train_epochs", _ONLINE, f"{_A}.num_train_epochs", "when set, decides the step count (max_steps ignored)"),
    TrlName("save_strategy", _ONLINE, f"{_A}.save_strategy", "steps, epoch or no (signal and final checkpoints always)"),
    TrlName("eval_strategy", _ONLINE, f"{_A}.eval_strategy", "no or steps"),
    TrlName("eval_steps", _ONLINE, f"{_A}.eval_steps"),
    TrlName("dataset_test_split", (SCRIPT,), f"{_A}.eval_data.split", "eval_data takes the same fields as data"),
    TrlName("resume_from_checkpoint", _ONLINE, f"{_A}.resume", "`auto` resumes the newest checkpoint"),
    TrlName("learning_rate", _ONLINE, f"{_A}.learning_rate"),
    TrlName("per_device_train_batch_size", _ONLINE, f"{_A}.per_device_train_batch_size",
            "counts completions, as in TRL"),
    TrlName("gradient_accumulation_steps", _ONLINE, f"{_A}.gradient_accumulation_steps"),
    TrlName("max_steps", _ONLINE, f"{_A}.max_steps"),
    TrlName("save_steps", _ONLINE, f"{_A}.save_steps"),
    TrlName("save_total_limit", _ONLINE, f"{_A}.save_total_limit"),
    TrlName("logging_steps", _ONLINE, f"{_A}.logging_steps"),
    TrlName("report_to", _ONLINE, f"{_A}.report_to", "jsonl, tensorboard and/or wandb"),
    TrlName("run_name", _ONLINE, f"{_A}.run_name", "the wandb run's name"),
    TrlName("seed", _ONLINE, f"{_A}.seed"),
    TrlName("beta", _ONLINE, f"{_A}.beta"),
    TrlName("epsilon", _GR, f"{_A}.epsilon"),
    TrlName("epsilon_high", _GR, f"{_A}.epsilon_high"),
    TrlName("loss_type", (GRPO, DPO), f"{_A}.loss_type"),
    TrlName("scale_rewards", (GRPO,), f"{_A}.scale_rewards"),
    TrlName("num_iterations", _GR, f"{_A}.num_iterations"),
    TrlName("mask_truncated_completions", _GR, f"{_A}.mask_truncated_completions"),
    TrlName("importance_sampling_level", (GRPO,), f"{_A}.importance_sampling_level", "`sequence` is GSPO"),
    TrlName("delta", (GRPO,), f"{_A}.delta"),
    TrlName("top_entropy_quantile", (GRPO,), f"{_A}.top_entropy_quantile"),
    TrlName("entropy_coef", (GRPO,), f"{_A}.entropy_coef"),
    TrlName("use_adaptive_entropy", (GRPO,), f"{_A}.use_adaptive_entropy"),
    TrlName("entropy_coef_min", (GRPO,), f"{_A}.entropy_coef_min"),
    TrlName("entropy_coef_max", (GRPO,), f"{_A}.entropy_coef_max"),
    TrlName("entropy_coef_delta", (GRPO,), f"{_A}.entropy_coef_delta"),
    TrlName("entropy_target", (GRPO,), f"{_A}.entropy_target"),
    TrlName("off_policy_mask_threshold", (GRPO,), f"{_A}.off_policy_mask_threshold"),
    TrlName("multi_objective_aggregation", (GRPO,), f"{_A}.multi_objective_aggregation"),
    TrlName("sapo_temperature_pos", (GRPO,), f"{_A}.sapo_temperature_pos"),
    TrlName("sapo_temperature_neg", (GRPO,), f"{_A}.sapo_temperature_neg"),
    TrlName("vespo_k_pos", (GRPO,), f"{_A}.vespo_k_pos"),
    TrlName("vespo_lambda_pos", (GRPO,), f"{_A}.vespo_lambda_pos"),
    TrlName("vespo_k_neg", (GRPO,), f"{_A}.vespo_k_neg"),
    TrlName("vespo_lambda_neg", (GRPO,), f"{_A}.vespo_lambda_neg"),
    TrlName("normalize_advantages", (RLOO,), f"{_A}.normalize_advantages"),
    TrlName("reward_clip_range", (RLOO,), f"{_A}.reward_clip_range"),
    TrlName("lr_scheduler_type", _ONLINE, f"{_A}.lr_scheduler_type"),
    TrlName("warmup_steps", _ONLINE, f"{_A}.warmup_steps"),
    TrlName("weight_decay", _ONLINE, f"{_A}.weight_decay"),
    TrlName("max_grad_norm", _ONLINE, f"{_A}.max_grad_norm"),
    # --- accelerate's own config (launchgen writes that file from the plan) ---
    TrlName("num_processes", (ACCEL,), "", "the world size is train.nodes x the trainer GPUs of a node "
            "(train.gpus, or slurm.gpus_per_node less vllm.gpus), written into the accelerate config"),
    TrlName("num_machines", (ACCEL,), "train.nodes"),
    TrlName("machine_rank", (ACCEL,), "", "each node's rank is set by the script at run time"),
    TrlName("main_process_ip", (ACCEL,), "", "the first trainer node's address, resolved at run time"),
    TrlName("mixed_precision", (ACCEL,), "train.precision", "`bf16`, `fp16` or `fp32`"),
    TrlName("distributed_type", (ACCEL,), "train.backend", "ddp, fsdp, deepspeed_zero2 or deepspeed_zero3"),
)

_BY_NAME = {t.trl: t for t in TRL_NAMES}


def lookup(key: str) -> TrlName | None:
    return _BY_NAME.get(key)


def hint_for(path: str) -> str | None:
    """The pointer for an unknown key at dotted `path` when its last part is a TRL name placed elsewhere."""
    entry = lookup(path.rsplit(".", 1)[-1])
    if entry is None or entry.path == path:
        return None
    return entry.hint()


def markdown() -> str:
    """The bundled trainers' part of docs/trl-names.md; `trl_config.names_page` adds TRL's own trainers' part
    (kept there: trl_config builds on the loader, which reads this table for its hints)."""
    out = [
        "# TRL names in a launchgen spec",
        "",
        "<!-- generated by launchgen.kinds.trl_config.names_page(); edit TRL_NAMES in launchgen/input/trlnames.py -->",
        "",
        "Two ways to bring a TRL job: the bundled trainers (`grpo`, `rloo`, `online_dpo`, `sft`; 6-11x TRL's step",
        "on an H200, benchmarks/RESULTS.md) take launchgen's names, listed first; TRL's own trainers (`trl.<name>`) and",
        "your own TRL script (`train.script`) take TRL's names as they are (the second part).",
        "",
        "## The bundled trainers",
        "",
        "Settings of TRL's `GRPOConfig`, `RLOOConfig` and `OnlineDPOConfig` (and the TRL scripts' `ModelConfig` /",
        "`ScriptArguments`, and accelerate's config file) and where they go in a spec. `launchgen check` gives the",
        "same pointer when one of these names is written where launchgen does not read it (`use_vllm: true`, a flat",
        "`max_completion_length` in `train.args`, `bf16` in `train.args`, `train.num_processes`, ...).",
        "",
        "| TRL field | in | launchgen | note |",
        "| --- | --- | --- | --- |",
    ]
    for t in TRL_NAMES:
        path = f"`{t.path}`" if t.path else "(set by launchgen)"
        out.append(f"| `{t.trl}` | {', '.join(t.configs)} | {path} | {t.note} |")
    return "\n".join(out)
