"""`iter_full_named_params`: the trainer's weights as full tensors with the names vLLM's `load_weights` expects.

Collective under sharding: every rank must walk the iterator to the end, in the same order (the order of
`named_parameters()`, identical on all ranks), because each step may all-gather. One parameter is materialised
at a time (FSDP2 `full_tensor()`, ZeRO-3 `GatheredParameters`), so peak memory is one full parameter; FSDP1 has
no per-parameter gather, so its whole model is summoned once.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch

#: Wrapper prefixes that torch.compile, activation checkpointing, FSDP1 and DDP insert into parameter names.
_WRAPPER_PARTS = ("_orig_mod", "_checkpoint_wrapped_module", "_fsdp_wrapped_module")


def clean_name(name: str) -> str:
    parts = [p for p in name.split(".") if p not in _WRAPPER_PARTS]
    if parts and parts[0] == "module":  # DDP / DeepSpeed engine prefix only at the front
        parts = parts[1:]
    return ".".join(parts)


def iter_full_named_params(model: torch.nn.Module, accelerator: Any = None) -> Iterator[tuple[str, torch.Tensor]]:
    from accelerate.utils import DistributedType

    dist_type = getattr(accelerator, "distributed_type", DistributedType.NO)
    inner = accelerator.unwrap_model(model) if accelerator is not None else model

    if dist_type == DistributedType.DEEPSPEED:
        import deepspeed

        zero3 = accelerator.state.deepspeed_plugin.zero_stage == 3
        for name, p in inner.named_parameters():
            ctx = deepspeed.zero.GatheredParameters([p]) if zero3 else contextlib.nullcontext()
            with ctx:
                yield clean_name(name), p.detach()
        return

    fsdp1_ctx: contextlib.AbstractContextManager[Any] = contextlib.nullcontext()
    if dist_type == DistributedType.FSDP:
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

        if isinstance(model, FSDP):
            fsdp1_ctx = FSDP.summon_full_params(model, recurse=True, writeback=False)
            inner = model
    with fsdp1_ctx:
        for name, p in inner.named_parameters():
            yield clean_name(name), full_tensor(p)


def full_tensor(t: torch.Tensor) -> torch.Tensor:
    """The whole of a parameter, detached: an FSDP2 / TP DTensor shard is all-gathered (a collective every rank
    runs), any other tensor is itself."""
    t = t.detach()
    return t.full_tensor() if hasattr(t, "full_tensor") else t
