"""The estimate of one spec: `launchgen.shared.estimate`'s formulas fed from the spec, the model's config.json and the
trainer's resolved config (what `plan` shows and checks LG240-LG242 judge). Standard library + the spec models.

Where each input comes from is said in the result (`Estimate.sources`), so `plan` can show what was assumed.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from launchgen.shared.estimate import (
    DTYPE_BYTES,
    LINK_GB_PER_S,
    CheckpointChoice,
    RoleEstimate,
    SyncEstimate,
    TrainerSetup,
    choose_checkpointing,
    gpu_hours,
    gpu_memory_gib,
    server_estimate,
    smallest_tp,
    sync_bytes,
    trainer_estimate,
)
from launchgen.shared.modelshape import ModelShape
from launchgen.shared.precision import server_dtype
from launchgen.trainers.declarations import memory_setup
from launchgen.trainers.declarations.peft_config import FUSED_GROUPS

if TYPE_CHECKING:
    from launchgen.input.spec import Spec
    from launchgen.planning.hfcache import ModelConfig
    from launchgen.shared.layout import Layout
    from launchgen.trainers.declarations.config import TrainerConfig


@dataclass(frozen=True)
class Measured:
    """A previous run's step time (`plan --from-run`)."""

    step_seconds: float
    steps: int  # steps it was measured over
    source: str


@dataclass
class Estimate:
    shape: ModelShape | None
    gpu_gib: float | None
    server: RoleEstimate | None = None
    trainer: RoleEstimate | None = None
    trainer_setup: TrainerSetup | None = None
    checkpointing: CheckpointChoice | None = None  # what `gradient_checkpointing: auto` chose
    sync: SyncEstimate | None = None
    step_seconds: float | None = None
    steps: int | None = None
    gpus: int | None = None
    sources: dict[str, str] = field(default_factory=dict)
    missing: list[str] = field(default_factory=list)

    @property
    def gpu_hours(self) -> float | None:
        if self.step_seconds is None or self.steps is None or self.gpus is None:
            return None
        return gpu_hours(self.step_seconds, self.steps, self.gpus)

    def to_json(self) -> dict[str, Any]:
        return {
            "model": None if self.shape is None else {"parameters": self.shape.parameter_count(),
                                                      **self.shape.to_json()},
            "gpu_memory_gib": self.gpu_gib,
            "server": None if self.server is None else self.server.to_json(),
            "trainer": None if self.trainer is None else self.trainer.to_json(),
            "gradient_checkpointing": None if self.checkpointing is None else self.checkpointing.to_json(),
            "weight_sync": None if self.sync is None else self.sync.to_json(),
            "cost": {"step_seconds": self.step_seconds, "max_steps": self.steps, "gpus": self.gpus,
                     "gpu_hours": None if self.gpu_hours is None else round(self.gpu_hours, 2)},
            "sources": self.sources,
            "missing": self.missing,
        }


def model_shape(spec: Spec, cfg: ModelConfig | None) -> tuple[ModelShape | None, str]:
    """The model's numbers: a local config.json, else `estimate.model`; and where they came from."""
    if cfg is not None:
        shape = ModelShape.from_config(cfg.data, cfg.source)
        if shape is not None:
            return shape, f"config.json ({cfg.source})"
    m = spec.estimate.model
    if m is None:
        return None, ""
    shape = ModelShape(
        hidden_size=m.hidden_size, num_hidden_layers=m.num_hidden_layers, num_attention_heads=m.num_attention_heads,
        num_key_value_heads=m.num_key_value_heads or m.num_attention_heads, intermediate_size=m.intermediate_size,
        vocab_size=m.vocab_size, head_dim=m.head_dim, tie_word_embeddings=m.tie_word_embeddings,
        qkv_bias=m.attention_bias, max_position_embeddings=m.max_position_embeddings,
        num_experts=m.num_experts or 0, moe_intermediate_size=m.moe_intermediate_size,
        experts_per_token=m.num_experts_per_tok, qk_norm=m.qk_norm, source="estimate.model",
    )
    return shape, "estimate.model"


def gpu_memory(spec: Spec, live_gib: float | None = None) -> tuple[float | None, str]:
    """One GPU's memory (GiB): nvidia-smi (`check --live`), estimate.gpu_memory_gib, or slurm.gpu_type's row."""
    if live_gib is not None:
        return live_gib, "nvidia-smi"
    if spec.estimate.gpu_memory_gib is not None:
        return spec.estimate.gpu_memory_gib, "estimate.gpu_memory_gib"
    if spec.slurm.gpu_type is not None:
        gib = gpu_memory_gib(spec.slurm.gpu_type)
        if gib is not None:
            return gib, f"slurm.gpu_type {spec.slurm.gpu_type}"
    return None, ""


def trainer_setup(spec: Spec, cfg: TrainerConfig, shape: ModelShape, layout: Layout,
                  colocated_gib: float) -> tuple[TrainerSetup, str]:
    """What decides a trainer process's memory (`memory_setup.trainer_setup`, fed from the spec); and where the
    prompt length came from."""
    dist = spec.train.distributed
    return memory_setup.trainer_setup(
        cfg, shape, backend=spec.train.backend, processes=layout.world_size,
        offload_optimizer=dist.offload_optimizer, offload_params=dist.offload_params,
        prompt_tokens=spec.estimate.prompt_tokens, colocated_gib=colocated_gib)


def estimate(spec: Spec, model_config: ModelConfig | None, cfg: TrainerConfig | None, layout: Layout, *,
             live_gpu_gib: float | None = None, measured: Measured | None = None) -> Estimate:
    """The whole estimate; parts whose inputs are unknown are left out and named in `missing`."""
    shape, shape_src = model_shape(spec, model_config)
    gib, gpu_src = gpu_memory(spec, live_gpu_gib)
    est = Estimate(shape, gib)
    if shape_src:
        est.sources["model"] = shape_src
    if gpu_src:
        est.sources["gpu memory"] = gpu_src
    if layout.cpu:
        est.missing.append("a CPU run: the GPU memory estimate does not apply")
    if shape is None:
        est.missing.append("the model's numbers: its config.json is not local; set estimate.model (config.json's "
                           "hidden_size, num_hidden_layers, ...) or run where the model is cached")
    if gib is None and not layout.cpu:
        est.missing.append("the GPU's memory: set slurm.gpu_type to a known GPU or estimate.gpu_memory_gib")
    v = spec.vllm
    colocated = 0.0
    if shape is not None and not layout.cpu:
        if v is not None and v.device == "cuda":
            est.server = server_estimate(
                shape, tp=v.tensor_parallel_size, dtype=server_dtype(spec), gpu_gib=gib,
                max_model_len=v.max_model_len, gpu_memory_utilization=v.gpu_memory_utilization,
                kv_cache_memory_bytes=v.kv_cache_memory_bytes, pp=layout.pipeline_parallel_size,
                ep=v.tensor_parallel_size * v.data_parallel_size if v.enable_expert_parallel else None)
            if layout.multi_node and gib is not None:
                per_node = layout.server_gpus_per_node
                est.server.notes.append(
                    f"one replica over {layout.replica_nodes} nodes: {est.server.total_gib * per_node:.0f} GiB on "
                    f"each server node ({per_node} GPUs), the same on every node")
            if gib is not None and layout.mode == "server" and v.tensor_parallel_size > 1:
                best = smallest_tp(shape, dtype=server_dtype(spec), gpu_gib=gib, max_model_len=v.max_model_len,
                                   gpu_memory_utilization=v.gpu_memory_utilization,
                                   kv_cache_memory_bytes=v.kv_cache_memory_bytes, limit=v.tensor_parallel_size,
                                   pp=layout.pipeline_parallel_size)
                if best is not None and best < v.tensor_parallel_size:
                    est.server.notes.append(f"the smallest TP that fits is {best} (more TP: more KV cache, faster "
                                            "decoding)")
            if layout.mode == "colocate":
                est.server.role = "vLLM (colocated)"
                if gib is not None and not v.enable_sleep_mode:
                    colocated = v.gpu_memory_utilization * gib if v.kv_cache_memory_bytes is None else \
                        est.server.total_gib
        if cfg is not None:
            est.trainer_setup, how = trainer_setup(spec, cfg, shape, layout, colocated)
            if cfg.model.gradient_checkpointing == "auto":
                # the rows and the checks then judge what the trainer will run; it decides again at start
                est.checkpointing = choose_checkpointing(shape, est.trainer_setup, gib, cfg.memory_budget_gib)
                if est.checkpointing is not None:
                    est.trainer_setup = replace(est.trainer_setup, gradient_checkpointing=est.checkpointing.on)
            est.trainer = trainer_estimate(shape, est.trainer_setup, gib)
            if cfg.model.gradient_checkpointing == "auto":
                est.trainer.notes.append("gradient checkpointing " + (
                    est.checkpointing.describe() if est.checkpointing is not None else
                    "auto: decided by the trainer at start (the GPU's memory is not known here)"))
            if spec.train.distributed.deepspeed_config is not None:
                est.trainer.notes.append("train.distributed.deepspeed_config is not read: estimated as "
                                         f"{spec.train.backend} without offload")
            est.sources["prompt tokens"] = how
    if cfg is None and not layout.cpu:
        est.missing.append(f"the trainer ({spec.train.trainer}): only the bundled trainers' resolved configs are "
                           "estimated (TRL's own trainers, or train.args with errors, are not)")
    if shape is not None and cfg is not None and layout.mode == "server":
        link = spec.estimate.link or ("nvlink" if layout.shared else "infiniband")
        gbps = spec.estimate.link_gb_per_s or LINK_GB_PER_S[link]
        s = est.trainer_setup
        w = DTYPE_BYTES[s.weight_dtype] if s is not None else DTYPE_BYTES[server_dtype(spec)]
        targets = None if s is None or s.lora_r is None else s.lora_targets
        nbytes, what = sync_bytes(shape, w, targets, s.modules_to_save if s else (), FUSED_GROUPS)
        if spec.vllm is not None and spec.vllm.replicas > 1:
            what += f", to each of {spec.vllm.replicas} replicas at once"
        if layout.multi_node:
            # every worker of every server node receives the full broadcast (then loads its own shard)
            what += f", received by all {layout.replica_size} workers on {layout.replica_nodes} nodes"
        est.sync = SyncEstimate(nbytes, what, link if spec.estimate.link_gb_per_s is None else
                                f"{link} ({gbps:g} GB/s from estimate.link_gb_per_s)", gbps)
    if cfg is not None:
        est.steps = cfg.max_steps
        est.gpus = layout.num_nodes * spec.slurm.gpus_per_node if not layout.cpu else None
        if measured is not None:
            est.step_seconds = measured.step_seconds
            est.sources["step time"] = measured.source
        elif spec.estimate.step_time_s is not None:
            est.step_seconds = spec.estimate.step_time_s
            est.sources["step time"] = "estimate.step_time_s"
    return est
