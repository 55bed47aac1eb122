"""The decode step's device state: the static key/value cache, the sampler's settings key and every tensor a
captured step reads or writes; the cache (with LoRA's merged weights) is one flat buffer (`_Arena`) that can be
lent back between calls."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch


class _Arena:
    """Tensors of one dtype carved out of one flat device buffer: the KV cache and LoRA's merged weights.

    Why one buffer: the captured decode graphs replay fixed addresses. Between generation calls the buffer can go
    back to the caching allocator (`give_back`, no `empty_cache`), so training reuses that memory for its
    activations; the next call takes one block of the same size again (`take`), which the allocator's best fit
    hands out at the same address as long as training freed it, and the graphs replay. Where the address moved,
    the caller sees a different `ptr` and recaptures. Every tensor comes back zeroed, as a fresh allocation would
    (unwritten cache columns are read under the mask, and must not hold NaNs). One dtype: a view of another dtype
    than its base is an input mutation aot_autograd refuses to compile.
    """

    ALIGN = 256  # elements

    def __init__(self, shapes: list[tuple[int, ...]], dtype: torch.dtype, device: torch.device) -> None:
        self.shapes, self.dtype, self.device = shapes, dtype, device
        self.offsets: list[int] = []
        off = 0
        for shape in shapes:
            self.offsets.append(off)
            off += -(-_numel(shape) // self.ALIGN) * self.ALIGN
        self.numel = max(off, 1)
        self.nbytes = self.numel * torch.empty(0, dtype=dtype).element_size()
        self.buf: torch.Tensor | None = None

    def take(self) -> list[torch.Tensor]:
        self.buf = torch.zeros(self.numel, dtype=self.dtype, device=self.device)
        return [self.buf[off: off + _numel(shape)].view(shape) for shape, off in zip(self.shapes, self.offsets,
                                                                                    strict=True)]

    def give_back(self) -> None:
        self.buf = None

    @property
    def ptr(self) -> int:
        return 0 if self.buf is None else int(self.buf.data_ptr())


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for s in shape:
        n *= s
    return n


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

    def shapes(self, batch: int, kv_heads: int, head_dim: int, capacity: int) -> list[tuple[int, ...]]:
        """Keys then values of every layer, in the order `bind` takes them."""
        return [(batch, kv_heads, capacity, head_dim)] * (2 * len(self.keys))

    def bind(self, tensors: list[torch.Tensor], capacity: int) -> None:
        n = len(self.keys)
        self.keys, self.values = list(tensors[:n]), list(tensors[n:])
        self.capacity = capacity

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int,
               *args: Any, **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
        k, v = self.keys[layer_idx], self.values[layer_idx]
        if k is None or v is None or self.write_cols is None:
            raise RuntimeError("_StaticKV.update called before bind()/write_cols were set")
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
    """Every other tensor a decode step reads or writes (small next to the cache: they stay allocated), allocated
    once per (batch, capacity, max_new) shape, with the graphs captured over them."""

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
        # Storage addresses the graphs were captured with (the arena and every parameter): a graph replays those
        # addresses, so an arena taken elsewhere or a parameter whose storage moved (reassigned, .to(),
        # load_state_dict(assign=True)) voids them.
        self.weights_key: tuple[int, ...] = ()
