"""`memory_budget_gib`: the memory-only knobs chosen so that one training process's peak fits a budget.

The knobs change where memory goes, never the gradient: `max_tokens_per_forward` (a micro-batch as several
forward/backward passes, `passes.py`) and `model.logits_chunk_mib` (the log-prob head's fp32 tiles). The KV cache
of the static-cache engine is not a knob here: by default (`generation.keep_kv_cache: lend`) it is handed back to
the allocator before training, so generation and training do not peak together.

The budget is for the allocator's peak (`torch.cuda.max_memory_allocated`, what benchmarks/RESULTS.md reports),
of which `MARGIN` is kept back for what the estimate does not model. The estimate:

* static, measured on the prepared model: every parameter held by this process (a shard under FSDP) in its dtype,
  plus, per trainable parameter, its gradient and AdamW's two moments in its dtype; a frozen reference copy too;
* per token of a forward pass, from the model's config: with gradient checkpointing each decoder layer's kept
  input (hidden x 2 bytes x layers) plus one layer's recomputed activations (2 bytes x (ACT_HIDDEN_UNITS x hidden +
  ACT_KV_UNITS x kv heads x head size + ACT_INTERMEDIATE_UNITS x intermediate)); without it every layer's; doubled in fp32;
* the head's tiles: `LOGIT_TILE_COPIES` fp32 tiles of `logits_chunk_mib` alive at once.

The constants are the plan-time estimate's (`launchgen/shared/estimate.py`: `ACT_*_UNITS`, `LOGIT_TILE_COPIES`), the one
owner; there they are checked against measured H200 peaks (benchmarks/RESULTS.md).

The choice: the largest `max_tokens_per_forward` (a multiple of 256 tokens, at most a user-set value) whose pass
fits with the configured head tiles; if that is under `MIN_TOKENS_PER_PASS`, the head's tiles shrink to 64 MiB
first. Passes cost time (smaller GEMMs), so the budget should be the memory actually available, not lower.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from launchgen.trainers.declarations.config import TrainerConfig
from launchgen.trainers.declarations.errors import TrainerSetupError

from launchgen.shared.estimate import (
    ACT_HIDDEN_UNITS,
    ACT_INTERMEDIATE_UNITS,
    ACT_KV_UNITS,
    LOGIT_TILE_COPIES,
)

GIB = 2**30
#: Share of the budget kept back for what the estimate leaves out (allocator rounding, cuBLAS workspaces, ...).
MARGIN = 0.08
#: Below this many tokens per pass the GEMMs get small; shrink the head's tiles before going lower.
MIN_TOKENS_PER_PASS = 4096
LEAN_LOGITS_CHUNK_MIB = 64
TOKEN_STEP = 256


@dataclass(frozen=True)
class BudgetChoice:
    budget_gib: float
    static_bytes: int
    bytes_per_token: int
    head_bytes: int
    max_tokens_per_forward: int | None
    logits_chunk_mib: int

    @property
    def peak_bytes_at_limit(self) -> int:
        tokens = self.max_tokens_per_forward or 0
        return self.static_bytes + tokens * self.bytes_per_token + self.head_bytes

    def report(self) -> str:
        passes = (f"max_tokens_per_forward {self.max_tokens_per_forward}" if self.max_tokens_per_forward is not None
                  else "max_tokens_per_forward unchanged (passes not available here)")
        return (f"[launchgen] memory_budget_gib {self.budget_gib:g}: weights + gradients + optimizer state "
                f"{self.static_bytes / GIB:.2f} GiB, activations {self.bytes_per_token / 2**10:.1f} KiB per token "
                f"of a pass, head tiles {self.head_bytes / GIB:.2f} GiB -> {passes}, logits_chunk_mib "
                f"{self.logits_chunk_mib} (estimated peak {self.peak_bytes_at_limit / GIB:.2f} GiB)")


def _local_numel(p: torch.Tensor) -> int:
    local = p.to_local() if hasattr(p, "to_local") else p
    return int(local.numel())


def static_bytes(model: torch.nn.Module, ref: torch.nn.Module | None) -> int:
    """This process's parameters, and the gradient and two AdamW moments of each trainable one, in its dtype."""
    total = 0
    for m in (model, ref):
        if m is None:
            continue
        for p in m.parameters():
            n = _local_numel(p) * p.element_size()
            total += n * (4 if p.requires_grad and m is model else 1)
    return total


def bytes_per_token(cfg: TrainerConfig, text_config: Any, checkpointing: bool | None = None) -> int:
    """Activation bytes per token of a pass; `checkpointing` as the policy runs (None: only an explicit `true`)."""
    hidden = int(text_config.hidden_size)
    layers = int(text_config.num_hidden_layers)
    heads = int(text_config.num_attention_heads)
    kv = int(getattr(text_config, "num_key_value_heads", None) or heads)
    head_dim = int(getattr(text_config, "head_dim", None) or hidden // heads)
    inter = int(getattr(text_config, "intermediate_size", 4 * hidden))
    unit = 4 if cfg.precision == "fp32" else 2
    per_layer = int(unit * (ACT_HIDDEN_UNITS * hidden + ACT_KV_UNITS * kv * head_dim
                            + ACT_INTERMEDIATE_UNITS * inter))
    on = cfg.model.gradient_checkpointing is True if checkpointing is None else checkpointing
    kept = hidden * unit * layers if on else per_layer * layers
    return kept + per_layer


def choose(cfg: TrainerConfig, static: int, per_token: int, passes_available: bool = True) -> BudgetChoice:
    """The knobs for `cfg.memory_budget_gib` (see the module docstring); a budget the static state alone
    exceeds is a setup error naming the field."""
    budget = cfg.memory_budget_gib
    assert budget is not None
    usable = int(budget * GIB * (1 - MARGIN))
    user_chunk = cfg.model.logits_chunk_mib
    chunk = user_chunk

    def head(c: int) -> int:
        return LOGIT_TILE_COPIES * c * 2**20

    def tokens_for(c: int) -> int:
        return max(0, (usable - static - head(c)) // per_token) // TOKEN_STEP * TOKEN_STEP

    tokens = tokens_for(chunk)
    if tokens < MIN_TOKENS_PER_PASS and chunk > LEAN_LOGITS_CHUNK_MIB:
        chunk = LEAN_LOGITS_CHUNK_MIB
        tokens = tokens_for(chunk)
    if tokens < TOKEN_STEP:
        raise TrainerSetupError(
            f"memory_budget_gib {budget:g}: the weights, gradients and optimizer state of this process take "
            f"{static / GIB:.2f} GiB and a forward pass of {TOKEN_STEP} tokens another "
            f"{(TOKEN_STEP * per_token + head(chunk)) / GIB:.2f} GiB; raise the budget (or use LoRA, FSDP)")
    if cfg.max_tokens_per_forward is not None:
        tokens = min(tokens, cfg.max_tokens_per_forward)
    return BudgetChoice(budget_gib=budget, static_bytes=static, bytes_per_token=per_token, head_bytes=head(chunk),
                        max_tokens_per_forward=tokens if passes_available else None, logits_chunk_mib=chunk)


def apply(cfg: TrainerConfig, model: Any, ref: Any, accelerator: Any) -> BudgetChoice | None:
    """Set the chosen knobs on `cfg` and on the log-prob heads, print the choice on the main process."""
    if cfg.memory_budget_gib is None:
        return None
    from accelerate.utils import DistributedType
    from launchgen.trainers import modeling

    inner = accelerator.unwrap_model(model)
    text = inner.config.get_text_config() if hasattr(inner.config, "get_text_config") else inner.config
    # Passes are refused under DeepSpeed (core) and with GRPO's whole-micro-batch entropy options (objectives.grpo).
    # (the entropy options exist on GRPO's config only)
    passes = (accelerator.distributed_type != DistributedType.DEEPSPEED
              and getattr(cfg, "top_entropy_quantile", 1.0) >= 1.0 and getattr(cfg, "entropy_coef", 0.0) == 0.0)
    choice = choose(cfg, static_bytes(model, ref if isinstance(ref, torch.nn.Module) and
                                      any(True for _ in ref.parameters()) else None),
                    bytes_per_token(cfg, text, bool(getattr(inner, "is_gradient_checkpointing", False))), passes)
    if choice.max_tokens_per_forward is not None:
        cfg.max_tokens_per_forward = choice.max_tokens_per_forward
    cfg.model.logits_chunk_mib = choice.logits_chunk_mib
    for m in (model, ref):
        if m is not None:
            modeling.get_logp_head(m).chunk_elements = choice.logits_chunk_mib * 2**20 // 4
    if accelerator.is_main_process:
        print(choice.report(), flush=True)
    return choice
