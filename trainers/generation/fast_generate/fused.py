"""The fused decode forward: the Llama-family decoder layer as one pure function of tensors (`_fused_decoder_layer`,
one compiled graph for every layer) and the structural checks that decide whether a model may take it
(`_fused_spec`; see the package docstring)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from .adapters import is_lora_layer, mergeable_base
from .attention import _gqa_attention

#: model_type values whose decoder layers `_fused_decoder_layer` reproduces (after the structural checks in
#: `_fused_spec`); anything else keeps the modules path.
_FUSED_MODEL_TYPES = frozenset({"llama", "mistral", "qwen2", "qwen3"})


class _LayerWeights(NamedTuple):
    """The live parameters of one Llama-family decoder layer (None where the architecture has no such tensor)."""

    input_norm: torch.Tensor
    q_weight: torch.Tensor
    q_bias: torch.Tensor | None
    k_weight: torch.Tensor
    k_bias: torch.Tensor | None
    v_weight: torch.Tensor
    v_bias: torch.Tensor | None
    o_weight: torch.Tensor
    q_norm: torch.Tensor | None
    k_norm: torch.Tensor | None
    post_norm: torch.Tensor
    gate_weight: torch.Tensor
    up_weight: torch.Tensor
    down_weight: torch.Tensor
    # One GEMM instead of three (q/k/v) or two (gate/up): the rows of q, k, v (gate, up) stacked, with the biases
    # stacked alike; None = the separate projections above (see `weight_copies`). The fields above stay set: the
    # stacked GEMM's output splits at their row counts.
    qkv_weight: torch.Tensor | None = None
    qkv_bias: torch.Tensor | None = None
    gate_up_weight: torch.Tensor | None = None


def _layer_weights(layer: Any, merged: dict[int, torch.Tensor] | None = None) -> _LayerWeights:
    """Read a layer's parameters now (not cached: the trainer may replace or move them between calls). A LoRA
    projection reads its merged weight from `merged` (keyed by the module's id) and its base layer's bias."""
    attn, mlp = layer.self_attn, layer.mlp
    q_norm = getattr(attn, "q_norm", None)
    k_norm = getattr(attn, "k_norm", None)
    table = merged or {}

    def weight(m: Any) -> torch.Tensor:
        w: torch.Tensor = table[id(m)] if is_lora_layer(m) else m.weight
        return w

    def bias(m: Any) -> torch.Tensor | None:
        b: torch.Tensor | None = (m.get_base_layer() if is_lora_layer(m) else m).bias
        return b

    return _LayerWeights(
        input_norm=layer.input_layernorm.weight,
        q_weight=weight(attn.q_proj), q_bias=bias(attn.q_proj),
        k_weight=weight(attn.k_proj), k_bias=bias(attn.k_proj),
        v_weight=weight(attn.v_proj), v_bias=bias(attn.v_proj),
        o_weight=weight(attn.o_proj),
        q_norm=None if q_norm is None else q_norm.weight,
        k_norm=None if k_norm is None else k_norm.weight,
        post_norm=layer.post_attention_layernorm.weight,
        gate_weight=weight(mlp.gate_proj), up_weight=weight(mlp.up_proj), down_weight=weight(mlp.down_proj),
    )


def _rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    # transformers' LlamaRMSNorm/Qwen2RMSNorm op for op (fp32 statistics, cast back before the weight), so the
    # uncompiled fused path is bitwise the modules path.
    dtype = x.dtype
    h = x.to(torch.float32)
    var = h.pow(2).mean(-1, keepdim=True)
    h = h * torch.rsqrt(var + eps)
    return weight * h.to(dtype)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def _fused_decoder_layer(hidden: torch.Tensor, w: _LayerWeights, k_cache: torch.Tensor, v_cache: torch.Tensor,
                         cols: torch.Tensor, mask: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                         eps: float, scaling: float) -> torch.Tensor:
    """One Llama/Qwen2/Qwen3/Mistral decoder layer over `hidden` (batch, q_len, hidden_size).

    Writes this step's rotated K and V into cache columns `cols` (caches are (batch, kv_heads, capacity,
    head_dim), as prefill through the modules leaves them) and attends to the first `mask.shape[-1]` columns
    under the additive `mask` (batch, 1, q_len, >= that many columns). Every size comes from a tensor shape and
    nothing refers to a module or a layer index, so one compiled graph serves all layers.
    """
    residual, mlp_out = _layer_body(hidden, w, k_cache, v_cache, cols, mask, cos, sin, eps, scaling)
    return residual + mlp_out


def _fused_layer_deferred(residual: torch.Tensor, delta: torch.Tensor, w: _LayerWeights, k_cache: torch.Tensor,
                          v_cache: torch.Tensor, cols: torch.Tensor, mask: torch.Tensor, cos: torch.Tensor,
                          sin: torch.Tensor, eps: float, scaling: float) -> tuple[torch.Tensor, torch.Tensor]:
    """`_fused_decoder_layer` over the input `residual + delta`, returning its output unsummed as (residual,
    MLP output): the decode step compiles this one, so each layer's last residual add runs inside the next
    layer's input-norm kernel (or the final norm's) instead of as a kernel of its own. Eagerly the same adds
    in the same order, so the same bits; the first layer gets a zero `delta`."""
    return _layer_body(residual + delta, w, k_cache, v_cache, cols, mask, cos, sin, eps, scaling)


def _fused_layer_deferred_flex(residual: torch.Tensor, delta: torch.Tensor, w: _LayerWeights,
                               k_cache: torch.Tensor, v_cache: torch.Tensor, cols: torch.Tensor, mask: torch.Tensor,
                               cos: torch.Tensor, sin: torch.Tensor, eps: float, scaling: float
                               ) -> tuple[torch.Tensor, torch.Tensor]:
    """`_fused_layer_deferred` with its attention through FlexAttention (`_flex_attention`): the engine's
    `decode_attention="flex"`."""
    return _layer_body(residual + delta, w, k_cache, v_cache, cols, mask, cos, sin, eps, scaling, _flex_attention)


def _flex_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask: torch.Tensor,
                    scaling: float) -> torch.Tensor:
    """`_gqa_attention`'s result through FlexAttention: compiled (the decode step is), inductor emits its
    flex-decoding kernel, which splits the cache columns over thread blocks and reads each K/V head once for all
    the query heads it serves (SDPA's kernels with a mask run one block per row and head group over every
    column). The additive padding mask becomes a score modification."""
    from torch.nn.attention.flex_attention import flex_attention

    bias = mask[:, 0, :, : key.shape[-2]]

    def add_mask(score: torch.Tensor, b: torch.Tensor, h: torch.Tensor, q: torch.Tensor,
                 kv: torch.Tensor) -> torch.Tensor:
        return score + bias[b, q, kv]

    out: Any = flex_attention(query, key, value, score_mod=add_mask, scale=scaling, enable_gqa=True)
    return out.transpose(1, 2).contiguous()


def _layer_body(hidden: torch.Tensor, w: _LayerWeights, k_cache: torch.Tensor, v_cache: torch.Tensor,
                cols: torch.Tensor, mask: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                eps: float, scaling: float, attend: Any = _gqa_attention) -> tuple[torch.Tensor, torch.Tensor]:
    b, q_len, _ = hidden.shape
    head_dim = cos.shape[-1]
    residual = hidden
    x = _rms_norm(hidden, w.input_norm, eps)
    if w.qkv_weight is not None:
        q, k, v = F.linear(x, w.qkv_weight, w.qkv_bias).split(
            [w.q_weight.shape[0], w.k_weight.shape[0], w.v_weight.shape[0]], dim=-1)
    else:
        q = F.linear(x, w.q_weight, w.q_bias)
        k = F.linear(x, w.k_weight, w.k_bias)
        v = F.linear(x, w.v_weight, w.v_bias)
    q = q.reshape(b, q_len, -1, head_dim)
    k = k.reshape(b, q_len, -1, head_dim)
    v = v.reshape(b, q_len, -1, head_dim).transpose(1, 2)
    if w.q_norm is not None:  # Qwen3: RMSNorm over head_dim, before RoPE
        q = _rms_norm(q, w.q_norm, eps)
    if w.k_norm is not None:
        k = _rms_norm(k, w.k_norm, eps)
    q, k = q.transpose(1, 2), k.transpose(1, 2)
    c, s = cos.unsqueeze(1), sin.unsqueeze(1)
    q = (q * c) + (_rotate_half(q) * s)
    k = (k * c) + (_rotate_half(k) * s)
    k_cache.index_copy_(2, cols, k.to(k_cache.dtype))
    v_cache.index_copy_(2, cols, v.to(v_cache.dtype))
    view = mask.shape[-1]
    attn = attend(q, k_cache[:, :, :view], v_cache[:, :, :view], mask, scaling)
    hidden = residual + F.linear(attn.reshape(b, q_len, -1), w.o_weight)
    x = _rms_norm(hidden, w.post_norm, eps)
    if w.gate_up_weight is not None:
        gate, up = F.linear(x, w.gate_up_weight).split([w.gate_weight.shape[0], w.up_weight.shape[0]], dim=-1)
    else:
        gate, up = F.linear(x, w.gate_weight), F.linear(x, w.up_weight)
    return hidden, F.linear(F.silu(gate) * up, w.down_weight)


def _fused_final(residual: torch.Tensor, delta: torch.Tensor, norm_weight: torch.Tensor, head_weight: torch.Tensor,
                 head_bias: torch.Tensor | None, eps: float) -> torch.Tensor:
    """The last layer's output (`residual + delta`, as `_fused_layer_deferred` leaves it) at the last position,
    the final RMSNorm and the LM head -> fp32 logits (batch, vocab)."""
    hidden = residual[:, -1] + delta[:, -1]
    return F.linear(_rms_norm(hidden, norm_weight, eps), head_weight, head_bias).float()


#: The decode step's layer function per `FastGenerateBackend(decode_attention=...)`.
LAYER_FUNCTIONS: dict[str, Any] = {"sdpa": _fused_layer_deferred, "flex": _fused_layer_deferred_flex}


@dataclass(frozen=True)
class _FusedSpec:
    eps: float
    scaling: float


def _norm_eps(norm: Any, size: int) -> float | None:
    """The epsilon of an RMSNorm with Llama semantics over `size` features, or None for anything else."""
    if not isinstance(norm, nn.Module) or not type(norm).__name__.endswith("RMSNorm"):
        return None
    weight = getattr(norm, "weight", None)
    if not isinstance(weight, torch.Tensor) or weight.dim() != 1 or weight.shape[0] != size:
        return None
    if getattr(norm, "bias", None) is not None:
        return None
    # Liger's RMSNorm reads these: offset 1 is Gemma's (1 + weight), casting modes other than "llama" round
    # differently. transformers' own norms have neither attribute.
    if float(getattr(norm, "offset", 0.0) or 0.0) != 0.0 or getattr(norm, "casting_mode", "llama") != "llama":
        return None
    eps = getattr(norm, "variance_epsilon", None)
    if eps is None:
        eps = getattr(norm, "eps", None)
    return float(eps) if isinstance(eps, (int, float)) else None


def _plain_linear(m: Any, in_features: int, out_features: int, bias_ok: bool) -> bool:
    # Exactly nn.Linear: quantized linears (some subclass nn.Linear) and other wrappers compute something else. A
    # PEFT LoRA layer counts by its base layer when its adapters merge into one weight (`adapters`).
    base = mergeable_base(m)
    if base is not None:
        m = base
    return (type(m) is nn.Linear and tuple(m.weight.shape) == (out_features, in_features)
            and m.weight.dtype.is_floating_point and (bias_ok or m.bias is None))


def _layer_constants(layer: Any, where: str, hidden: int, heads: int, kv_heads: int, device: torch.device
                     ) -> tuple[float, int, list[float]] | str:
    """(attention scaling, head_dim, RMSNorm eps values) of one decoder layer if it is exactly the Llama
    structure `_fused_decoder_layer` computes, else why not."""
    if {n for n, _ in layer.named_children()} != {"self_attn", "mlp", "input_layernorm",
                                                  "post_attention_layernorm"}:
        return f"{where} has other submodules than the Llama decoder layer"
    attn, mlp = layer.self_attn, layer.mlp
    if not {n for n, _ in attn.named_children()} <= {"q_proj", "k_proj", "v_proj", "o_proj", "q_norm", "k_norm"}:
        return f"{where}: the attention has other submodules than q/k/v/o_proj and q/k_norm"
    if not {n for n, _ in mlp.named_children()} <= {"gate_proj", "up_proj", "down_proj", "act_fn"}:
        return f"{where}: the MLP has other submodules than gate/up/down_proj"
    head_dim = getattr(attn, "head_dim", None)
    scaling = getattr(attn, "scaling", None)
    if not isinstance(head_dim, int) or not isinstance(scaling, (int, float)):
        return f"{where}: the attention lacks head_dim/scaling"
    if getattr(attn, "sliding_window", None) is not None:
        return f"{where} uses a sliding window"
    if getattr(attn, "is_causal", True) is not True:
        return f"{where} is not causal"
    for name, n_out, bias_ok in (("q_proj", heads * head_dim, True), ("k_proj", kv_heads * head_dim, True),
                                 ("v_proj", kv_heads * head_dim, True)):
        if not _plain_linear(getattr(attn, name, None), hidden, n_out, bias_ok):
            return f"{where}: {name} is not a plain nn.Linear of the expected shape"
    if not _plain_linear(getattr(attn, "o_proj", None), heads * head_dim, hidden, False):
        return f"{where}: o_proj is not a bias-free nn.Linear of the expected shape"
    gate = getattr(mlp, "gate_proj", None)
    inter = getattr(mergeable_base(gate) or gate, "out_features", None)
    if not isinstance(inter, int):
        return f"{where}: the MLP has no gate_proj"
    if not (_plain_linear(mlp.gate_proj, hidden, inter, False)
            and _plain_linear(getattr(mlp, "up_proj", None), hidden, inter, False)
            and _plain_linear(getattr(mlp, "down_proj", None), inter, hidden, False)):
        return f"{where}: the MLP projections are not bias-free nn.Linear of matching shapes"
    act_fn = getattr(mlp, "act_fn", None)
    if act_fn is not None and type(act_fn).__name__ not in ("SiLU", "SiLUActivation"):
        return f"{where}: the MLP activation is {type(act_fn).__name__}, not SiLU"
    norms = [(layer.input_layernorm, hidden), (layer.post_attention_layernorm, hidden)]
    has_q, has_k = hasattr(attn, "q_norm"), hasattr(attn, "k_norm")
    if has_q != has_k:
        return f"{where} has only one of q_norm/k_norm"
    if has_q:
        norms += [(attn.q_norm, head_dim), (attn.k_norm, head_dim)]
    eps_seen: list[float] = []
    for norm, size in norms:
        eps = _norm_eps(norm, size)
        if eps is None:
            return f"{where}: {type(norm).__name__} is not a Llama-style RMSNorm"
        eps_seen.append(eps)
    for prm in layer.parameters():
        if prm.device != device:
            return f"{where} has a parameter on {prm.device} (offloaded?)"
    return float(scaling), head_dim, eps_seen


def _fused_spec(decoder: Any, lm_head: Any, cfg: Any, device: torch.device) -> _FusedSpec | str:
    """The constants `_fused_decoder_layer` needs if it computes exactly what this decoder's layers compute,
    else why not. Structure and model_type are both checked; anything unrecognised keeps the modules path."""
    model_type = getattr(cfg, "model_type", None)
    if model_type not in _FUSED_MODEL_TYPES:
        return f"model_type {model_type!r} is not one of {sorted(_FUSED_MODEL_TYPES)}"
    act = getattr(cfg, "hidden_act", None)
    if act not in ("silu", "swish"):
        return f"hidden_act {act!r} is not SiLU"
    if any(t != "full_attention" for t in (getattr(cfg, "layer_types", None) or [])):
        return "not every layer is full attention"
    if model_type == "mistral" and getattr(cfg, "sliding_window", None) is not None:
        return "Mistral with a sliding window"
    for name in ("embed_tokens", "layers", "norm", "rotary_emb"):
        if not isinstance(getattr(decoder, name, None), nn.Module):
            return f"the decoder has no {name} module"
    if not isinstance(decoder.embed_tokens, nn.Embedding):
        return "embed_tokens is not an nn.Embedding"
    hidden = int(cfg.hidden_size)
    heads = int(cfg.num_attention_heads)
    kv_heads = int(getattr(cfg, "num_key_value_heads", None) or heads)
    layers = list(decoder.layers)
    if len(layers) != int(cfg.num_hidden_layers) or not layers or heads % kv_heads:
        return "unexpected layer or head counts"
    eps_seen: set[float] = set()
    scalings: set[float] = set()
    head_dims: set[int] = set()
    for i, layer in enumerate(layers):
        found = _layer_constants(layer, f"layer {i}", hidden, heads, kv_heads, device)
        if isinstance(found, str):
            return found
        scalings.add(found[0])
        head_dims.add(found[1])
        eps_seen.update(found[2])
    final_eps = _norm_eps(decoder.norm, hidden)
    if final_eps is None:
        return "the final norm is not a Llama-style RMSNorm"
    eps_seen.add(final_eps)
    # One compiled graph for all layers needs the same constants everywhere; mixed values are not worth a guess.
    if len(eps_seen) != 1 or len(scalings) != 1 or len(head_dims) != 1:
        return "RMSNorm eps, attention scaling or head_dim differ between layers"
    if type(lm_head) is not nn.Linear or tuple(lm_head.weight.shape)[1:] != (hidden,):
        return "the LM head is not a plain nn.Linear"
    return _FusedSpec(eps=eps_seen.pop(), scaling=scalings.pop())
