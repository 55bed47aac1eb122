"""LoRA (PEFT) adapters in the fused decode: each adapted projection decodes with its merged weight.

Why merged weights rather than adapter-aware layers: a decode step is bound by the kernels it launches, and the
adapters would add two small GEMMs per adapted projection (about 8-14 per layer, even with the q/k/v and
gate/up `A` matrices stacked), roughly a third more kernels per step at the 3B shape; merged, the step is exactly
full fine-tuning's. The merge is PEFT's own arithmetic (`W + get_delta_weight()`, i.e. W + scaling * B @ A in
the adapter's float32, added into a copy of W in W's dtype), so the bits equal `merge_and_unload()`'s and the
merged weights the vLLM backends receive (`trainers/lora.py`); the trainer's own base weights are never touched.
The copies live in the engine's arena (`state._Arena`): they are recomputed at the start of every call, after
the optimizer has moved the adapters, and lent back with the KV cache between calls, so training does not hold
them. The cost of the merge is one pass over the adapted weights per generation call (0.05 s at the 3B shape,
benchmarks/RESULTS.md).

Precision: in a bf16 model the merged weight is rounded to bf16 per element, as for the vLLM backends' merged
push, while the trainer's forward adds the adapter's output after the base GEMM; the two policies agree up to
that rounding (measured as the sampled log-probs against the trainer's recomputation, benchmarks/RESULTS.md).

Only plain LoRA merges into one weight: a layer with a LoRA variant (DoRA, ...), a LoRA bias or several active
adapters keeps the modules decode path (PEFT's own forward), which is exact and slower.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn


def is_lora_layer(m: Any) -> bool:
    """A PEFT LoRA layer (duck-typed: peft stays optional for models without adapters)."""
    return all(hasattr(m, a) for a in ("get_base_layer", "lora_A", "lora_B", "get_delta_weight", "active_adapters"))


def mergeable_base(m: Any) -> nn.Module | None:
    """The base linear of a LoRA layer whose adapters merge into one weight by PEFT's arithmetic, else None."""
    if not is_lora_layer(m):
        return None
    if getattr(m, "lora_variant", None) or any(getattr(m, "lora_bias", {}).values()):
        return None
    if len([a for a in m.active_adapters if a in m.lora_A]) > 1:
        return None
    base: nn.Module = m.get_base_layer()
    return base


def adapted_linears(decoder: nn.Module) -> list[Any]:
    """The decoder's LoRA layers, in module order (the arena's order, the same every call)."""
    return [m for m in decoder.modules() if is_lora_layer(m)]


@torch.no_grad()
def merge_into(layer: Any, out: torch.Tensor) -> None:
    """`out` = the weight `layer` computes with now: its base weight plus each active adapter's delta, unless
    the adapters are disabled or already merged in place (then the base weight is that weight)."""
    base = layer.get_base_layer().weight
    out.copy_(base)
    if getattr(layer, "disable_adapters", False) or getattr(layer, "merged", False):
        return
    # Outside autocast: PEFT merges in the adapter's own dtype (float32), whatever the trainer's autocast.
    with torch.autocast(out.device.type, enabled=False):
        for name in layer.active_adapters:
            if name in layer.lora_A:
                out += layer.get_delta_weight(name)
