"""The seam between the online-RL loop and whatever produces completions.

The loop calls `generate` with token-ID prompts (every process its own slice, each prompt already repeated
`num_generations` times consecutively, as TRL's sampler does) and `sync_weights` after every optimizer step.
Backends: `vllm_server.VLLMServerBackend` (HTTP + NCCL/gloo weight transfer), `vllm_colocate.VLLMColocateBackend`
(in-process `vllm.LLM`), `hf_generate.HFGenerateBackend` (the model's own generation) and
`fast_generate.FastGenerateBackend` (static cache, CUDA graphs); `backends.BACKENDS` maps the config's names to
them with their capabilities.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol, runtime_checkable

if TYPE_CHECKING:  # torch stays out of import time for light callers
    import torch


@dataclass
class SamplingParams:
    """Every sampling parameter is explicit so server-side model defaults never leak in."""

    max_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0 = disabled
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    logprobs: bool = True  # return the sampled token's (processed) log-prob
    extra: dict[str, object] = field(default_factory=dict)  # merged last into the request (e.g. seed)


@dataclass
class GenerationOutput:
    """One row per completion, in the order of the prompts passed in."""

    prompt_ids: list[list[int]]
    completion_ids: list[list[int]]
    # Per-token log-prob of each sampled token under the sampler (after temperature), or None when the
    # backend cannot report them; an inner None marks a position the sampler returned no value for.
    logprobs: list[list[float | None]] | None = None
    # True when a completion ended on EOS / a stop token rather than at max_tokens.
    finished: list[bool] | None = None


@runtime_checkable
class GenerationBackend(Protocol):
    def generate(self, prompt_ids: list[list[int]], params: SamplingParams) -> GenerationOutput:
        """Generate one completion per entry of `prompt_ids` (called on every process, collectively)."""
        ...

    def sync_weights(self, named_params: Iterator[tuple[str, torch.Tensor]]) -> None:
        """Push the trainer's current full weights (collective: every rank walks the same iterator)."""
        ...

    def close(self) -> None:
        """Release sockets, groups and engines; safe to call twice."""
        ...
