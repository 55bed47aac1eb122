"""Fast plain generation: a preallocated KV cache, CUDA-graph decode steps and on-device sampling.

`model.generate` spends most of its time launching kernels from Python: a 0.5B model decodes at ~26 ms per
step on an H200 while reading its weights takes ~0.2 ms. This backend keeps every decode step on the device:

* one batch for all prompts x generations, left-padded, with a static key/value cache sized once per
  (batch, capacity) shape and reused across calls;
* each decode step (forward, sampling, bookkeeping) is captured once as a CUDA graph per length bucket: the
  attention reads only the first `bucket_end` cache columns, so early steps do not pay for the whole cache;
* sampling (temperature, top-k, top-p, min-p, repetition penalty) runs on the device through the exponential
  race (argmax of p / E with E ~ Exp(1)), which draws exactly from p without a host round trip;
* the host looks at the "every row has ended" flag only every `stop_check_interval` steps, through an event
  recorded that many steps earlier, so the check never drains the GPU's queue.

Two implementations of the decode forward (`decode_path` says which one runs):

* "modules": the model's own decoder modules (`model.get_decoder()`, `model.get_output_embeddings()`) with a
  cache object they write into. Works for any full-attention decoder, but a replayed graph still launches every
  small kernel the modules issue (~55 per layer for a Qwen2: RMSNorm alone is 7-8 elementwise kernels), and at
  ~2.5 us per kernel that, not the weight reads, is what a decode step costs.
* "fused" / "fused+compiled": for decoders of the Llama family (model_type llama, mistral, qwen2, qwen3 whose
  layers have exactly the Llama structure: RMSNorm, q/k/v/o projections with optional q/k/v biases, optional
  Qwen3 q_norm/k_norm, SiLU-gated MLP, full attention) the layer math is re-expressed as one pure function of
  tensors, `_fused_decoder_layer`, which reads the layers' live parameters at call time. Being free of modules
  and Python-int layer indices, one `torch.compile(fullgraph=True, dynamic=False)` graph of it serves every
  layer, and inductor fuses the elementwise work into a handful of kernels per layer. RoPE cos/sin come from the
  model's own `rotary_emb`, so every rope scaling the model supports is honoured. Compiling is the default on
  CUDA only; it happens in the eager warm-up step of each length bucket (one compile per cache shape and bucket),
  never inside graph capture, with inductor's own CUDA graphs off (the whole step is captured here). Any compile
  error logs one warning and decoding continues with the uncompiled fused function. The q/k/v and gate/up
  weights are not concatenated: it would save three GEMM launches per layer but hold a second copy of most of
  the weights for the whole run (and need a re-copy after every optimizer step). Prefill stays on the modules
  path (it runs once per call); it writes the same cache layout the fused decode reads. Other models, or
  `decode_impl="modules"`, use the modules path.

  Measured on an H200 (benchmarks/decode_gpu_check.py; random-init bf16, 64 x 32-token prompts, 256 new
  tokens), ms per decode step: Qwen2.5-0.5B shape 3.17 (modules), 3.19 (fused), 1.75 (fused+compiled, 9.5x the
  weights-read floor); 1.5B shape 4.49, 4.49, 2.72 (4.2x). Uncompiled, the fused layer issues the modules' ops in
  their order (bitwise the same on CPU) and is no faster: the gain is inductor's fusion. Compiled kernels keep
  fp32 between fused elementwise ops where eager rounds each one to bf16, so bf16 greedy tokens drift from the
  modules path after some tokens (~15-25 on a random-init model, whose logits are nearly flat), and the sampled
  log-probs sit slightly further from the trainer's recomputation (mean |diff| 0.009 vs 0.008 at 0.5B, 0.022 vs
  0.016 at 1.5B).

Either way the weights are the trainer's live parameters: `sync_weights` has nothing to copy, and an optimizer
that updates parameters in place is seen by the captured graphs (graphs are dropped if a parameter's storage
moves). On CPU the same step runs eagerly (no graphs). `keep_cache=False` releases the cache, the state and the
captured graphs at the end of every call, so the training phase does not hold them.

The per-token log-probs it returns are those of the sampled token under `log_softmax(logits * (1/T))` over the
whole vocabulary (before top-k/top-p/min-p filtering), which is what the trainer recomputes.
"""

from __future__ import annotations

import contextlib
import logging
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from .protocol import GenerationOutput, SamplingParams

if TYPE_CHECKING:
    from ..config import TrainerConfig

log = logging.getLogger(__name__)

#: Name under which `_gqa_sdpa` is registered with transformers' AttentionInterface; while generating, the model's
#: attention implementation is switched to it (the weights are the same, only the kernel differs).
_ATTN_NAME = "launchgen_fast_gqa"

#: model_type values whose decoder layers `_fused_decoder_layer` reproduces (after the structural checks in
#: `_fused_spec`); anything else keeps the modules path.
_FUSED_MODEL_TYPES = frozenset({"llama", "mistral", "qwen2", "qwen3"})

#: Compiled variants allowed per compiled function: one per (batch, cache capacity, length bucket) seen, which a
#: training run with varying prompt lengths can push past dynamo's default of 8.
_RECOMPILE_LIMIT = 64

DecodeImpl = Literal["auto", "fused", "modules"]


def _gqa_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask: torch.Tensor | None,
                   scaling: float | None) -> torch.Tensor:
    """SDPA over grouped-query attention without materialising repeated K/V; returns (batch, q_len, heads, dim).

    transformers' sdpa path repeats K/V to all query heads whenever a mask is given, which copies the whole
    cache num_heads/num_kv_heads times per layer per decode step (~1.6 GB per step for a 0.5B Qwen2 at 64 x 288
    tokens). Folding the query heads of one K/V head into the query-length axis lets one SDPA call read each
    K/V head once; the mask is repeated along that axis instead (it is tiny for decode, q_len = 1).
    """
    b, h, q, d = query.shape
    hkv = key.shape[1]
    rep = h // hkv
    qg = query.reshape(b, hkv, rep * q, d)  # head j*rep+r -> group j, row r*q+i (HF's repeat_kv order)
    if mask is not None:
        mask = mask[:, :, :, : key.shape[-2]]
        if rep > 1 and q > 1:
            mask = mask[:, :, None].expand(b, 1, rep, q, mask.shape[-1]).reshape(b, 1, rep * q, mask.shape[-1])
    out = F.scaled_dot_product_attention(qg, key, value, attn_mask=mask, scale=scaling)
    return out.reshape(b, h, q, d).transpose(1, 2).contiguous()


def _gqa_sdpa(module: nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
              attention_mask: torch.Tensor | None, dropout: float = 0.0, scaling: float | None = None,
              **kwargs: Any) -> tuple[torch.Tensor, None]:
    """`_gqa_attention` behind transformers' AttentionInterface signature (the modules path)."""
    return _gqa_attention(query, key, value, attention_mask, scaling), None


# ------------------------------------------------------------------------------------------ fused decode


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


def _layer_weights(layer: Any) -> _LayerWeights:
    """Read a layer's parameters now (not cached: the trainer may replace or move them between calls)."""
    attn, mlp = layer.self_attn, layer.mlp
    q_norm = getattr(attn, "q_norm", None)
    k_norm = getattr(attn, "k_norm", None)
    return _LayerWeights(
        input_norm=layer.input_layernorm.weight,
        q_weight=attn.q_proj.weight, q_bias=attn.q_proj.bias,
        k_weight=attn.k_proj.weight, k_bias=attn.k_proj.bias,
        v_weight=attn.v_proj.weight, v_bias=attn.v_proj.bias,
        o_weight=attn.o_proj.weight,
        q_norm=None if q_norm is None else q_norm.weight,
        k_norm=None if k_norm is None else k_norm.weight,
        post_norm=layer.post_attention_layernorm.weight,
        gate_weight=mlp.gate_proj.weight, up_weight=mlp.up_proj.weight, down_weight=mlp.down_proj.weight,
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
    b, q_len, _ = hidden.shape
    head_dim = cos.shape[-1]
    residual = hidden
    x = _rms_norm(hidden, w.input_norm, eps)
    q = F.linear(x, w.q_weight, w.q_bias).view(b, q_len, -1, head_dim)
    k = F.linear(x, w.k_weight, w.k_bias).view(b, q_len, -1, head_dim)
    v = F.linear(x, w.v_weight, w.v_bias).view(b, q_len, -1, head_dim).transpose(1, 2)
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
    attn = _gqa_attention(q, k_cache[:, :, :view], v_cache[:, :, :view], mask, scaling)
    hidden = residual + F.linear(attn.reshape(b, q_len, -1), w.o_weight)
    residual = hidden
    x = _rms_norm(hidden, w.post_norm, eps)
    x = F.linear(F.silu(F.linear(x, w.gate_weight)) * F.linear(x, w.up_weight), w.down_weight)
    return residual + x


def _fused_final(hidden: torch.Tensor, norm_weight: torch.Tensor, head_weight: torch.Tensor,
                 head_bias: torch.Tensor | None, eps: float) -> torch.Tensor:
    """Final RMSNorm and LM head over the last position's hidden state (batch, hidden_size) -> fp32 logits."""
    return F.linear(_rms_norm(hidden, norm_weight, eps), head_weight, head_bias).float()


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
    # Exactly nn.Linear: LoRA wrappers and quantized linears (some subclass nn.Linear) compute something else.
    return (type(m) is nn.Linear and tuple(m.weight.shape) == (out_features, in_features)
            and m.weight.dtype.is_floating_point and (bias_ok or m.bias is None))


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
        where = f"layer {i}"
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
        inter = getattr(getattr(mlp, "gate_proj", None), "out_features", None)
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
        for norm, size in norms:
            eps = _norm_eps(norm, size)
            if eps is None:
                return f"{where}: {type(norm).__name__} is not a Llama-style RMSNorm"
            eps_seen.add(eps)
        scalings.add(float(scaling))
        head_dims.add(head_dim)
        for prm in layer.parameters():
            if prm.device != device:
                return f"{where} has a parameter on {prm.device} (offloaded?)"
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


def _recompile_limit_patch() -> contextlib.AbstractContextManager[Any]:
    """Raise dynamo's recompile limit for the duration of a call (torch without torch.compile(recompile_limit=))."""
    from launchgen.trainers.dynamo_config import recompile_limit_name

    name = recompile_limit_name()
    if name is None:
        return contextlib.nullcontext()
    import torch._dynamo.config as dynamo_config

    return dynamo_config.patch({name: max(int(getattr(dynamo_config, name)), _RECOMPILE_LIMIT)})


def _no_recompile() -> contextlib.AbstractContextManager[Any]:
    """Make a would-be compile during graph capture raise (caught, falls back) instead of compiling there."""
    set_stance = getattr(torch.compiler, "set_stance", None)
    if set_stance is None:
        return contextlib.nullcontext()
    try:
        ctx: contextlib.AbstractContextManager[Any] = set_stance("fail_on_recompile")
    except Exception:
        return contextlib.nullcontext()
    return ctx


def _register_attention() -> None:
    from transformers import AttentionInterface

    AttentionInterface.register(_ATTN_NAME, _gqa_sdpa)


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


class FastGenerateBackend:
    """GenerationBackend over the trainer's own HF model; see the module docstring for how it is fast.

    Args:
        model: a transformers causal LM (possibly wrapped by accelerate/DDP, or Liger-patched).
        tokenizer: supplies the pad and EOS ids when the model's generation config lacks them.
        accelerator: used only to unwrap the model.
        use_cuda_graphs: default True on CUDA, always False elsewhere.
        length_bucket: cache columns per captured decode graph; smaller buckets read less of the cache early
            on at the cost of more captures.
        stop_check_interval: decode steps between looks at the all-ended flag.
        decode_impl: "auto" takes the fused decode where `_fused_spec` recognises the model (Llama family) and
            the modules path elsewhere; "fused" insists (ValueError for other models); "modules" never fuses.
        compile: torch.compile the fused layer and LM-head functions; None = on CUDA only.
        keep_cache: False releases the KV cache, the decode state and the captured graphs after every call (they
            are rebuilt and recaptured on the next one), so the training phase does not hold that memory; the
            recapture cost 0.22 ms per decode step over a 256-token call at the 0.5B shape on an H200.
        compile_backend: torch.compile backend (inductor; tests use aot_eager, which needs no C++ compiler).
    """

    def __init__(
        self,
        model: nn.Module,
        tokenizer: Any,
        accelerator: Any = None,
        *,
        use_cuda_graphs: bool | None = None,
        length_bucket: int = 256,
        stop_check_interval: int = 16,
        capacity_multiple: int = 64,
        decode_impl: DecodeImpl = "auto",
        compile: bool | None = None,
        keep_cache: bool = True,
        compile_backend: str | Callable[..., Any] = "inductor",
    ) -> None:
        if decode_impl not in ("auto", "fused", "modules"):
            raise ValueError(f"decode_impl must be 'auto', 'fused' or 'modules', got {decode_impl!r}")
        if accelerator is not None and hasattr(accelerator, "unwrap_model"):
            model = accelerator.unwrap_model(model)
        elif hasattr(model, "module") and isinstance(model.module, nn.Module):
            model = model.module  # DDP without an accelerator
        # Any: transformers models expose config/generation_config/get_decoder dynamically.
        self.model: Any = model
        self.tokenizer = tokenizer
        m: Any = model
        decoder = m.get_decoder() if hasattr(m, "get_decoder") else None
        head = m.get_output_embeddings() if hasattr(m, "get_output_embeddings") else None
        if decoder is None or head is None:
            raise TypeError(
                f"FastGenerateBackend needs a causal LM with get_decoder() and get_output_embeddings(); "
                f"got {type(model).__name__}. Use generation.backend: hf for other models."
            )
        self.decoder: nn.Module = decoder
        self.lm_head: nn.Module = head
        cfg: Any = m.config.get_text_config() if hasattr(m.config, "get_text_config") else m.config
        self.text_config: Any = cfg
        layer_types = getattr(cfg, "layer_types", None) or []
        if any(t != "full_attention" for t in layer_types):
            raise ValueError(
                f"FastGenerateBackend supports full-attention decoders only; this model has layer types "
                f"{sorted(set(layer_types))}. Use generation.backend: hf for it."
            )
        self.num_layers = int(cfg.num_hidden_layers)
        self.kv_heads = int(getattr(cfg, "num_key_value_heads", None) or cfg.num_attention_heads)
        self.head_dim = int(getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads)
        self.vocab = int(cfg.vocab_size)

        gen_cfg = getattr(m, "generation_config", None)
        pad = getattr(gen_cfg, "pad_token_id", None)
        if pad is None:
            pad = getattr(tokenizer, "pad_token_id", None)
        if pad is None:
            pad = getattr(tokenizer, "eos_token_id", None)
        if pad is None:
            raise ValueError("FastGenerateBackend needs a pad or EOS token id: set tokenizer.pad_token")
        self.pad_id = int(pad[0] if isinstance(pad, list) else pad)
        eos: set[int] = set()
        for src in (getattr(gen_cfg, "eos_token_id", None), getattr(tokenizer, "eos_token_id", None)):
            if isinstance(src, int):
                eos.add(src)
            elif isinstance(src, (list, tuple)):
                eos.update(int(x) for x in src)
        self.eos_ids = sorted(eos)

        for name, prm in model.named_parameters():
            # ZeRO-3 leaves empty placeholders (ds_numel), FSDP shards (DTensor / flat views): the decode step reads
            # the module's weights directly and needs every one of them whole on this device.
            if prm.numel() == 0 or hasattr(prm, "ds_numel") or type(prm).__name__ == "DTensor":
                raise ValueError(
                    f"FastGenerateBackend needs unsharded weights; parameter {name} is sharded (FSDP / DeepSpeed "
                    "ZeRO-3). Use generation.backend: hf (it gathers them) or a vLLM backend with sharded training."
                )
        device = next(model.parameters()).device
        self.device = device
        # fp32 master weights trained under autocast (model.dtype: auto): generate under the same autocast, or
        # decoding would run in fp32. The cast cache stays off: cached casts would be stale after an optimizer
        # step and cannot live inside a captured graph.
        self.amp_dtype: torch.dtype | None = None
        mp = str(getattr(accelerator, "mixed_precision", "no") or "no")
        if next(self.decoder.parameters()).dtype == torch.float32 and mp in ("bf16", "fp16"):
            self.amp_dtype = torch.bfloat16 if mp == "bf16" else torch.float16
        self.use_cuda_graphs = (device.type == "cuda") if use_cuda_graphs is None else (
            use_cuda_graphs and device.type == "cuda")
        if length_bucket < 1 or stop_check_interval < 1 or capacity_multiple < 1:
            raise ValueError("length_bucket, stop_check_interval and capacity_multiple must be >= 1")
        self.length_bucket = length_bucket
        self.stop_check_interval = stop_check_interval
        self.capacity_multiple = capacity_multiple
        self.keep_cache = keep_cache

        # Which decode forward runs (see the module docstring); the reason is kept for logs and tests.
        self._spec: _FusedSpec | None = None
        self.fused_unsupported_reason: str | None = None
        if decode_impl == "modules":
            self.fused_unsupported_reason = "decode_impl='modules'"
        else:
            try:
                found: _FusedSpec | str = _fused_spec(self.decoder, self.lm_head, cfg, device)
            except Exception as exc:  # an unexpected module layout is a reason to stay on the modules, not to fail
                found = f"structure check failed ({type(exc).__name__}: {exc})"
            if isinstance(found, str):
                if decode_impl == "fused":
                    raise ValueError(f"decode_impl='fused' cannot run this model: {found}")
                self.fused_unsupported_reason = found
                log.info("FastGenerateBackend: modules decode path (%s)", found)
            else:
                self._spec = found
        # The compiled wrappers once `_compile` succeeds; `_compiled` says whether they are (still) in use.
        self._compiled_layer_fn: Callable[..., torch.Tensor] = _fused_decoder_layer
        self._compiled_final_fn: Callable[..., torch.Tensor] = _fused_final
        self._compiled = False
        self._patch_recompile_limit = False
        want_compile = (device.type == "cuda") if compile is None else bool(compile)
        if self._spec is not None and want_compile:
            self._compile(compile_backend)
        self.decode_path: str = ("modules" if self._spec is None
                                 else "fused+compiled" if self._compiled else "fused")
        # Live parameters of the fused path, re-read at the start of every call.
        self._weights: list[_LayerWeights] = []

        self.cache = _StaticKV(self.num_layers)
        self.state: _State | None = None
        self._pool: Any = None
        self._side_stream: torch.cuda.Stream | None = None
        # Decode steps the last call ran (prefill excluded); lets tests and benchmarks see the early stop.
        self.last_num_steps = 0
        self.graph_captures = 0

    @classmethod
    def from_config(cls, cfg: TrainerConfig, accelerator: Any, model: nn.Module, tokenizer: Any
                    ) -> FastGenerateBackend:
        """The loop's factory signature. Of the trainer config only `generation.keep_kv_cache` tunes this backend;
        its other knobs (graphs, bucket size, stop-check interval, decode path, compile) keep their defaults, which
        suit every size measured in benchmarks/RESULTS.md."""
        return cls(model, tokenizer, accelerator, keep_cache=cfg.generation.keep_kv_cache)

    # ----------------------------------------------------------------------------------------------- API

    def sync_weights(self, named_params: Iterator[tuple[str, torch.Tensor]]) -> None:
        """Nothing to copy: generation runs the trainer's own parameters, which optimizers update in place."""
        for _ in named_params:  # collective callers walk the iterator on every rank; keep that contract
            pass

    def close(self) -> None:
        self._release()

    def _release(self) -> None:
        """Drop the cache, the state and with it every captured graph; their private memory pool goes with the
        last graph, and empty_cache hands the blocks back to the device."""
        self.state = None
        self.cache.free()
        self._pool = None
        self._weights = []
        if self.device.type == "cuda":
            torch.cuda.synchronize()  # the freed blocks may still be in use by queued work on other streams
            torch.cuda.empty_cache()

    def generate(self, prompt_ids: list[list[int]], params: SamplingParams) -> GenerationOutput:
        if not prompt_ids:
            return GenerationOutput(prompt_ids=[], completion_ids=[], logprobs=[], finished=[])
        if any(len(p) == 0 for p in prompt_ids):
            raise ValueError("FastGenerateBackend.generate: every prompt needs at least one token")
        if params.max_tokens < 1:
            raise ValueError(f"SamplingParams.max_tokens must be >= 1, got {params.max_tokens}")
        key = self._sampler_key(params)
        stop = set(self.eos_ids)
        extra_stop = params.extra.get("stop_token_ids")
        if extra_stop:
            stop.update(int(t) for t in extra_stop)  # type: ignore[attr-defined]
        seed = params.extra.get("seed")
        # A per-request seed (vLLM's meaning) must not reseed the trainer's own random stream: fork it.
        rng: contextlib.AbstractContextManager[Any] = contextlib.nullcontext()
        if seed is not None:
            rng = torch.random.fork_rng(devices=[self.device] if self.device.type == "cuda" else [])

        was_training = self.model.training
        self.model.eval()  # dropout off, and gradient checkpointing would otherwise drop the cache
        try:
            amp = (torch.autocast(self.device.type, dtype=self.amp_dtype, cache_enabled=False)
                   if self.amp_dtype is not None else contextlib.nullcontext())
            limit = (_recompile_limit_patch() if self._compiled and self._patch_recompile_limit
                     else contextlib.nullcontext())
            with rng, torch.inference_mode(), self._maskable_attention(), amp, limit:
                if seed is not None:
                    torch.manual_seed(int(seed))  # type: ignore[call-overload]
                tokens, logprobs, n_steps = self._run(prompt_ids, params.max_tokens, key, sorted(stop))
        finally:
            self.model.train(was_training)
            if not self.keep_cache:
                self._release()
        self.last_num_steps = n_steps

        completions: list[list[int]] = []
        lps: list[list[float | None]] = []
        finished: list[bool] = []
        for row_t, row_l in zip(tokens, logprobs, strict=True):
            end = len(row_t)
            ended = False
            for i, t in enumerate(row_t):
                if t in stop:
                    end, ended = i + 1, True
                    break
            completions.append(row_t[:end])
            lps.append(list(row_l[:end]))
            finished.append(ended)
        return GenerationOutput(
            prompt_ids=[list(p) for p in prompt_ids],
            completion_ids=completions,
            logprobs=lps if params.logprobs else None,
            finished=finished,
        )

    # ------------------------------------------------------------------------------------------ internals

    @staticmethod
    def _sampler_key(p: SamplingParams) -> _SamplerKey:
        greedy = p.temperature <= 0.0 or p.top_k == 1 or bool(p.extra.get("greedy", False))
        return _SamplerKey(
            greedy=greedy,
            temperature=1.0 if p.temperature <= 0.0 else float(p.temperature),
            top_k=int(p.top_k),
            top_p=float(p.top_p),
            min_p=float(p.min_p),
            repetition_penalty=float(p.repetition_penalty),
        )

    @contextlib.contextmanager
    def _maskable_attention(self) -> Iterator[None]:
        """Route attention through `_gqa_sdpa` (it takes the 4-D additive mask this backend builds)."""
        _register_attention()
        cfgs: list[Any] = list({id(c): c for c in (self.model.config, self.text_config)}.values())
        saved: list[tuple[Any, Any]] = [(c, getattr(c, "_attn_implementation_internal", None)) for c in cfgs]
        try:
            for c, _ in saved:
                c._attn_implementation_internal = _ATTN_NAME
            yield
        finally:
            for c, impl in saved:
                c._attn_implementation_internal = impl

    def _compile(self, backend: str | Callable[..., Any]) -> None:
        """Wrap the fused functions in torch.compile (lazy: dynamo traces on the first call, which is the eager
        warm-up step before any capture). Whole-graph and static-shape: a graph break or a dynamic size would
        put Python or a host sync between kernels that the CUDA graph captures."""
        kw: dict[str, Any] = {"fullgraph": True, "dynamic": False, "backend": backend}
        if backend == "inductor":
            # This backend captures the whole decode step itself; inductor's own graphs would nest inside it.
            kw["options"] = {"triton.cudagraphs": False}
        from launchgen.trainers.dynamo_config import recompile_limit_name

        recompile_limit_name()  # un-hide the limit dynamo reads on every compile
        compile_fn: Any = torch.compile  # Any: the typing overloads lag behind the recompile_limit argument
        try:
            try:
                layer_fn = compile_fn(_fused_decoder_layer, recompile_limit=_RECOMPILE_LIMIT, **kw)
                final_fn = compile_fn(_fused_final, recompile_limit=_RECOMPILE_LIMIT, **kw)
            except TypeError:  # torch before torch.compile(recompile_limit=): raise the global limit per call
                layer_fn = compile_fn(_fused_decoder_layer, **kw)
                final_fn = compile_fn(_fused_final, **kw)
                self._patch_recompile_limit = True
        except Exception as exc:
            log.warning("torch.compile is unavailable (%s: %s); decoding with the uncompiled fused path",
                        type(exc).__name__, exc)
            return
        self._compiled_layer_fn = layer_fn
        self._compiled_final_fn = final_fn
        self._compiled = True

    def _call_fused(self, compiled: Callable[..., torch.Tensor], eager: Callable[..., torch.Tensor],
                    *args: Any) -> torch.Tensor:
        if self._compiled:
            try:
                return compiled(*args)
            except Exception as exc:
                # Dynamo/inductor errors surface at the first call of each shape (compiling is lazy). The fused
                # function only overwrites its own cache columns, so running it again eagerly is safe.
                self._compiled = False
                self.decode_path = "fused"
                log.warning("torch.compile of the fused decode failed (%s: %s); decoding with the uncompiled "
                            "fused path from now on", type(exc).__name__, exc)
        return eager(*args)

    def _weights_key(self) -> tuple[int, ...]:
        return tuple(p.data_ptr() for p in self.model.parameters())

    def _ensure_state(self, batch: int, capacity: int, max_new: int, need_seen: bool) -> _State:
        st = self.state
        dtype = self.amp_dtype or next(self.decoder.parameters()).dtype
        if (st is not None and st.batch == batch and st.capacity == capacity and st.max_new == max_new
                and (st.seen is not None or not need_seen) and st.mask.dtype == dtype):
            return st
        self.state = None
        self.cache.free()
        if self.device.type == "cuda":
            torch.cuda.empty_cache()
        self.cache.allocate(batch, self.kv_heads, self.head_dim, capacity, dtype, self.device)
        st = _State(batch, capacity, max_new, self.vocab, dtype, self.device, need_seen)
        self.state = st
        if self.use_cuda_graphs:
            self._pool = torch.cuda.graph_pool_handle()
        return st

    def _logits(self, input_ids: torch.Tensor, mask: torch.Tensor, position_ids: torch.Tensor) -> torch.Tensor:
        out = self.decoder(
            input_ids=input_ids,
            attention_mask=mask,
            position_ids=position_ids,
            past_key_values=self.cache,
            use_cache=True,
        )
        hidden = out[0] if isinstance(out, tuple) else out.last_hidden_state
        return self.lm_head(hidden[:, -1, :]).float()

    def _fused_logits(self, input_ids: torch.Tensor, mask: torch.Tensor, position_ids: torch.Tensor
                      ) -> torch.Tensor:
        """The decode forward through `_fused_decoder_layer`; same inputs and cache effects as `_logits`."""
        spec = self._spec
        cols = self.cache.write_cols
        if spec is None or cols is None:
            raise RuntimeError("_fused_logits needs a fused spec and the write columns")
        dec: Any = self.decoder
        hidden = dec.embed_tokens(input_ids)
        # The model's own rotary module: every rope type it supports (scaling, attention factor) comes for free.
        cos, sin = dec.rotary_emb(hidden, position_ids)
        for w, k, v in zip(self._weights, self.cache.keys, self.cache.values, strict=True):
            hidden = self._call_fused(self._compiled_layer_fn, _fused_decoder_layer,
                                      hidden, w, k, v, cols, mask, cos, sin, spec.eps, spec.scaling)
        head: Any = self.lm_head
        return self._call_fused(self._compiled_final_fn, _fused_final,
                                hidden[:, -1], dec.norm.weight, head.weight, head.bias, spec.eps)

    def _sample(self, logits: torch.Tensor, key: _SamplerKey, st: _State) -> tuple[torch.Tensor, torch.Tensor]:
        """Pick one token per row and its log-prob under log_softmax(logits * (1/T)); all on the device."""
        # Multiply by 1/T (not divide by T): the trainer's recomputation does this, so the values match bitwise.
        scaled = logits * (1.0 / key.temperature)
        logp = torch.log_softmax(scaled, dim=-1)
        work = scaled
        filtered = False
        if key.repetition_penalty != 1.0 and st.seen is not None:
            # HF's penalty acts on raw logits (every token id seen so far, prompt padding included); scaling both
            # branches by 1/T commutes with it.
            pen = torch.where(work < 0, work * key.repetition_penalty, work / key.repetition_penalty)
            work = torch.where(st.seen, pen, work)
            filtered = True
        if key.greedy:
            tok = torch.argmax(work, dim=-1)
            return tok, logp.gather(1, tok[:, None]).squeeze(1)
        if 0 < key.top_k < self.vocab:
            kth = torch.topk(work, key.top_k, dim=-1).values[:, -1:]
            work = work.masked_fill(work < kth, -math.inf)
            filtered = True
        if key.top_p < 1.0:
            srt, idx = torch.sort(work, dim=-1, descending=True)
            cum = torch.softmax(srt, dim=-1).cumsum(-1)
            drop_sorted = (cum - torch.softmax(srt, dim=-1)) > key.top_p  # keeps the token that crosses p
            drop = torch.zeros_like(drop_sorted).scatter(1, idx, drop_sorted)
            work = work.masked_fill(drop, -math.inf)
            filtered = True
        if key.min_p > 0.0:
            probs = torch.softmax(work, dim=-1)
            thresh = probs.amax(dim=-1, keepdim=True) * key.min_p
            work = work.masked_fill(probs < thresh, -math.inf)
            filtered = True
        probs = torch.softmax(work, dim=-1) if filtered else logp.exp()
        # Exponential race: argmax p_i / E_i with E_i ~ Exp(1) is an exact draw from p (no host sync, graphable).
        race = torch.empty_like(probs).exponential_().clamp_min_(1e-20)
        tok = torch.argmax(probs / race, dim=-1)
        return tok, logp.gather(1, tok[:, None]).squeeze(1)

    def _decode_step(self, key: _SamplerKey, st: _State) -> None:
        """Feed `st.cur` at column `st.col`, sample the next token, record it, advance. Graph-capturable."""
        st.mask.index_fill_(3, st.col, 0.0)
        self.cache.write_cols = st.col
        forward = self._fused_logits if self._spec is not None else self._logits
        logits = forward(st.cur[:, None], st.mask[:, :, :, : self.cache.view_len], st.pos[:, None])
        tok, lp = self._sample(logits, key, st)
        self._record(tok, lp, st.col - st.prompt_len + 1, st)
        st.col.add_(1)
        st.pos.add_(1)

    def _record(self, tok: torch.Tensor, lp: torch.Tensor, out_col: torch.Tensor, st: _State) -> None:
        tok = torch.where(st.done, torch.full_like(tok, self.pad_id), tok)
        lp = torch.where(st.done, torch.zeros_like(lp), lp)
        st.tokens.index_copy_(1, out_col, tok[:, None])
        st.logprobs.index_copy_(1, out_col, lp[:, None])
        if st.seen is not None:
            st.seen.scatter_(1, tok[:, None], True)
        st.done.logical_or_((tok[:, None] == st.stop_ids[None, :]).any(dim=1))
        st.cur.copy_(tok)

    def _run(self, prompt_ids: list[list[int]], max_new: int, key: _SamplerKey, stop: list[int]
             ) -> tuple[list[list[int]], list[list[float]], int]:
        batch = len(prompt_ids)
        plen = max(len(p) for p in prompt_ids)
        # Round the capacity up so small changes in prompt length reuse the cache and the captured graphs.
        need = plen + max_new - 1
        capacity = -(-need // self.capacity_multiple) * self.capacity_multiple
        st = self._ensure_state(batch, capacity, max_new, key.repetition_penalty != 1.0)
        dev = self.device
        if self._spec is not None:
            dec: Any = self.decoder
            self._weights = [_layer_weights(layer) for layer in dec.layers]
        if self.use_cuda_graphs:
            weights_key = self._weights_key()
            if weights_key != st.weights_key:
                st.graphs.clear()
                st.weights_key = weights_key

        ids = torch.full((batch, plen), self.pad_id, dtype=torch.long)
        valid = torch.zeros(batch, plen, dtype=torch.bool)
        for i, p in enumerate(prompt_ids):
            ids[i, plen - len(p):] = torch.tensor(p, dtype=torch.long)
            valid[i, plen - len(p):] = True
        ids, valid = ids.to(dev, non_blocking=True), valid.to(dev, non_blocking=True)

        # Reset the per-call state in place (graphs hold these addresses).
        st.done.zero_()
        st.tokens.fill_(self.pad_id)
        st.logprobs.zero_()
        stop_t = torch.tensor(stop or [-1], dtype=torch.long)
        if st.stop_ids.numel() != stop_t.numel():
            st.stop_ids = torch.empty_like(stop_t, device=dev)
            st.graphs.clear()  # they read the old buffer's address
        st.stop_ids.copy_(stop_t)
        if st.seen is not None:
            st.seen.zero_()
            st.seen.scatter_(1, ids, True)
        neg = torch.finfo(st.mask.dtype).min
        st.mask.fill_(neg)
        st.mask[:, 0, 0, :plen].masked_fill_(valid, 0.0)
        # Same positions as HF generate: count real tokens; padding gets a harmless 1.
        positions = (valid.long().cumsum(-1) - 1).masked_fill(~valid, 1)

        # Prefill (eager): causal within the prompt, padding keys hidden.
        causal = torch.ones(plen, plen, dtype=torch.bool, device=dev).tril()
        allowed = causal[None, None] & valid[:, None, None, :]
        pmask = torch.zeros(batch, 1, plen, plen, dtype=st.mask.dtype, device=dev).masked_fill(~allowed, neg)
        self.cache.write_cols = torch.arange(plen, device=dev)
        self.cache.view_len = plen
        logits = self._logits(ids, pmask, positions)
        tok, lp = self._sample(logits, key, st)
        st.prompt_len.fill_(plen)
        self._record(tok, lp, torch.zeros(1, dtype=torch.long, device=dev), st)
        st.col.fill_(plen)
        st.pos.copy_(positions[:, -1] + 1)
        del logits, tok, lp, pmask, allowed

        n_steps = 0
        total = max_new - 1
        pending: list[tuple[Any, torch.Tensor]] = []
        while n_steps < total:
            col = plen + n_steps
            if self.use_cuda_graphs or self._compiled:
                # Fixed shapes per bucket: what a captured graph replays, and what keeps a compiled function from
                # recompiling at every step.
                bucket_end = min(capacity, (col // self.length_bucket + 1) * self.length_bucket)
            else:  # eager steps have no fixed shapes to keep: attend to exactly the written columns
                bucket_end = col + 1
            self.cache.view_len = bucket_end
            if self.use_cuda_graphs:
                self._replay_or_capture(key, st, bucket_end)
            else:
                self._decode_step(key, st)
            n_steps += 1
            if n_steps % self.stop_check_interval == 0 and n_steps < total and self._all_done(st, pending):
                break
        tokens = st.tokens[:, : n_steps + 1].cpu().tolist()
        logprobs = st.logprobs[:, : n_steps + 1].cpu().tolist()
        return tokens, logprobs, n_steps

    def _all_done(self, st: _State, pending: list[tuple[Any, torch.Tensor]]) -> bool:
        if self.device.type != "cuda":
            return bool(st.done.all())
        # Enqueue a copy of the flag now; read the one enqueued an interval ago, which the GPU has (almost
        # always) passed already, so the host waits for old work at most and never drains the queue.
        flag = torch.empty(1, dtype=torch.bool, pin_memory=True)
        flag.copy_(st.done.all().reshape(1), non_blocking=True)
        ev = torch.cuda.Event()
        ev.record()
        pending.append((ev, flag))
        if len(pending) < 2:
            return False
        old_ev, old_flag = pending.pop(0)
        old_ev.synchronize()
        return bool(old_flag.item())

    def _replay_or_capture(self, key: _SamplerKey, st: _State, bucket_end: int) -> None:
        gkey = (key, bucket_end)
        graph = st.graphs.get(gkey)
        if graph is not None:
            graph.replay()
            return
        # First step of this bucket: run it eagerly on a side stream (it is a real step and also the warm-up
        # cuBLAS and the allocator need before capture), then capture the same step for later replays.
        if self._side_stream is None:
            self._side_stream = torch.cuda.Stream()
        s = self._side_stream
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            self._decode_step(key, st)
        torch.cuda.current_stream().wait_stream(s)
        graph = torch.cuda.CUDAGraph()
        # The eager step above compiled whatever this bucket needs; a compile inside capture would sync with the
        # host and void the capture, so make any would-be recompile raise (the fused call then runs uncompiled).
        no_recompile = _no_recompile() if self._compiled else contextlib.nullcontext()
        try:
            with no_recompile, torch.cuda.graph(graph, pool=self._pool):
                self._decode_step(key, st)
        except Exception as exc:  # a model whose forward syncs with the host cannot be captured
            log.warning("CUDA graph capture failed (%s); decoding eagerly from now on", exc)
            self.use_cuda_graphs = False
            torch.cuda.synchronize()
            return
        # Capture recorded but did not run the step, and the eager step above already advanced the state.
        st.graphs[gkey] = graph
        self.graph_captures += 1
