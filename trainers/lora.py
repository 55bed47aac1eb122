"""LoRA (PEFT) training: the wrapped policy, the adapter-off reference, merged-weight sync and adapter checkpoints.

* `wrap_policy`: PEFT's LoRA on the loaded policy (or a saved adapter, `peft.adapter_path`); only the adapters
  (and `modules_to_save`) require grad, so only they get gradients and optimizer state (`core` builds the
  optimizer from `requires_grad` parameters).
* `compute_in_input_dtype`: the adapters keep float32 parameters but multiply in the input's dtype
  (`InputDtypeLinear`), so a bf16 model keeps no float32 copy of each adapted module's input for backward.
* `AdapterOffReference`: the reference model for beta > 0 is the policy itself inside PEFT's `disable_adapter()`
  (the frozen base), so no second copy of the weights is loaded.
* `iter_sync_params`: what the vLLM server (or the colocated engine) receives after every optimizer step. The way
  chosen is merged weights of the adapted modules only, not vLLM's runtime LoRA loading: the server then runs
  its ordinary dense kernels with no `--enable-lora` flags, max-rank limits or adapter-switching cost, the
  weight-transfer path is the one full fine-tuning uses (and its tests), and each step moves the adapted
  modules only (all-linear skips the embeddings, the LM head and the norms). Each merged weight is computed
  out of place with PEFT's own merge arithmetic (`W += get_delta_weight()`, i.e. W + scaling * B @ A in the
  weight's dtype), so the bits equal `merge_and_unload()`'s while the trainer's base weights are never touched:
  merging in place and unmerging would drift the frozen base by a rounding error per step in bf16. A module of
  one of vLLM's fused groups (q/k/v -> qkv_proj, gate/up -> gate_up_proj) is sent with its whole group.
  `full=True` sends every parameter: the first push of a run (a long-lived server may hold another run's
  embeddings, norms and LM head) and a colocated engine waking from level-2 sleep (which dropped its weights).
  The partial pushes rely on vLLM's layerwise reload keeping a layer it receives nothing for: vLLM 0.32's
  `finalize_layerwise_processing` (vllm/model_executor/model_loader/reload/layerwise.py) puts such a layer's
  kernel tensors back (`_place_kernel_tensors`, logging "Failed to load weights" at warning level per layer),
  while a layer that receives only part of its weights (q_proj alone for the fused qkv_proj) is rebuilt in
  uninitialised memory (`reload/meta.py`, `materialize_meta_tensor`: `torch.empty_strided`) with only that part
  loaded; hence whole fused groups.
* `register_adapter_checkpoints`: checkpoints hold the trainable tensors only (the frozen base is the model on
  disk); resuming loads them back strictly, with optimizer, scheduler and RNG as before.
* `save_final`: `final/` is the adapter (PEFT format) and, with `peft.save_merged`, `final/merged` the merged model.

Supported: one process, DDP and FSDP2. Under FSDP2 every parameter is a DTensor shard: the sync gathers each
adapted module's base weight and A/B (`full_tensor`, a collective every rank runs in the same order) and merges
the gathered tensors with PEFT's own `get_delta_weight`; the checkpoint's adapter and AdamW state are gathered
to full tensors too (`ShardedAdapterState`), because accelerate's FSDP save writes every parameter, the frozen
base included. Refused at set-up (and by `launchgen check`, LG343): DeepSpeed (not installed where launchgen is
tested: its ZeRO-3 gather and its engine's checkpoints were never run with adapters) and FSDP1 (summon_full_params
over flattened parameters: not built).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from accelerate.utils.constants import OPTIMIZER_NAME, SAFE_WEIGHTS_NAME
from launchgen.trainers.declarations.config import TrainerConfig
from launchgen.trainers.declarations.errors import TrainerSetupError
from launchgen.trainers.declarations.peft_config import ALL_LINEAR, FUSED_GROUPS, PeftSection, matches
from launchgen.trainers.weights import clean_name, full_tensor

ADAPTER = "default"
#: accelerate's files of the first prepared model (safetensors) and optimizer (`save_accelerator_state`).
_MODEL_FILE = SAFE_WEIGHTS_NAME
_OPTIMIZER_FILE = f"{OPTIMIZER_NAME}.bin"


def _import_peft() -> Any:
    try:
        import peft
    except ImportError as e:
        raise TrainerSetupError(
            "peft is set but the peft package is not installed: pip install 'launchgen[train]' (peft==0.21.2)"
        ) from e
    return peft


def check_distributed(accelerator: Any) -> None:
    from accelerate.utils import DistributedType

    kind = accelerator.distributed_type
    if kind == DistributedType.DEEPSPEED:
        raise TrainerSetupError(
            "peft (LoRA) is supported with one process, DDP or FSDP2 (train.backend fsdp), not DeepSpeed: the "
            "merged-weight sync under ZeRO-3 and adapter-only DeepSpeed checkpoints are not built or tested "
            "(deepspeed is not part of launchgen's test environment); use train.backend: fsdp or ddp"
        )
    if kind == DistributedType.FSDP and not sharded_fsdp2(accelerator):
        raise TrainerSetupError(
            "peft (LoRA) under FSDP needs FSDP2 (fsdp_version: 2, launchgen's default): FSDP1 flattens parameters, "
            "which the merged-weight sync and the adapter checkpoints do not gather; remove fsdp_version: 1 from "
            "train.distributed.accelerate_config"
        )


def sharded_fsdp2(accelerator: Any) -> bool:
    """Whether the prepared policy's parameters are FSDP2 DTensor shards."""
    from accelerate.utils import DistributedType

    return accelerator is not None and accelerator.distributed_type == DistributedType.FSDP and bool(
        getattr(accelerator, "is_fsdp2", False))


# --------------------------------------------------------------------------------------------------- wrap


def wrap_policy(model: torch.nn.Module, cfg: TrainerConfig) -> Any:
    """The PEFT model around `model`: new adapters from `cfg.peft`, or the saved ones at `peft.adapter_path`."""
    peft = _import_peft()
    p = cfg.peft
    assert p is not None
    if p.adapter_path is not None:
        wrapped = _load_adapter(peft, model, p)
    else:
        lc = peft.LoraConfig(
            r=p.r, lora_alpha=p.lora_alpha, lora_dropout=p.lora_dropout, target_modules=p.target_modules,
            modules_to_save=list(p.modules_to_save) or None, bias="none", task_type="CAUSAL_LM",
        )
        try:
            # Seeded alike on every rank, and apart from the run's stream: the new adapters are the same whatever
            # the process count or backend (accelerate's FSDP2 keeps each rank's own shard of its own init unless
            # it broadcasts rank 0's weights, and DDP broadcasts them).
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(cfg.seed)
                wrapped = peft.get_peft_model(model, lc)
        except ValueError as e:
            raise TrainerSetupError(f"peft.target_modules: {str(e).strip().splitlines()[0]}") from e
    _check_targets(wrapped, p)
    compute_in_input_dtype(wrapped.get_base_model())
    return wrapped


class InputDtypeLinear(torch.nn.Linear):
    """An adapter's `lora_A` / `lora_B`: the parameters stay float32 (the optimizer's master copy, as PEFT makes
    them), the matmul runs in the input's dtype (bf16/fp16 in a half-precision model).

    PEFT's default instead casts each adapted module's *input* to float32 (`_cast_input_dtype`), and autograd keeps
    that copy for the adapter's weight gradient: at the 3B shape of benchmarks/grpo_lora.py the MLP down
    projection's float32 input alone was 0.76 GiB of a 12.1 GiB peak (benchmarks/memory_peak.py). Cast the
    weight instead and the saved input is the half-precision tensor the base layer already holds; the matmuls are
    those of accelerate's bf16 autocast (which TRL's mixed precision runs), and the gradient reaches the float32
    parameter through the cast. The merged weights of the sync are unaffected (`get_delta_weight` in float32).
    """

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        w: torch.Tensor = self.weight
        b: torch.Tensor | None = self.bias
        if w.dtype != x.dtype:
            w = w.to(x.dtype)
            b = None if b is None else b.to(x.dtype)
        return torch.nn.functional.linear(x, w, b)


def compute_in_input_dtype(base: torch.nn.Module) -> int:
    """Make every plain LoRA linear layer of `base` compute its adapter in the input's dtype; returns how many."""
    from peft.tuners.lora.layer import Linear as LoraLinear

    n = 0
    for m in base.modules():
        if not isinstance(m, LoraLinear):
            continue
        subs = [sub for k in m.lora_A if k not in m.lora_variant for sub in (m.lora_A[k], m.lora_B[k])]
        if not subs or len(subs) != 2 * len(m.lora_A):
            continue  # a variant (DoRA, ...) computes on the cast input itself: leave PEFT's casting on
        if not all(type(sub) is torch.nn.Linear or type(sub) is InputDtypeLinear for sub in subs):
            continue
        m.cast_input_dtype_enabled = False
        for sub in subs:
            sub.__class__ = InputDtypeLinear
        n += 1
    return n


def _load_adapter(peft: Any, model: torch.nn.Module, p: PeftSection) -> Any:
    path = Path(p.adapter_path or "")
    if not (path / "adapter_config.json").is_file():
        raise TrainerSetupError(f"peft.adapter_path {str(path)!r} holds no adapter_config.json (a saved PEFT adapter)")
    try:
        wrapped = peft.PeftModel.from_pretrained(model, str(path), is_trainable=True)
    except (OSError, ValueError, KeyError, RuntimeError) as e:
        raise TrainerSetupError(f"peft.adapter_path {str(path)!r}: cannot load the adapter ({e})") from e
    saved = wrapped.peft_config[ADAPTER]
    theirs = {"r": saved.r, "lora_alpha": saved.lora_alpha,
              "target_modules": saved.target_modules if isinstance(saved.target_modules, str)
              else sorted(saved.target_modules or []),
              "modules_to_save": sorted(saved.modules_to_save or [])}
    ours = {"r": p.r, "lora_alpha": p.lora_alpha,
            "target_modules": p.target_modules if isinstance(p.target_modules, str) else sorted(p.target_modules),
            "modules_to_save": sorted(p.modules_to_save)}
    differ = [k for k in theirs if k in p.model_fields_set and theirs[k] != ours[k]]
    if differ:
        shown = ", ".join(f"{k}: {ours[k]!r} here, {theirs[k]!r} saved" for k in differ)
        raise TrainerSetupError(f"peft.adapter_path {str(path)!r}: the saved adapter disagrees ({shown}); "
                                "remove those fields or make them equal")
    return wrapped


def _lora_layers(base: torch.nn.Module) -> dict[str, Any]:
    from peft.tuners.lora import LoraLayer

    return {name: m for name, m in base.named_modules() if isinstance(m, LoraLayer)}


def _check_targets(wrapped: Any, p: PeftSection) -> None:
    """Every target entry adapts at least one module, and each adapted module is a plain linear (PEFT itself
    errors only when no entry matches anything, and would adapt embeddings or convolutions too)."""
    layers = _lora_layers(wrapped.get_base_model())
    if not layers:
        raise TrainerSetupError("peft.target_modules matches no module of the model")
    for name, m in layers.items():
        if not isinstance(m.get_base_layer(), torch.nn.Linear):
            raise TrainerSetupError(f"peft.target_modules: {name} is a {type(m.get_base_layer()).__name__}, not a "
                                    "linear layer; LoRA is supported on linear layers only")
    if p.adapter_path is None and p.target_modules != ALL_LINEAR:
        for entry in p.target_modules:
            if not any(matches(entry, n) for n in layers):
                raise TrainerSetupError(f"peft.target_modules entry {entry!r} matches no linear layer of the model")


def trainable_counts(model: torch.nn.Module) -> tuple[int, int]:
    """(trainable, total) parameter counts."""
    total = trainable = 0
    for p in model.parameters():
        total += p.numel()
        trainable += p.numel() if p.requires_grad else 0
    return trainable, total


# ---------------------------------------------------------------------------------------------- reference


class AdapterOffReference(torch.nn.Module):
    """Called like a model: the prepared policy's forward with every adapter disabled (the frozen base).

    Used without gradients only (reference log-probs), so it calls the unwrapped PEFT model directly, past DDP.
    A module (accelerate's unwrapping walks `_modules`) that does not register the policy as a child, so it
    owns no parameters of its own."""

    def __init__(self, policy: Any, accelerator: Any) -> None:
        super().__init__()
        self.__dict__["policy"] = policy
        self.__dict__["accelerator"] = accelerator

    @property
    def _launchgen_logp_head(self) -> Any:  # what `modeling.get_logp_head` looks up
        from launchgen.trainers.modeling import get_logp_head

        return get_logp_head(self.__dict__["policy"])

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        acc: Any = self.__dict__["accelerator"]
        inner = acc.unwrap_model(self.__dict__["policy"])
        with inner.disable_adapter():
            return inner(*args, **kwargs)


# --------------------------------------------------------------------------------------------------- sync


def _base_of(model: Any, accelerator: Any) -> torch.nn.Module:
    inner = accelerator.unwrap_model(model) if accelerator is not None else model
    base: torch.nn.Module = inner.get_base_model()
    return base


@contextlib.contextmanager
def _gathered(*modules: torch.nn.Module) -> Iterator[None]:
    """Each module's sharded parameters replaced by their gathered full tensors, restored on exit: PEFT's own
    arithmetic (`get_delta_weight`) then runs on exactly the tensors a single process holds. FSDP2's `unshard`
    would cast them to the mixed-precision param dtype instead."""
    saved: list[tuple[torch.nn.Module, str, Any]] = []
    try:
        for m in modules:
            for name, p in list(m._parameters.items()):
                if p is not None and hasattr(p, "full_tensor"):
                    saved.append((m, name, p))
                    m._parameters[name] = full_tensor(p)
        yield
    finally:
        for m, name, p in saved:
            m._parameters[name] = p


@torch.no_grad()
def merged_weight(layer: Any) -> torch.Tensor:
    """W + scaling * B @ A exactly as PEFT's (non-safe) merge writes it into W, without touching W."""
    base = layer.get_base_layer().weight.detach()
    w = base.full_tensor() if hasattr(base, "full_tensor") else base.clone()  # a gathered tensor is a fresh copy
    with _gathered(layer.lora_A[ADAPTER], layer.lora_B[ADAPTER]):
        w += layer.get_delta_weight(ADAPTER)
    return w


def _sent_linears(base: torch.nn.Module) -> list[str]:
    """Names of the linear modules whose weights change: the adapted ones, each with its whole fused group."""
    modules = dict(base.named_modules())
    adapted = set(_lora_layers(base))
    sent = set(adapted)
    for name in adapted:
        parent, _, leaf = name.rpartition(".")
        for group in FUSED_GROUPS:
            if leaf in group:
                sent.update(f"{parent}.{g}" for g in group if f"{parent}.{g}" in modules)
    return [n for n in modules if n in sent]  # named_modules order: the same on every rank and every step


def _saved_modules(base: torch.nn.Module) -> list[tuple[str, torch.nn.Module]]:
    from peft.utils import ModulesToSaveWrapper

    return [(n, m.modules_to_save[ADAPTER]) for n, m in base.named_modules() if isinstance(m, ModulesToSaveWrapper)]


def _linear_params(name: str, module: Any, lora: dict[str, Any]) -> Iterator[tuple[str, torch.Tensor]]:
    if name in lora:
        yield clean_name(f"{name}.weight"), merged_weight(module)
        bias = getattr(module.get_base_layer(), "bias", None)
    else:
        yield clean_name(f"{name}.weight"), full_tensor(module.weight)
        bias = getattr(module, "bias", None)
    if bias is not None:
        yield clean_name(f"{name}.bias"), full_tensor(bias)


def iter_sync_params(model: Any, accelerator: Any = None, full: bool = False) -> Iterator[tuple[str, torch.Tensor]]:
    """(base parameter name, tensor) of what the generation engine must receive; see the module docstring."""
    base = _base_of(model, accelerator)
    lora = _lora_layers(base)
    if full:
        yield from _iter_all_merged(base, lora)
        return
    modules = dict(base.named_modules())
    for name in _sent_linears(base):
        yield from _linear_params(name, modules[name], lora)
    for name, module in _saved_modules(base):
        for pname, p in module.named_parameters():
            yield clean_name(f"{name}.{pname}"), full_tensor(p)


def _iter_all_merged(base: torch.nn.Module, lora: dict[str, Any]) -> Iterator[tuple[str, torch.Tensor]]:
    for name, p in base.named_parameters():
        if ".lora_" in name or ".original_module." in name:
            continue
        if ".base_layer." in name:
            owner, _, leaf = name.partition(".base_layer.")
            if leaf == "weight" and owner in lora:
                yield clean_name(f"{owner}.weight"), merged_weight(lora[owner])
                continue
            name = f"{owner}.{leaf}"
        yield clean_name(name.replace(f".modules_to_save.{ADAPTER}.", ".")), full_tensor(p)


# -------------------------------------------------------------------------------------------- checkpoints


def register_adapter_checkpoints(accelerator: Any, model: Any, optimizer: Any) -> ShardedAdapterState | None:
    """Checkpoints hold the trainable tensors only. One process / DDP: accelerate's save_state writes them (the
    hooks below filter its weights) and load_state reads them back strictly. FSDP2: the returned state writes and
    reads them itself (`checkpoint.save_checkpoint` withholds the policy from accelerate)."""
    keys = {n for n, p in model.named_parameters() if p.requires_grad}
    if sharded_fsdp2(accelerator):
        return ShardedAdapterState(accelerator, model, optimizer)

    def save_hook(models: list[Any], weights: list[dict[str, Any]], output_dir: str) -> None:
        for i, m in enumerate(models):
            if m is model and i < len(weights):
                weights[i] = {k: v for k, v in weights[i].items() if k in keys}

    def load_hook(models: list[Any], input_dir: str) -> None:
        from safetensors.torch import load_file

        if not models or models[0] is not model:
            raise RuntimeError("peft checkpoints expect the policy as the only prepared model")
        models.pop(0)  # loaded here: accelerate's strict load would miss the frozen base
        state = load_file(str(Path(input_dir) / _MODEL_FILE), device=str(accelerator.device))
        _check_adapter_keys(set(state), keys, input_dir)
        result = model.load_state_dict(state, strict=False)
        assert not result.unexpected_keys, result.unexpected_keys

    accelerator.register_save_state_pre_hook(save_hook)
    accelerator.register_load_state_pre_hook(load_hook)
    return None


def _check_adapter_keys(found: set[str], keys: set[str], input_dir: str | Path) -> None:
    if found != keys:
        missing, extra = sorted(keys - found)[:3], sorted(found - keys)[:3]
        raise TrainerSetupError(f"resume: {input_dir} does not hold this run's adapter (missing {missing}, "
                                f"unexpected {extra}); resume with the same train.backend, or set resume: never "
                                "to start fresh")


def _torch_optimizer(optimizer: Any) -> torch.optim.Optimizer:
    while hasattr(optimizer, "optimizer"):  # accelerate's AcceleratedOptimizer wraps the torch one
        optimizer = optimizer.optimizer
    assert isinstance(optimizer, torch.optim.Optimizer)
    return optimizer


class ShardedAdapterState:
    """LoRA under FSDP2: the adapter and its AdamW state in a checkpoint, gathered to full tensors.

    accelerate's FSDP save_state writes every parameter, the frozen base included (its adapter-only switch is
    not reachable from save_state), so `checkpoint.save_checkpoint` withholds the policy and its optimizer from
    accelerate (`withheld`) and calls `save` / `load`. The files are a DDP checkpoint's names: model.safetensors
    (the trainable tensors under the prepared model's parameter names) and optimizer.bin, here keyed by
    parameter name (torch.distributed.checkpoint's full optimizer state dict) instead of by index. Gathering and
    re-sharding only copy, so a resume is exact; the checkpoint is as small as a DDP one and holds no shard layout.
    """

    def __init__(self, accelerator: Any, model: Any, optimizer: Any) -> None:
        self.accelerator, self.model, self.optimizer = accelerator, model, optimizer
        self.keys = [n for n, p in model.named_parameters() if p.requires_grad]  # the same order on every rank

    @contextlib.contextmanager
    def withheld(self) -> Iterator[None]:
        """accelerate's save_state / load_state inside see neither the policy nor its optimizer (RNG, scheduler
        and scaler are still theirs)."""
        acc = self.accelerator
        models, optimizers = acc._models, acc._optimizers
        acc._models = [m for m in models if m is not self.model]
        acc._optimizers = [o for o in optimizers if o is not self.optimizer]
        try:
            yield
        finally:
            acc._models, acc._optimizers = models, optimizers

    def save(self, directory: Path) -> None:
        """Collective: every rank gathers; rank 0 writes."""
        from safetensors.torch import save_file
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

        main = self.accelerator.is_main_process
        params = dict(self.model.named_parameters())
        state = {}
        for name in self.keys:
            full = full_tensor(params[name])
            if main:
                state[name] = full.cpu().contiguous()
        optim = get_optimizer_state_dict(self.model, _torch_optimizer(self.optimizer),
                                         options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        if main:
            save_file(state, str(directory / _MODEL_FILE))
            torch.save(optim, directory / _OPTIMIZER_FILE)

    def load(self, directory: Path) -> None:
        """Every rank reads the full tensors and keeps its own shard of them."""
        from safetensors.torch import load_file
        from torch.distributed.checkpoint.state_dict import (
            StateDictOptions,
            set_model_state_dict,
            set_optimizer_state_dict,
        )

        state: dict[str, Any] = load_file(str(directory / _MODEL_FILE))
        _check_adapter_keys(set(state), set(self.keys), directory)
        result = set_model_state_dict(self.model, state, options=StateDictOptions(full_state_dict=True, strict=False))
        assert not result.unexpected_keys, result.unexpected_keys
        optim = torch.load(directory / _OPTIMIZER_FILE, weights_only=True)
        set_optimizer_state_dict(self.model, _torch_optimizer(self.optimizer), optim,
                                 options=StateDictOptions(full_state_dict=True))


def save_final(accelerator: Any, model: Any, tokenizer: Any, final: Path, save_merged: bool) -> None:
    """`final/`: the adapter and tokenizer; `final/merged`: base + adapter merged (in place: the run is over;
    under FSDP2 from gathered tensors, every rank taking part and rank 0 writing)."""
    inner = accelerator.unwrap_model(model)
    if sharded_fsdp2(accelerator):
        _save_final_sharded(accelerator, inner, tokenizer, final, save_merged)
    elif accelerator.is_main_process:
        inner.save_pretrained(str(final), safe_serialization=True)
        tokenizer.save_pretrained(str(final))
        if save_merged:
            merged = inner.merge_and_unload()
            merged.save_pretrained(str(final / "merged"), safe_serialization=True)
            tokenizer.save_pretrained(str(final / "merged"))
    accelerator.wait_for_everyone()


def _save_final_sharded(accelerator: Any, inner: Any, tokenizer: Any, final: Path, save_merged: bool) -> None:
    main = accelerator.is_main_process
    adapter: dict[str, torch.Tensor] = {}
    for name, p in inner.state_dict(keep_vars=True).items():  # PEFT filters the adapter's keys out of these
        if isinstance(p, torch.nn.Parameter) and p.requires_grad:
            full = full_tensor(p)
            if main:
                adapter[name] = full.cpu()
    merged: dict[str, torch.Tensor] = {}
    if save_merged:
        base = inner.get_base_model()
        for name, t in _iter_all_merged(base, _lora_layers(base)):
            if main:
                merged[name] = t.cpu()
    if not main:
        return
    inner.save_pretrained(str(final), safe_serialization=True, state_dict=adapter)
    tokenizer.save_pretrained(str(final))
    if save_merged:
        inner.get_base_model().save_pretrained(str(final / "merged"), state_dict=merged, safe_serialization=True)
        tokenizer.save_pretrained(str(final / "merged"))
