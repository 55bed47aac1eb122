"""Model and tokenizer loading, attention implementation, Liger patching, precision, and per-token log-probs.

Log-probs follow TRL 1.16 exactly (see `shared/reference/grpo-rloo-semantics.md` section 1): the model gets only
`input_ids` and `attention_mask` (no `position_ids`, so left padding shifts RoPE positions as in TRL), logits are
`hidden @ W.T` in the model's compute dtype, upcast to fp32, multiplied by `1/T`, log-softmaxed in fp32; positions
outside the completion mask are exactly 0.

The logits are never materialised for the whole sequence: `install_logp_head` replaces the LM head's `forward`
(instance attribute, so parameter names and FSDP/DeepSpeed hooks stay as they are) with a dispatcher that, inside
`logp_mode(...)`, turns the hidden states into per-token log-probs chunk by chunk (each chunk recomputed in
backward by activation checkpointing), and inside `liger_mode(...)` runs Liger's fused linear GRPO loss on them.
Because it runs inside the head's own forward, the head weight is whatever FSDP/ZeRO-3 gathered for that forward.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F
from launchgen.trainers.chunked_logps import chunked_logps
from launchgen.trainers.declarations.config import BUILTIN_ATTN, TrainerConfig
from launchgen.trainers.declarations.errors import TrainerSetupError
from launchgen.trainers.dynamo_config import raise_recompile_limit, recompile_limit_name
from torch.utils.checkpoint import checkpoint

from launchgen.shared.precision import MIXED_PRECISION, trainable_weight_dtype

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

#: Upper bound on elements of one fp32 logits chunk (B x chunk_len x V): 2**26 floats = 256 MiB. 1 GiB chunks
#: cost ~3 GiB of peak memory over TRL in the H200 benchmark (benchmarks/RESULTS.md, config 1).
LOGITS_CHUNK_ELEMENTS = 2**26


def hub_offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on")


def weight_dtype(cfg: TrainerConfig) -> torch.dtype:
    """dtype of the loaded (trainable) weights.

    `auto` keeps fp32 master weights and lets accelerate autocast to bf16/fp16 (mixed precision proper; fp16
    loss scaling needs fp32 parameters anyway). `model.dtype: bfloat16` gives pure-bf16 training at half the
    memory, like TRL with a bf16 checkpoint.
    """
    explicit = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}
    if cfg.model.dtype == "float16" and cfg.precision == "fp16":
        raise TrainerSetupError(
            "model.dtype float16 with precision fp16: loss scaling needs fp32 master weights; "
            "set model.dtype: auto (or float32)"
        )
    lora = cfg.peft is not None
    return explicit[trainable_weight_dtype(cfg.model.dtype, cfg.precision, lora=lora,
                                           modules_to_save=lora and bool(cfg.peft and cfg.peft.modules_to_save))]


def check_precision(cfg: TrainerConfig) -> None:
    """Refuse bf16 where the GPU cannot do it (pre-Ampere); CPU autocast handles bf16."""
    if cfg.precision == "fp16" and not torch.cuda.is_available():
        raise TrainerSetupError(
            "precision fp16 needs a CUDA GPU (accelerate applies loss scaling only there); use fp32 or bf16 on CPU"
        )
    wants_bf16 = cfg.precision == "bf16" or cfg.model.dtype == "bfloat16"
    if wants_bf16 and torch.cuda.is_available():
        major, minor = torch.cuda.get_device_capability()
        if major < 8:
            name = torch.cuda.get_device_name()
            raise TrainerSetupError(
                f"precision bf16 needs an Ampere-or-newer GPU (compute capability >= 8.0); {name} is "
                f"{major}.{minor}: set precision: fp16 (with loss scaling) or fp32, and model.dtype: auto"
            )


def accelerate_mixed_precision(cfg: TrainerConfig) -> str:
    return MIXED_PRECISION[cfg.precision]


def _is_hub_kernel(attn: str | None) -> bool:
    return attn is not None and attn not in BUILTIN_ATTN


def prepare_attention(cfg: TrainerConfig) -> str | None:
    """Validate and pre-load the attention implementation so failures are clear errors, never fallbacks."""
    attn = cfg.model.attn_implementation
    if attn in ("flash_attention_2", "flash_attention_3"):
        _check_flash_attn_package(attn)
        return attn
    if not _is_hub_kernel(attn):
        return attn
    assert attn is not None
    fix = (
        f"pin a revision that has a build for this torch/CUDA (model.attn_implementation: {attn.split('@')[0]}@<rev>), "
        "pre-download it on a node with internet into the shared HF cache (e.g. "
        f"`huggingface-cli download {attn.split('|')[-1].split('@')[0].split(':')[0]} --repo-type kernel`, "
        "or `kernels lock` + `kernels download <project>`), or choose another implementation (sdpa, eager, flash_attention_2)"
    )
    try:
        from transformers.utils.import_utils import (
            KERNELS_MAX_VERSION,
            KERNELS_MIN_VERSION,
            is_kernels_available,
        )
    except ImportError as e:  # pragma: no cover - depends on the transformers release
        raise TrainerSetupError(f"model.attn_implementation {attn!r}: this transformers has no Hub kernels ({e})") from e
    if not is_kernels_available():
        raise TrainerSetupError(
            f"model.attn_implementation {attn!r} needs the `kernels` package within transformers' window "
            f"[{KERNELS_MIN_VERSION}, {KERNELS_MAX_VERSION}): pip install 'kernels=={KERNELS_MIN_VERSION}', "
            "or choose a built-in implementation (sdpa, eager)"
        )
    if os.environ.get("USE_HUB_KERNELS", "").upper() in ("0", "NO", "FALSE", "OFF"):
        raise TrainerSetupError(
            f"model.attn_implementation {attn!r} is a Hub kernel but USE_HUB_KERNELS disables them: unset it or choose sdpa"
        )
    from transformers.integrations.hub_kernels import load_and_register_attn_kernel

    try:
        load_and_register_attn_kernel(attn)
    except Exception as e:
        where = " (HF_HUB_OFFLINE is set: only the local cache is searched)" if hub_offline() else ""
        msg = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise TrainerSetupError(f"model.attn_implementation {attn!r} could not be loaded{where}: {msg}; fix: {fix}") from e
    return attn


def _check_flash_attn_package(attn: str) -> None:
    """transformers silently swaps a missing flash-attn package for a Hub kernel; make that an explicit choice."""
    from transformers.utils import import_utils

    check = {
        "flash_attention_2": getattr(import_utils, "is_flash_attn_2_available", None),
        "flash_attention_3": getattr(import_utils, "is_flash_attn_3_available", None),
    }[attn]
    if check is not None and not check():
        hub = "kernels-community/flash-attn2" if attn == "flash_attention_2" else "kernels-community/vllm-flash-attn3"
        raise TrainerSetupError(
            f"model.attn_implementation {attn}: the flash-attn package is not usable here (not installed, or no CUDA); "
            f"install it, or ask for the Hub kernel explicitly (model.attn_implementation: {hub}@<rev>), or use sdpa"
        )


def load_tokenizer(cfg: TrainerConfig) -> PreTrainedTokenizerBase:
    from transformers import AutoTokenizer

    try:
        tok = AutoTokenizer.from_pretrained(
            cfg.model.name_or_path,
            revision=cfg.model.revision,
            trust_remote_code=cfg.model.trust_remote_code,
            local_files_only=hub_offline(),
        )
    except (OSError, ValueError) as e:
        raise TrainerSetupError(_load_fix(cfg, "tokenizer", e)) from e
    tok.padding_side = "left"
    if tok.pad_token_id is None:
        if tok.eos_token_id is None:
            raise TrainerSetupError(f"model.name_or_path {cfg.model.name_or_path!r}: tokenizer has neither pad nor eos token")
        tok.pad_token = tok.eos_token
    return tok


def _load_fix(cfg: TrainerConfig, what: str, e: Exception) -> str:
    first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    hint = (
        f"HF_HUB_OFFLINE is set: pre-download it on a node with internet (`huggingface-cli download "
        f"{cfg.model.name_or_path}{' --revision ' + cfg.model.revision if cfg.model.revision else ''}`) into the "
        "HF cache the compute nodes share"
        if hub_offline()
        else "check model.name_or_path / model.revision"
    )
    return f"model.name_or_path {cfg.model.name_or_path!r}: cannot load the {what} ({first}); {hint}"


def load_model(cfg: TrainerConfig, *, trainable: bool = True, compile: CompilePlan | None = None,
               checkpointing: bool | None = None) -> PreTrainedModel:
    """Load the causal LM as configured; the reference model is the same call with trainable=False.

    `compile` (see `resolve_compile`) says whether the decoder layers and the log-prob head's tiles are compiled;
    `checkpointing` is `grad_checkpointing.resolve`'s choice (None: only an explicit `true` turns it on).
    """
    from transformers import AutoModelForCausalLM

    attn = prepare_attention(cfg)
    kwargs: dict[str, Any] = dict(
        revision=cfg.model.revision,
        trust_remote_code=cfg.model.trust_remote_code,
        dtype=weight_dtype(cfg),
        local_files_only=hub_offline(),
    )
    if attn is not None:
        kwargs["attn_implementation"] = attn
    try:
        model = AutoModelForCausalLM.from_pretrained(cfg.model.name_or_path, **kwargs)
    except (OSError, ValueError, ImportError) as e:
        if attn is not None and ("attn" in str(e) or "attention" in str(e) or "kernel" in str(e)):
            raise TrainerSetupError(
                f"model.attn_implementation {attn!r} was refused by the model: {str(e).strip().splitlines()[0]}; "
                "choose another implementation (sdpa, eager)"
            ) from e
        raise TrainerSetupError(_load_fix(cfg, "model", e)) from e
    if getattr(model.config, "final_logit_softcapping", None):
        raise TrainerSetupError(
            f"model.name_or_path {cfg.model.name_or_path!r} uses final_logit_softcapping, which the bundled "
            "trainers' fused log-prob head does not implement; use a model without it"
        )
    if cfg.model.use_liger_kernel:
        apply_liger(model, cfg)
    if trainable:
        if cfg.model.gradient_checkpointing is True if checkpointing is None else checkpointing:
            enable_checkpointing(model)
        model.train()
    else:
        model.eval()
        model.requires_grad_(False)
    head = install_logp_head(model)
    head.chunk_elements = cfg.model.logits_chunk_mib * 2**20 // 4
    if compile is not None and compile.layers:
        compile_decoder_layers(model)
    head.compiled = compile is not None and compile.head
    return model


def enable_checkpointing(model: Any) -> None:
    """Gradient checkpointing on for a loaded (possibly prepared or compiled) policy: transformers' layers read
    the flag at every call, so it holds from the next forward pass (the first step's out-of-memory retry)."""
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.config.use_cache = False


# --------------------------------------------------------------------------------------------------- compile


#: torch.compile backend of `model.compile`; tests switch it to "eager" (dynamo tracing without code generation).
COMPILE_BACKEND = "inductor"


@dataclass(frozen=True)
class CompilePlan:
    layers: bool
    head: bool


def resolve_compile(cfg: TrainerConfig, device_type: str, distributed_type: str) -> CompilePlan:
    """What `load_model` compiles: `model.compile` as written, `auto` decided from where the job runs.

    `auto` compiles the log-prob head's tile math on CUDA (pure tensor functions, 2.7x faster than eager at a
    151k vocabulary in benchmarks/RESULTS.md), and the decoder layers on CUDA except with Liger (its Triton kernels
    already fuse what compile would, and dynamo would have to trace through them) or FSDP/DeepSpeed (their
    parameter hooks fire inside the layers). CPU compiles are slow to build and gain little.
    """
    c = cfg.model.compile
    if c != "auto":
        return CompilePlan(layers=bool(c), head=bool(c))
    cuda = device_type == "cuda"
    # With peft too: the layer's frame traces through PEFT's LoRA linears (the adapter on/off switch of the
    # reference pass is one more guard, so one more graph, not one per layer; tests/trainers/test_compile.py).
    layers = cuda and not cfg.model.use_liger_kernel and distributed_type in ("NO", "MULTI_GPU")
    return CompilePlan(layers=layers, head=cuda)


class _EagerSwitch:
    """Process-wide switch that sends compiled decoder layers back to their eager forward.

    Generation backends call the layers with a KV cache object and a layer index, shapes change every step, and
    dynamo would recompile per layer and per length; generation has its own fast paths, so it runs them eagerly.
    """

    depth = 0


@contextlib.contextmanager
def eager_layers() -> Iterator[None]:
    _EagerSwitch.depth += 1
    try:
        yield
    finally:
        _EagerSwitch.depth -= 1


class _LayerForward:
    """Installed as a decoder layer's `forward`: the compiled one for scoring/training (activation-checkpoint
    recomputation included, since it calls `forward` again), the original inside `eager_layers()`."""

    def __init__(self, orig: Any, compiled: Any) -> None:
        self.orig = orig
        self.compiled = compiled

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if _EagerSwitch.depth:
            return self.orig(*args, **kwargs)
        return self.compiled(*args, **kwargs)


def compile_decoder_layers(model: torch.nn.Module) -> int:
    """torch.compile every decoder layer's forward (regional compilation: the layers share one code object, so
    one graph per grad mode and shape family serves all of them, and the compile costs one layer, not the model)."""
    decoder = model.get_decoder() if hasattr(model, "get_decoder") else None  # type: ignore[operator]
    layers = getattr(decoder, "layers", None)
    if not isinstance(layers, torch.nn.ModuleList) or len(layers) == 0:
        raise TrainerSetupError(
            f"model.compile: {type(model).__name__} has no decoder `layers` list to compile; set model.compile: false"
        )
    # Dynamo keys its cache on the code object, shared by all layers; if anything in a layer still guards per
    # instance, the default limit (8) would silently leave most layers eager.
    raise_recompile_limit(4 * len(layers))
    for layer in layers:
        if isinstance(layer.forward, _LayerForward):
            continue
        orig = layer.forward
        layer.forward = _LayerForward(orig, torch.compile(orig, dynamic=None, backend=COMPILE_BACKEND))
    return len(layers)


# --------------------------------------------------------------------------------------------------- Liger


def _import_liger() -> Any:
    try:
        return importlib.import_module("liger_kernel")
    except ImportError as e:
        raise TrainerSetupError(
            "model.use_liger_kernel is true but liger-kernel is not installed: pip install 'launchgen[liger]' "
            "(liger-kernel>=0.8.2, needs a CUDA GPU and triton), or set model.use_liger_kernel: false"
        ) from e


def check_liger_compatible(cfg: TrainerConfig) -> None:
    """The combinations Liger cannot do; raised before anything heavy is loaded."""
    if not cfg.model.use_liger_kernel:
        return
    if not torch.cuda.is_available():
        raise TrainerSetupError("model.use_liger_kernel needs a CUDA GPU (Liger's kernels are Triton); set it to false on CPU")


def apply_liger(model: PreTrainedModel, cfg: TrainerConfig) -> None:
    _import_liger()
    from liger_kernel.transformers.monkey_patch import (
        MODEL_TYPE_TO_APPLY_LIGER_FN,
        _apply_liger_kernel_to_instance,
    )

    model_type = getattr(model.config, "model_type", None)
    if model_type not in MODEL_TYPE_TO_APPLY_LIGER_FN:
        raise TrainerSetupError(
            f"model.use_liger_kernel: Liger has no kernels for model_type {model_type!r}; set use_liger_kernel: false"
        )
    # Our own head computes log-probs/losses, so Liger must not replace the CausalLM forward or the CE loss.
    _apply_liger_kernel_to_instance(model=model, fused_linear_cross_entropy=False, cross_entropy=False)


def make_liger_grpo_loss(cfg: TrainerConfig, compiled: bool = True) -> Any:
    _import_liger()
    # The submodule, not `liger_kernel.chunked_loss`: that package also imports losses that need triton at import.
    from liger_kernel.chunked_loss.grpo_loss import LigerFusedLinearGRPOLoss

    beta = float(cfg.beta or 0.0)
    return LigerFusedLinearGRPOLoss(
        beta=beta,
        compiled=compiled,
        use_ref_model=beta != 0.0,
        epsilon_low=cfg.epsilon,
        epsilon_high=float(cfg.epsilon_high if cfg.epsilon_high is not None else cfg.epsilon),
        loss_type=cfg.loss_type,
        max_completion_length=cfg.generation.max_completion_length,
        importance_sampling_level="token",
        temperature=cfg.generation.temperature,
        use_bias_correction_kl=cfg.use_bias_correction_kl,
    )


# --------------------------------------------------------------------------------------------------- log-probs


def _chunk_logps(
    hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, targets: torch.Tensor, inv_t: float
) -> tuple[torch.Tensor, torch.Tensor]:
    logits = F.linear(hidden, weight, bias).float() * inv_t
    logp_all = torch.log_softmax(logits, dim=-1)
    logps = torch.gather(logp_all, -1, targets.unsqueeze(-1)).squeeze(-1)
    with torch.no_grad():
        entropy = -(logp_all.exp() * logp_all).sum(-1)
    return logps, entropy


def _chunk_logps_entropy_grad(
    hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, targets: torch.Tensor, inv_t: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """`_chunk_logps` with the entropy differentiable: GRPO's entropy bonus (`entropy_coef`) optimises it."""
    logits = F.linear(hidden, weight, bias).float() * inv_t
    logp_all = torch.log_softmax(logits, dim=-1)
    logps = torch.gather(logp_all, -1, targets.unsqueeze(-1)).squeeze(-1)
    return logps, -(logp_all.exp() * logp_all).sum(-1)


@dataclass
class _HeadState:
    mode: str | None = None
    targets: torch.Tensor | None = None
    temperature: float = 1.0
    liger_loss: Any = None
    liger_kwargs: dict[str, Any] = field(default_factory=dict)
    entropy: torch.Tensor | None = None
    #: The entropy carries a gradient (the entropy bonus); the fused ChunkedLogps path then stands down.
    entropy_grad: bool = False
    liger_metrics: list[torch.Tensor] = field(default_factory=list)


@functools.cache
def _compiled_chunk(backend: str, entropy_grad: bool = False) -> Any:
    recompile_limit_name()  # un-hide the limit dynamo reads on every compile
    return torch.compile(_chunk_logps_entropy_grad if entropy_grad else _chunk_logps, dynamic=None, backend=backend)


def _chunk_fn(compiled: bool, entropy_grad: bool = False) -> Any:
    """`_chunk_logps`, compiled once per process and backend when asked (fuses the upcast, 1/T, log-softmax, gather
    and entropy into a few kernels over the fp32 chunk instead of a round trip to memory each)."""
    if compiled:
        return _compiled_chunk(COMPILE_BACKEND, entropy_grad)
    return _chunk_logps_entropy_grad if entropy_grad else _chunk_logps


class LogpHead:
    """Dispatcher installed as `lm_head.forward`; see the module docstring."""

    def __init__(self, head: torch.nn.Module) -> None:
        self.head = head
        self.orig_forward = head.forward
        self.state = _HeadState()
        self.compiled = False
        self.chunk_elements = LOGITS_CHUNK_ELEMENTS
        # With compiled tiles: `chunked_logps.ChunkedLogps` (own backward, fp32 weight-gradient accumulation; 1.4x
        # faster than compiled checkpointed chunks at a 151k vocabulary). Uncompiled, its fp32 tile temporaries make
        # it slower and larger than checkpointed chunks, so those run then. False (sharded weights: FSDP/ZeRO-3,
        # whose gathered head weight only autograd's hooks manage): always the checkpointed chunks.
        self.fused = True

    def __call__(self, hidden: torch.Tensor) -> torch.Tensor:
        st = self.state
        if st.mode is None:
            return self.orig_forward(hidden)
        weight: torch.Tensor = self.head.weight  # type: ignore[assignment]
        bias: torch.Tensor | None = getattr(self.head, "bias", None)
        # TRL's convention: hidden at position s scores token s+1, so the last kept position is dropped.
        h = hidden[:, :-1]
        if st.mode == "liger":
            loss, metrics = st.liger_loss(h, weight, st.targets, bias=bias, **st.liger_kwargs)
            st.liger_metrics = list(metrics)
            return loss
        assert st.targets is not None
        if self.fused and self.compiled and not st.entropy_grad:
            logps, entropy = chunked_logps(h, weight, bias, st.targets, st.temperature, self.chunk_elements,
                                           compiled=self.compiled, backend=COMPILE_BACKEND)
            st.entropy = entropy
            return logps
        inv_t = 1.0 / st.temperature
        bsz, c = st.targets.shape
        vocab = weight.shape[0]
        step = max(1, self.chunk_elements // max(1, bsz * vocab))
        logps, ents = [], []
        fn = _chunk_fn(self.compiled, st.entropy_grad)
        for s in range(0, c, step):
            args = (h[:, s : s + step], weight, bias, st.targets[:, s : s + step], inv_t)
            if torch.is_grad_enabled():
                lp, en = checkpoint(fn, *args, use_reentrant=False)
            else:
                lp, en = fn(*args)
            logps.append(lp)
            ents.append(en)
        st.entropy = torch.cat(ents, dim=1)
        return torch.cat(logps, dim=1)

    @contextlib.contextmanager
    def logp_mode(self, targets: torch.Tensor, temperature: float, entropy_grad: bool = False) -> Iterator[_HeadState]:
        self.state = _HeadState(mode="logps", targets=targets, temperature=temperature, entropy_grad=entropy_grad)
        try:
            yield self.state
        finally:
            self.state = _HeadState(entropy=self.state.entropy)

    @contextlib.contextmanager
    def liger_mode(self, targets: torch.Tensor, loss_fn: Any, **kwargs: Any) -> Iterator[_HeadState]:
        self.state = _HeadState(mode="liger", targets=targets, liger_loss=loss_fn, liger_kwargs=kwargs)
        try:
            yield self.state
        finally:
            self.state = _HeadState(liger_metrics=self.state.liger_metrics)


def install_logp_head(model: torch.nn.Module) -> LogpHead:
    existing = getattr(model, "_launchgen_logp_head", None)
    if isinstance(existing, LogpHead):
        return existing
    head = model.get_output_embeddings()  # type: ignore[operator]
    if head is None or not hasattr(head, "weight"):
        raise TrainerSetupError("model.name_or_path: the model has no linear LM head (get_output_embeddings)")
    dispatcher = LogpHead(head)
    head.forward = dispatcher  # instance attribute: parameter names and module hooks are untouched
    model._launchgen_logp_head = dispatcher  # type: ignore[assignment]
    return dispatcher


def get_logp_head(model: torch.nn.Module) -> LogpHead:
    from accelerate.utils import extract_model_from_parallel

    inner = extract_model_from_parallel(model)
    head = getattr(inner, "_launchgen_logp_head", None)
    if not isinstance(head, LogpHead):
        head = install_logp_head(inner)
    return head


def per_token_logps(
    model: torch.nn.Module,
    prompt_ids: torch.Tensor,
    prompt_mask: torch.Tensor,
    completion_ids: torch.Tensor,
    completion_mask: torch.Tensor,
    temperature: float,
    entropy_grad: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(B, C) fp32 log-probs of the completion tokens and (B, C) entropies (with gradient only when
    `entropy_grad`); both 0 where masked."""
    head = get_logp_head(model)
    input_ids = torch.cat([prompt_ids, completion_ids], dim=1)
    attention_mask = torch.cat([prompt_mask, completion_mask.to(prompt_mask.dtype)], dim=1)
    c = completion_ids.size(1)
    with head.logp_mode(completion_ids, temperature, entropy_grad) as st:
        out = model(input_ids=input_ids, attention_mask=attention_mask, logits_to_keep=c + 1, use_cache=False)
        entropy = st.entropy
    logps = out.logits
    keep = completion_mask.bool()
    assert entropy is not None
    return logps.masked_fill(~keep, 0.0), entropy.masked_fill(~keep, 0.0)


def liger_grpo_loss(
    model: torch.nn.Module,
    loss_fn: Any,
    prompt_ids: torch.Tensor,
    prompt_mask: torch.Tensor,
    completion_ids: torch.Tensor,
    completion_mask: torch.Tensor,
    **loss_kwargs: Any,
) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """Liger's fused linear GRPO loss on the completion hidden states; logits are never materialised."""
    head = get_logp_head(model)
    input_ids = torch.cat([prompt_ids, completion_ids], dim=1)
    attention_mask = torch.cat([prompt_mask, completion_mask.to(prompt_mask.dtype)], dim=1)
    c = completion_ids.size(1)
    with head.liger_mode(
        completion_ids, loss_fn, attention_mask=completion_mask.to(torch.float32), **loss_kwargs
    ) as st:
        out = model(input_ids=input_ids, attention_mask=attention_mask, logits_to_keep=c + 1, use_cache=False)
        metrics = st.liger_metrics
    return out.logits, metrics
