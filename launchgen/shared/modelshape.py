"""The numbers of a decoder-only transformer the estimate needs (config.json's names), and what follows from them
alone: parameter counts (all, the experts', a token's active share), KV cache bytes per token per GPU.

Standard library only, like `launchgen.shared.estimate`, which takes a `ModelShape` as its model input.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any


@dataclass(frozen=True)
class ModelShape:
    """The numbers of a decoder-only transformer the estimate needs (config.json's names)."""

    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    intermediate_size: int
    vocab_size: int
    head_dim: int | None = None
    tie_word_embeddings: bool = False
    qkv_bias: bool = False
    max_position_embeddings: int | None = None
    num_experts: int = 0
    moe_intermediate_size: int | None = None
    #: routed experts each token goes through (config.json `num_experts_per_tok`): what a token computes with
    experts_per_token: int | None = None
    #: Qwen3's RMSNorm on each head's q and k (two head_dim weights a layer)
    qk_norm: bool = False
    source: str = ""

    KEYS = ("hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "intermediate_size",
            "vocab_size", "head_dim", "tie_word_embeddings", "max_position_embeddings")

    @classmethod
    def from_config(cls, data: Mapping[str, Any], source: str = "") -> ModelShape | None:
        """From config.json's dict (or its `text_config`); None when a needed key is missing."""
        text = data.get("text_config")
        d: Mapping[str, Any] = text if isinstance(text, dict) else data

        def num(key: str) -> int | None:
            v = d.get(key)
            return v if isinstance(v, int) and not isinstance(v, bool) and v > 0 else None

        need = {k: num(k) for k in ("hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size",
                                     "vocab_size")}
        if any(v is None for v in need.values()):
            return None
        experts = num("num_experts") or num("num_local_experts") or num("n_routed_experts") or 0
        model_type = str(d.get("model_type") or data.get("model_type") or "")
        return cls(
            hidden_size=need["hidden_size"] or 0, num_hidden_layers=need["num_hidden_layers"] or 0,
            num_attention_heads=need["num_attention_heads"] or 0,
            num_key_value_heads=num("num_key_value_heads") or need["num_attention_heads"] or 0,
            intermediate_size=need["intermediate_size"] or 0, vocab_size=need["vocab_size"] or 0,
            head_dim=num("head_dim"),
            tie_word_embeddings=(d.get("tie_word_embeddings", data.get("tie_word_embeddings")) is True),
            # Qwen2 always has q/k/v biases (its config has no key for it); others say attention_bias
            qkv_bias=model_type == "qwen2" or d.get("attention_bias") is True,
            max_position_embeddings=num("max_position_embeddings"),
            num_experts=experts if experts > 1 else 0, moe_intermediate_size=num("moe_intermediate_size"),
            experts_per_token=num("num_experts_per_tok"), qk_norm=model_type in ("qwen3", "qwen3_moe"),
            source=source,
        )

    @property
    def head_size(self) -> int:
        return self.head_dim or self.hidden_size // self.num_attention_heads

    def layer_linears(self) -> dict[str, tuple[int, int]]:
        """(in, out) features of each linear of one decoder layer (peft_config.LAYER_LINEARS' names)."""
        h, hd = self.hidden_size, self.head_size
        q, kv = self.num_attention_heads * hd, self.num_key_value_heads * hd
        inter = self.intermediate_size
        return {"self_attn.q_proj": (h, q), "self_attn.k_proj": (h, kv), "self_attn.v_proj": (h, kv),
                "self_attn.o_proj": (q, h), "mlp.gate_proj": (h, inter), "mlp.up_proj": (h, inter),
                "mlp.down_proj": (inter, h)}

    def layer_params(self, experts: int | None = None) -> int:
        """One decoder layer's parameters; `experts`: count only that many routed experts (a token's share)."""
        h, hd = self.hidden_size, self.head_size
        q, kv = self.num_attention_heads * hd, self.num_key_value_heads * hd
        attn = 2 * h * q + 2 * h * kv + ((q + 2 * kv) if self.qkv_bias else 0) + (2 * hd if self.qk_norm else 0)
        if self.num_experts:
            n = self.num_experts if experts is None else experts
            mlp = 3 * h * (self.moe_intermediate_size or self.intermediate_size) * n \
                + h * self.num_experts  # the router
        else:
            mlp = 3 * h * self.intermediate_size
        return attn + mlp + 2 * h  # two RMSNorm weights

    def embedding_params(self) -> int:
        return self.vocab_size * self.hidden_size

    def parameter_count(self, experts: int | None = None) -> int:
        """Every parameter: layers, the final norm, embeddings and (untied) the LM head (memory and weight sync
        hold all of a mixture-of-experts model's experts)."""
        head = 0 if self.tie_word_embeddings else self.embedding_params()
        return self.num_hidden_layers * self.layer_params(experts) + self.hidden_size + self.embedding_params() + head

    def expert_params(self) -> int:
        """The routed experts' parameters, over every layer (0 for a dense model): what expert parallelism splits."""
        if not self.num_experts:
            return 0
        return self.num_hidden_layers * 3 * self.hidden_size * (self.moe_intermediate_size or self.intermediate_size) \
            * self.num_experts

    def active_parameter_count(self) -> int:
        """The parameters one token computes with: a mixture-of-experts model's routed experts_per_token of its
        experts (the "A22B" of Qwen3-235B-A22B); every parameter for a dense model."""
        if not self.num_experts or not self.experts_per_token:
            return self.parameter_count()
        return self.parameter_count(self.experts_per_token)

    def kv_bytes_per_token(self, dtype_bytes: int, tp: int = 1, pp: int = 1) -> int:
        """KV cache bytes per token on one GPU of a TP x PP server (KV heads are replicated where TP exceeds them;
        a pipeline stage holds its own layers' cache, the largest stage ceil(layers / PP))."""
        heads = math.ceil(self.num_key_value_heads / tp)
        return 2 * math.ceil(self.num_hidden_layers / pp) * heads * self.head_size * dtype_bytes

    def to_json(self) -> dict[str, Any]:
        return asdict(self)
