"""The decode step's device state: the static key/value cache, the sampler's settings key and every tensor a
captured step reads or writes."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch


class _StaticKV:
    """Preallocated per-layer key/value tensors with the write column held on the device.

    It implements the one method transformers' attention layers call on a cache (`update`). Every row writes
    the same column each step (prompts are left-padded to one length), so one scalar position suffices.
    """

    def __init__(self, num_layers: int) -> None:
        self.keys: list[torch.Tensor | None] = [None] * num_layers
        self.values: list[torch.Tensor | None] = [None] * num_layers
        self.capacity = 0
        # Columns the attention reads this call; a Python int so each captured graph reads a fixed view.
        self.view_len = 0
        # Columns written by the current forward: arange(q_len) + start, set before each forward.
        self.write_cols: torch.Tensor | None = None

    def allocate(self, batch: int, kv_heads: int, head_dim: int, capacity: int, dtype: torch.dtype,
                 device: torch.device) -> None:
        self.capacity = capacity
        for i in range(len(self.keys)):
            self.keys[i] = torch.zeros(batch, kv_heads, capacity, head_dim, dtype=dtype, device=device)
            self.values[i] = torch.zeros(batch, kv_heads, capacity, head_dim, dtype=dtype, device=device)

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int,
               *args: Any, **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
        k, v = self.keys[layer_idx], self.values[layer_idx]
        if k is None or v is None or self.write_cols is None:
            raise RuntimeError("_StaticKV.update called before allocate()/write_cols were set")
        k.index_copy_(2, self.write_cols, key_states.to(k.dtype))
        v.index_copy_(2, self.write_cols, value_states.to(v.dtype))
        return k[:, :, : self.view_len], v[:, :, : self.view_len]

    # transformers asks caches for these in a few generic code paths; answer like a static cache would.
    def get_seq_length(self, layer_idx: int = 0) -> int:
        return self.view_len

    def get_max_cache_shape(self, layer_idx: int = 0) -> int:
        return self.capacity

    def free(self) -> None:
        self.keys = [None] * len(self.keys)
        self.values = [None] * len(self.values)
        self.write_cols = None
        self.capacity = 0


@dataclass(frozen=True)
class _SamplerKey:
    greedy: bool
    temperature: float
    top_k: int
    top_p: float
    min_p: float
    repetition_penalty: float


class _State:
    """Every tensor a decode step reads or writes, allocated once per (batch, capacity, max_new) shape."""

    def __init__(self, batch: int, capacity: int, max_new: int, vocab: int, mask_dtype: torch.dtype,
                 device: torch.device, need_seen: bool) -> None:
        self.batch, self.capacity, self.max_new = batch, capacity, max_new
        self.cur = torch.zeros(batch, dtype=torch.long, device=device)  # token fed at this step
        self.pos = torch.zeros(batch, dtype=torch.long, device=device)  # its rotary position
        self.col = torch.zeros(1, dtype=torch.long, device=device)  # its cache column
        self.prompt_len = torch.zeros(1, dtype=torch.long, device=device)
        self.done = torch.zeros(batch, dtype=torch.bool, device=device)
        self.mask = torch.zeros(batch, 1, 1, capacity, dtype=mask_dtype, device=device)
        self.tokens = torch.zeros(batch, max_new, dtype=torch.long, device=device)
        self.logprobs = torch.zeros(batch, max_new, dtype=torch.float32, device=device)
        self.stop_ids = torch.zeros(0, dtype=torch.long, device=device)
        self.seen = torch.zeros(batch, vocab, dtype=torch.bool, device=device) if need_seen else None
        self.graphs: dict[tuple[_SamplerKey, int], torch.cuda.CUDAGraph] = {}
        # Storage addresses of the parameters the graphs were captured with: a graph replays those addresses, so
        # a parameter whose storage moved (reassigned, .to(), load_state_dict(assign=True)) voids them.
        self.weights_key: tuple[int, ...] = ()
