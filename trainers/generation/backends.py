"""The generation backends by `generation.backend` name, each with what the loop must know about it.

Adding a backend: write a class with the `protocol.GenerationBackend` methods, a factory with the `Factory`
signature, its `Capabilities` in `capabilities.CAPABILITIES` (torch-free: the config and `launchgen check` read
it) and its factory in `_FACTORIES` here (the config's `Backend` literal names it too). The loop asks the
capabilities, never the name: whether to push weights after each optimizer step, whether the sampler's log-probs
can differ from the trainer's (the importance-sampling correction), whether log-probs come back at all.
Backend modules are imported only when selected, so vLLM stays optional.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from launchgen.trainers.declarations.capabilities import CAPABILITIES, Capabilities
from launchgen.trainers.declarations.errors import TrainerSetupError

if TYPE_CHECKING:
    from launchgen.trainers.declarations.config import TrainerConfig
    from launchgen.trainers.generation.protocol import GenerationBackend

#: (cfg, accelerator, policy model as prepared, tokenizer) -> backend
Factory = Callable[["TrainerConfig", Any, Any, Any], "GenerationBackend"]


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
    from launchgen.trainers.sync_params import iter_sync_params

    # With sleep mode the engine drops its weights; it re-pulls them (all of them, merged under peft) after waking.
    return VLLMColocateBackend.from_config(
        cfg, accelerator, model, named_params_fn=lambda: iter_sync_params(model, accelerator, cfg, full=True)
    )


_FACTORIES: dict[str, Factory] = {"hf": _hf, "vllm_server": _vllm_server, "vllm_colocate": _vllm_colocate}

BACKENDS: dict[str, BackendSpec] = {
    name: BackendSpec(name, CAPABILITIES[name], factory) for name, factory in _FACTORIES.items()
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
