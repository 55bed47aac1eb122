"""`train.args.peft`: LoRA adapters, and which module names a decoder-only architecture has (no torch).

This module imports only pydantic and the standard library, so `launchgen check` validates the section and
the target names on a login node (`launchgen/checks/spec/peft.py`) with the very rules the trainer applies
(`trainers/lora.py`). Defaults are TRL's `ModelConfig` LoRA defaults (r 16, alpha 32, dropout 0.05); `all-linear`
is PEFT's: every linear layer except the output head.

Target matching is PEFT's rule for a list: an entry matches a module whose dotted name equals it or ends with
`.<entry>` (`q_proj` matches `model.layers.3.self_attn.q_proj`, `self_attn.q_proj` too).
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

ALL_LINEAR: Literal["all-linear"] = "all-linear"

#: The per-layer linear layers of the decoder-only families whose config.json names them alone (the module path
#: inside a decoder layer). The output head and the embeddings are not LoRA targets here (see `NOT_TARGETS`).
_LLAMA_LIKE = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
               "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")
LAYER_LINEARS: dict[str, tuple[str, ...]] = {
    "llama": _LLAMA_LIKE,
    "mistral": _LLAMA_LIKE,
    "qwen2": _LLAMA_LIKE,
    "qwen3": _LLAMA_LIKE,
    "gemma": _LLAMA_LIKE,
}
#: The other modules of those families (for `modules_to_save`), relative to the CausalLM.
TOP_MODULES = ("model.embed_tokens", "model.norm", "lm_head")
LAYER_OTHER = ("self_attn", "mlp", "input_layernorm", "post_attention_layernorm")
#: Modules LoRA may not adapt here: the trainer's log-prob head reads the LM head's weight directly (an adapter
#: on it would be skipped), and LoRA on embeddings is a different merge rule that the weight sync does not do.
NOT_TARGETS = ("lm_head", "embed_tokens")
#: Modules that may not be fully trained (`modules_to_save`): the LM head, for the same reason.
NOT_SAVABLE = ("lm_head",)

#: vLLM loads these per-layer linears into one fused parameter (qkv_proj, gate_up_proj): when one of a group is
#: adapted the weight sync sends the whole group, so the server never reloads a fused layer from part of it.
FUSED_GROUPS: tuple[tuple[str, ...], ...] = (("q_proj", "k_proj", "v_proj"), ("gate_proj", "up_proj"))


class PeftSection(BaseModel):
    # built with the trainer config that holds it, on first validation, not on import
    model_config = ConfigDict(extra="forbid", validate_default=True, defer_build=True)

    r: int = Field(default=16, ge=1, description="LoRA rank.")
    lora_alpha: float = Field(default=32, gt=0, description="LoRA alpha; the update is scaled by lora_alpha / r.")
    lora_dropout: float = Field(default=0.05, ge=0, lt=1, description="Dropout on the adapter's input.")
    target_modules: list[str] | Literal["all-linear"] = Field(
        default=ALL_LINEAR,
        description="Module names to adapt (PEFT's suffix match: `q_proj`, `self_attn.o_proj`) or `all-linear` "
        "(every linear layer but the LM head). Each entry must match a linear layer of the decoder.",
    )
    modules_to_save: list[str] = Field(
        default_factory=list,
        description="Modules trained in full besides the adapters (e.g. `embed_tokens`); saved with the adapter "
        "and sent to the server in full. Not the LM head.",
    )
    adapter_path: str | None = Field(
        default=None,
        description="A saved adapter directory (adapter_config.json + weights, e.g. a previous run's `final/`) "
        "to continue training from; its r, lora_alpha, target_modules and modules_to_save then rule, and the "
        "fields above must agree with them where they are written.",
    )
    save_merged: bool = Field(
        default=False,
        description="Also write the merged model (base + adapter, plain transformers format) to `final/merged`.",
    )

    @field_validator("target_modules")
    @classmethod
    def _targets(cls, v: list[str] | str) -> list[str] | str:
        if isinstance(v, list):
            if not v:
                raise ValueError("target_modules is empty: list module names or use all-linear")
            for name in v:
                _check_name(name, "target_modules")
                if name.split(".")[-1] in NOT_TARGETS:
                    raise ValueError(
                        f"target_modules entry {name!r}: LoRA on the LM head or the embeddings is not supported "
                        "(the log-prob head reads the head weight directly); train it in full with modules_to_save "
                        "(embeddings only) or leave it out"
                    )
        return v

    @field_validator("modules_to_save")
    @classmethod
    def _saved(cls, v: list[str]) -> list[str]:
        for name in v:
            _check_name(name, "modules_to_save")
            if name.split(".")[-1] in NOT_SAVABLE:
                raise ValueError(
                    f"modules_to_save entry {name!r}: the LM head cannot be trained in full with LoRA here (the "
                    "trainer's log-prob head reads its weight directly); leave it out"
                )
        return v

    @property
    def scaling(self) -> float:
        return self.lora_alpha / self.r


def _check_name(name: str, field: str) -> None:
    parts = name.split(".")
    if not name or any(not p or not p.replace("_", "").isalnum() for p in parts):
        raise ValueError(f"{field} entry {name!r} is not a dotted module name (letters, digits, _ and .)")


def matches(entry: str, module_name: str) -> bool:
    """PEFT's list rule: the whole name, or a suffix starting at a dot."""
    return module_name == entry or module_name.endswith("." + entry)


def known_linears(model_type: str | None) -> tuple[str, ...] | None:
    """The per-layer linear paths of `model_type`, or None for an architecture this table does not know."""
    return LAYER_LINEARS.get(model_type or "")


def _layer_ids(num_layers: int | None) -> range:
    return range(num_layers if num_layers and num_layers > 0 else 1)


def entry_matches_layer_linear(entry: str, model_type: str | None, num_layers: int | None = None) -> bool | None:
    """Whether a target entry matches a linear of a decoder layer (`model.layers.<i>.<path>`); None: unknown
    architecture."""
    paths = known_linears(model_type)
    if paths is None:
        return None
    return any(matches(entry, f"model.layers.{i}.{p}") for i in _layer_ids(num_layers) for p in paths)


def entry_matches_module(entry: str, model_type: str | None, num_layers: int | None = None) -> bool | None:
    """Whether a `modules_to_save` entry names some module of the architecture; None: unknown architecture."""
    paths = known_linears(model_type)
    if paths is None:
        return None
    names = [*TOP_MODULES, "model", "model.layers"]
    for i in _layer_ids(num_layers):
        names += [f"model.layers.{i}", *(f"model.layers.{i}.{p}" for p in (*paths, *LAYER_OTHER))]
    return any(matches(entry, n) for n in names)


def combination_errors(*, use_liger_kernel: bool) -> list[tuple[str, str]]:
    """(field, message) for each trainer setting LoRA cannot run with; one rule for the trainer config and `check`.

    Refused rather than half-working: Liger's instance patching was not verified with PEFT's wrapped linears.
    Compiled decoder layers and the static-cache generation engine do run with LoRA (the layers' frame traces
    through PEFT's linears, tests/trainers/test_compile.py; the engine decodes the adapted projections with their
    merged weights, `generation/fast_generate/adapters.py`).
    """
    out = []
    if use_liger_kernel:
        out.append(("model.use_liger_kernel", "Liger kernels are not supported with LoRA (peft): set "
                    "use_liger_kernel: false"))
    return out
