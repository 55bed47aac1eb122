"""`HFGenerateBackend`: completions from the policy's own `generate` (no vLLM), for small machines and tests.

Each process generates its own slice (the loop hands every rank its prompts). Prompts are left-padded into one
batch; sampling follows `SamplingParams`; a completion ends at its first EOS (kept, as TRL keeps it) or at
`max_tokens`. The returned log-prob of each sampled token is taken from the processed distribution (after
temperature, top-k/top-p/min-p and repetition penalty), like vLLM's `processed_logprobs`. Weights are shared with
the trainer, so `sync_weights` has nothing to do.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch
from launchgen.trainers.generation.protocol import GenerationOutput, SamplingParams
from transformers import LogitsProcessor, LogitsProcessorList
from transformers.generation.logits_process import (
    MinPLogitsWarper,
    RepetitionPenaltyLogitsProcessor,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)


class _SampledLogprobRecorder(LogitsProcessor):
    """Runs last: keeps the processed log-softmax of one step until the next call reveals the sampled token.

    Holding a single (B, V) step instead of `output_scores` keeps memory flat in the completion length.
    """

    def __init__(self, prompt_width: int) -> None:
        self.prompt_width = prompt_width
        self.prev: torch.Tensor | None = None
        self.values: list[torch.Tensor] = []

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        if self.prev is not None:
            self.values.append(self._take(input_ids[:, -1]))
        self.prev = torch.log_softmax(scores.float(), dim=-1)
        return scores

    def _take(self, tokens: torch.Tensor) -> torch.Tensor:
        assert self.prev is not None
        return torch.gather(self.prev, -1, tokens.unsqueeze(-1)).squeeze(-1)

    def finish(self, sequences: torch.Tensor) -> torch.Tensor:
        if self.prev is not None and sequences.size(1) > self.prompt_width + len(self.values):
            self.values.append(self._take(sequences[:, self.prompt_width + len(self.values)]))
        self.prev = None
        if not self.values:
            return torch.zeros(sequences.size(0), 0)
        return torch.stack(self.values, dim=1)


def _generate_through_fsdp_root(model: torch.nn.Module) -> None:
    """A PEFT model under FSDP2 is the FSDP root, but its `generate` calls the transformers model inside it, past
    the root's forward hooks: the root's own parameters (embeddings, final norm, LM head) would stay sharded, and
    the first decoder layer to run would take itself for the root. FSDP2 runs those hooks around `generate` once
    it is registered as a forward method (a full fine-tune's root is the transformers model: nothing to do)."""
    from torch.distributed.fsdp import FSDPModule, register_fsdp_forward_method

    if isinstance(model, FSDPModule) and hasattr(model, "get_base_model"):
        register_fsdp_forward_method(model, "generate")


class HFGenerateBackend:
    def __init__(
        self,
        model: torch.nn.Module,
        pad_token_id: int,
        eos_token_ids: list[int],
        accelerator: Any = None,
        synced_gpus: bool = False,
    ) -> None:
        self.model = model
        self.pad_token_id = pad_token_id
        self.eos_token_ids = list(eos_token_ids)
        self.accelerator = accelerator
        # FSDP / ZeRO-3 run collectives in every forward: ranks must keep stepping until all are done.
        self.synced_gpus = synced_gpus

    @classmethod
    def from_config(cls, cfg: Any, accelerator: Any, model: torch.nn.Module, tokenizer: Any) -> HFGenerateBackend:
        from accelerate.utils import DistributedType

        eos = tokenizer.eos_token_id
        gen_eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
        eos_ids = sorted({*([eos] if eos is not None else []), *(gen_eos if isinstance(gen_eos, list) else [gen_eos] if gen_eos is not None else [])})
        sharded = accelerator is not None and accelerator.distributed_type in (
            DistributedType.FSDP,
            DistributedType.DEEPSPEED,
        )
        if sharded:
            _generate_through_fsdp_root(accelerator.unwrap_model(model))
        return cls(model, tokenizer.pad_token_id, eos_ids, accelerator, synced_gpus=sharded)

    def _unwrapped(self) -> Any:
        if self.accelerator is None:
            return self.model
        return self.accelerator.unwrap_model(self.model)

    @torch.no_grad()
    def generate(self, prompt_ids: list[list[int]], params: SamplingParams) -> GenerationOutput:
        model = self._unwrapped()
        device = next(model.parameters()).device
        width = max(len(p) for p in prompt_ids)
        ids = torch.full((len(prompt_ids), width), self.pad_token_id, dtype=torch.long)
        mask = torch.zeros((len(prompt_ids), width), dtype=torch.long)
        for i, p in enumerate(prompt_ids):
            if p:
                ids[i, width - len(p) :] = torch.tensor(p, dtype=torch.long)
                mask[i, width - len(p) :] = 1
        ids, mask = ids.to(device), mask.to(device)
        recorder = _SampledLogprobRecorder(width)
        # transformers applies user processors BEFORE its own warpers, so the whole chain is built here (in
        # vLLM's order: penalties, temperature, top-k, top-p, min-p) and generate's own warpers are neutralised;
        # the recorder then sees exactly the distribution that is sampled from.
        procs: list[LogitsProcessor] = []
        if params.repetition_penalty != 1.0:
            procs.append(RepetitionPenaltyLogitsProcessor(params.repetition_penalty))
        if params.temperature != 1.0:
            procs.append(TemperatureLogitsWarper(params.temperature))
        if params.top_k > 0:
            procs.append(TopKLogitsWarper(params.top_k))
        if params.top_p < 1.0:
            procs.append(TopPLogitsWarper(params.top_p))
        if params.min_p > 0.0:
            procs.append(MinPLogitsWarper(params.min_p))
        procs.append(recorder)
        kwargs: dict[str, Any] = dict(
            do_sample=True,
            temperature=1.0,
            top_p=1.0,
            top_k=0,
            min_p=None,
            repetition_penalty=1.0,
            max_new_tokens=params.max_tokens,
            eos_token_id=self.eos_token_ids,
            pad_token_id=self.pad_token_id,
            logits_processor=LogitsProcessorList(procs),
            return_dict_in_generate=True,
            use_cache=True,
            synced_gpus=self.synced_gpus,
        )
        # `params.extra` carries vLLM request fields (generation.generation_kwargs); generate() has no use for them.
        was_training = model.training
        model.eval()  # gradient checkpointing (train mode) would disable the KV cache
        try:
            out = model.generate(input_ids=ids, attention_mask=mask, **kwargs)
        finally:
            model.train(was_training)
        sequences = out.sequences
        step_logps = recorder.finish(sequences).cpu()
        new = sequences[:, width:].cpu()
        completions: list[list[int]] = []
        logprobs: list[list[float | None]] = []
        finished: list[bool] = []
        eos = set(self.eos_token_ids)
        for i in range(new.size(0)):
            row = new[i].tolist()
            end = next((j for j, t in enumerate(row) if t in eos), None)
            n = len(row) if end is None else end + 1
            completions.append(row[:n])
            logprobs.append([float(x) for x in step_logps[i, :n].tolist()])
            finished.append(end is not None)
        return GenerationOutput(
            prompt_ids=[list(p) for p in prompt_ids],
            completion_ids=completions,
            logprobs=logprobs,
            finished=finished,
        )

    def sync_weights(self, named_params: Iterator[tuple[str, torch.Tensor]]) -> None:
        # The sampler is the policy itself; draining keeps the collective contract if a caller passes an iterator.
        for _ in named_params:
            pass

    def close(self) -> None:
        return None
