"""The fused decode's own weight copies: q/k/v and gate/up stacked into one weight each, and LoRA's merged weights.

Why stacked copies: a decode step at batch 64 is a chain of skinny GEMMs and small kernels, and each kernel costs
a few microseconds of launch, ramp-up and tail on top of its bytes; the narrow k and v projections (256 rows at
the 3B shape) read 1 MB each but cost a whole GEMM launch. Stacked, a layer issues 2 GEMMs where it issued 5 (3
fewer kernels x 36 layers at the 3B shape), and the stacked GEMMs are wide enough to fill the device. The copies
take about 0.64 of the weights' bytes once more (q/k/v and gate/up: 3.6 GB at the 3B shape), which is why they live in
the engine's arena (`state._Arena`) with the KV cache: they exist only while generating, are refreshed from the
trainer's live parameters at the start of every call (one pass over those bytes, a few ms at 3B, and exact: a
copy), and go back to the caching allocator with the cache between calls, so training never holds them.

LoRA: an adapted projection's merged weight (PEFT's arithmetic, `adapters.merge_into`) is written straight into its
rows of the stacked copy; o/down (and every projection when stacking is off) get a merged copy of their own.

The stacked copies are in the arena's dtype (the KV cache's: the autocast dtype for fp32 weights under autocast,
where F.linear would cast each weight to it anyway). Merged weights of another dtype than the arena's (fp32 LoRA
under autocast) are held outside it, as before stacking.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from .adapters import is_lora_layer, merge_into
from .fused import _layer_weights, _LayerWeights


@dataclass
class _Slot:
    """One weight copy: `members` are (module, first row, end row) filled from that module's weight, or from its
    bias when `bias` (a member without a bias fills zeros)."""

    shape: tuple[int, ...]
    dtype: torch.dtype
    members: list[tuple[Any, int, int]]
    bias: bool = False
    tensor: torch.Tensor | None = field(default=None, repr=False)


def _base(m: Any) -> Any:
    """The nn.Linear holding the trainer's weight (a LoRA layer's base layer)."""
    return m.get_base_layer() if is_lora_layer(m) else m


def _stack(members: list[Any], dtype: torch.dtype, bias: bool) -> _Slot:
    rows, spans = 0, []
    for m in members:
        n = int(_base(m).weight.shape[0])
        spans.append((m, rows, rows + n))
        rows += n
    in_features = int(_base(members[0]).weight.shape[1])
    return _Slot((rows,) if bias else (rows, in_features), dtype, spans, bias)


class DecodeWeights:
    """The copies one decode shape needs, laid out once (`shapes`), bound to arena views (`bind`), refreshed at the
    start of every call (`refresh`), read as each layer's `_LayerWeights` (`layer_weights`)."""

    def __init__(self, layers: list[Any], adapted: list[Any], stack: bool, dtype: torch.dtype) -> None:
        self.layers, self.stack, self.dtype = layers, stack, dtype
        adapted_ids = {id(m) for m in adapted}
        self.slots: list[_Slot] = []
        # Per layer: the stacked slots (qkv weight, qkv bias or None, gate/up weight) when stacking.
        self._stacked: list[tuple[_Slot, _Slot | None, _Slot]] = []
        # id(LoRA module) -> (slot, rows): where its merged weight is.
        self._merged_at: dict[int, tuple[_Slot, int, int]] = {}
        for layer in layers:
            attn, mlp = layer.self_attn, layer.mlp
            own: list[Any] = [attn.o_proj, mlp.down_proj]
            if stack:
                qkv_m = [attn.q_proj, attn.k_proj, attn.v_proj]
                qkv = _stack(qkv_m, dtype, bias=False)
                has_bias = any(_base(m).bias is not None for m in qkv_m)
                qkv_b = _stack(qkv_m, dtype, bias=True) if has_bias else None
                gate_up = _stack([mlp.gate_proj, mlp.up_proj], dtype, bias=False)
                self._stacked.append((qkv, qkv_b, gate_up))
                self.slots += [s for s in (qkv, qkv_b, gate_up) if s is not None]
                for slot in (qkv, gate_up):
                    for m, a, b in slot.members:
                        if id(m) in adapted_ids:
                            self._merged_at[id(m)] = (slot, a, b)
            else:
                own += [attn.q_proj, attn.k_proj, attn.v_proj, mlp.gate_proj, mlp.up_proj]
            for m in own:
                if id(m) in adapted_ids:
                    w = _base(m).weight
                    slot = _Slot(tuple(w.shape), w.dtype, [(m, 0, int(w.shape[0]))])
                    self.slots.append(slot)
                    self._merged_at[id(m)] = (slot, 0, int(w.shape[0]))
        # A merged weight in another dtype than the arena's (fp32 LoRA under autocast) is held outside it.
        self.outside = [s for s in self.slots if s.dtype != dtype]
        self.inside = [s for s in self.slots if s.dtype == dtype]
        for s in self.outside:
            s.tensor = torch.empty(s.shape, dtype=s.dtype, device=_base(s.members[0][0]).weight.device)

    def shapes(self) -> list[tuple[int, ...]]:
        """The arena's share, in the order `bind` takes its views."""
        return [s.shape for s in self.inside]

    def bind(self, tensors: list[torch.Tensor]) -> None:
        for s, t in zip(self.inside, tensors, strict=True):
            s.tensor = t

    def unbind(self) -> None:
        for s in self.inside:
            s.tensor = None

    def held(self) -> list[torch.Tensor]:
        """The copies held outside the arena (their addresses are part of what the captured graphs replay)."""
        return [s.tensor for s in self.outside if s.tensor is not None]

    @torch.no_grad()
    def refresh(self) -> None:
        """Copy the trainer's weights (merging the adapters as the optimizer left them) into the bound copies."""
        for s in self.slots:
            t = s.tensor
            assert t is not None, "DecodeWeights.refresh before bind"
            for m, a, b in s.members:
                rows = t[a:b]
                base = _base(m)
                if s.bias:
                    if base.bias is None:
                        rows.zero_()
                    else:
                        rows.copy_(base.bias)
                elif not is_lora_layer(m):
                    rows.copy_(base.weight)
                elif rows.dtype == base.weight.dtype:
                    merge_into(m, rows)
                else:  # merge in the weight's own dtype, then round once, as autocast would round the merged weight
                    full = torch.empty_like(base.weight)
                    merge_into(m, full)
                    rows.copy_(full)

    def merged(self) -> dict[int, torch.Tensor]:
        """id(LoRA module) -> the weight the decode computes with for it (a view of its copy)."""
        out = {}
        for key, (s, a, b) in self._merged_at.items():
            assert s.tensor is not None
            out[key] = s.tensor[a:b]
        return out

    def layer_weights(self) -> list[_LayerWeights]:
        merged = self.merged()
        out = []
        for i, layer in enumerate(self.layers):
            w = _layer_weights(layer, merged)
            if self.stack:
                qkv, qkv_b, gate_up = self._stacked[i]
                assert qkv.tensor is not None and gate_up.tensor is not None
                (_, q0, q1), (_, k0, k1), (_, v0, v1) = qkv.members
                (_, g0, g1), (_, u0, u1) = gate_up.members
                w = w._replace(
                    q_weight=qkv.tensor[q0:q1], k_weight=qkv.tensor[k0:k1], v_weight=qkv.tensor[v0:v1],
                    gate_weight=gate_up.tensor[g0:g1], up_weight=gate_up.tensor[u0:u1],
                    qkv_weight=qkv.tensor, qkv_bias=None if qkv_b is None else qkv_b.tensor,
                    gate_up_weight=gate_up.tensor)
            out.append(w)
        return out
