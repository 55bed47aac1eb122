"""What a separate generation engine (the vLLM server, the colocated engine) receives after an optimizer step:
every weight, or with `peft` the merged adapted modules. Its own module because it picks between `weights` and
`lora`, and `lora` builds on `weights`."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch
from launchgen.trainers.weights import iter_full_named_params


def iter_sync_params(
    model: torch.nn.Module, accelerator: Any, cfg: Any, full: bool = False
) -> Iterator[tuple[str, torch.Tensor]]:
    """All weights, or with `peft` the merged adapted modules (`full`: every weight, merged; see
    `lora.iter_sync_params`)."""
    if getattr(cfg, "peft", None) is not None:
        from launchgen.trainers import lora  # peft's wrapper: only for a LoRA run

        return lora.iter_sync_params(model, accelerator, full=full)
    return iter_full_named_params(model, accelerator)
