"""The generation backends by `generation.backend` name, each with what the loop must know about it.

Adding a backend: write a class with the `protocol.GenerationBackend` methods, a factory with the `Factory`
signature, and one `BackendSpec` in `BACKENDS` (the config's `Backend` literal names it too). The loop asks the
capabilities, never the name: whether to push weights after each optimizer step, whether the sampler's log-probs
can differ from the trainer's (the importance-sampling correction), whether log-probs come back at all.
Backend modules are imported only when selected, so vLLM stays optional.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from launchgen.trainers.errors import TrainerSetupError

if TYPE_CHECKING:
    from launchgen.trainers.config import TrainerConfig
    from launchgen.trainers.generation.protocol import GenerationBackend

#: (cfg, accelerator, policy model as prepared, tokenizer) -> backend
Factory = Callable[["TrainerConfig", Any, Any, Any], "GenerationBackend"]


@dataclass(frozen=True)
class Capabilities:
    #: Generates with the trainer's own (live) weights: no copy to update, no sampler/trainer mismatch to correct.
    shares_policy_weights: bool
    #: Returns the sampled tokens' log-probs (`GenerationOutput.logprobs`), as importance sampling needs.
    returns_logprobs: bool
    #: Needs the full weights after every optimizer step (and after a resume).
    needs_weight_sync: bool
    #: Can generate on a thread while the trainer trains (`generation.max_staleness`): a separate engine on its
    #: own devices, with rank 0's requests free of collectives (`request_all` / `share`, see `async_rollout`).
    generates_ahead: bool = False


@dataclass(frozen=True)
class BackendSpec:
    name: str
    capabilities: Capabilities
    factory: Factory


def _static_cache_fits(cfg: TrainerConfig, accelerator: Any, model: Any) -> bool:
    """The static-cache engine decodes with the trainer's own full weights, so it needs them unsharded
    (DDP or one process) and pays off only where CUDA graphs remove the per-kernel launch cost."""
    try:
        device_type = next(model.parameters()).device.type
    except StopIteration:
        return False
    distributed = str(getattr(accelerator, "distributed_type", "NO"))
    sharded = any(k in distributed for k in ("FSDP", "DEEPSPEED"))
    return device_type == "cuda" and not sharded


def _hf(cfg: TrainerConfig, accelerator: Any, model: Any, tokenizer: Any) -> GenerationBackend:
    engine = cfg.generation.hf_engine
    if engine == "auto":
        # peft included: the engine decodes LoRA projections with their merged weights (fast_generate.adapters)
        fits = _static_cache_fits(cfg, accelerator, model)
        engine = "static_cache" if fits else "generate"
    if engine == "static_cache":
        from launchgen.trainers.generation.fast_generate import FastGenerateBackend

        return FastGenerateBackend.from_config(cfg, accelerator, model, tokenizer)
    from launchgen.trainers.generation.hf_generate import HFGenerateBackend

    return HFGenerateBackend.from_config(cfg, accelerator, model, tokenizer)


def _vllm_server(cfg: TrainerConfig, accelerator: Any, model: Any, tokenizer: Any) -> GenerationBackend:
    if cfg.generation.vllm_server.replicas:
        from launchgen.trainers.generation.vllm_replica import VLLMReplicaBackend

        return VLLMReplicaBackend.from_config(cfg, accelerator)
    from launchgen.trainers.generation.vllm_server import VLLMServerBackend

    return VLLMServerBackend.from_config(cfg, accelerator)


def _vllm_colocate(cfg: TrainerConfig, accelerator: Any, model: Any, tokenizer: Any) -> GenerationBackend:
    from launchgen.trainers.generation.vllm_colocate import VLLMColocateBackend
    from launchgen.trainers.weights import iter_sync_params

    # With sleep mode the engine drops its weights; it re-pulls them (all of them, merged under peft) after waking.
    return VLLMColocateBackend.from_config(
        cfg, accelerator, model, named_params_fn=lambda: iter_sync_params(model, accelerator, cfg, full=True)
    )


_SEPARATE_ENGINE = Capabilities(shares_policy_weights=False, returns_logprobs=True, needs_weight_sync=True)
#: The colocated engine shares the trainer's GPUs and process, so it cannot generate while the trainer trains.

BACKENDS: dict[str, BackendSpec] = {
    spec.name: spec
    for spec in (
        BackendSpec("hf", Capabilities(shares_policy_weights=True, returns_logprobs=True, needs_weight_sync=False), _hf),
        BackendSpec("vllm_server", replace(_SEPARATE_ENGINE, generates_ahead=True), _vllm_server),
        BackendSpec("vllm_colocate", _SEPARATE_ENGINE, _vllm_colocate),
    )
}


def capabilities(cfg: TrainerConfig) -> Capabilities:
    return BACKENDS[cfg.generation.backend].capabilities


def make_backend(cfg: TrainerConfig, accelerator: Any, model: Any, tokenizer: Any) -> GenerationBackend:
    """The configured backend; a missing vLLM is a setup error that names the fix."""
    kind = cfg.generation.backend
    try:
        return BACKENDS[kind].factory(cfg, accelerator, model, tokenizer)
    except ImportError as e:
        if "vllm" in str(e).lower():
            raise TrainerSetupError(
                f"generation.backend {kind} needs vLLM: pip install 'launchgen[vllm]' (or set generation.backend: hf)"
            ) from e
        raise
