"""Colocated generation: an in-process `vllm.LLM` per trainer rank (reference section 5, TRL's colocate mode).

* `distributed_executor_backend="external_launcher"`: one engine per trainer process, joined through the
  env:// variables accelerate already set (RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR/PORT);
* tensor parallelism over consecutive ranks: `torch.distributed.new_subgroups_by_enumeration([[0..tp-1], ...])`;
  the ranks of one TP group gather their prompts, run the same requests with the same seed
  (`seed = process_index // tp`) and each keeps its own slice;
* `logprobs_mode="processed_logprobs"` so the sampler's log-probs are comparable with the trainer's
  temperature-scaled ones (importance-sampling correction);
* weights are pushed with `llm.llm_engine.model_executor.driver_worker.model_runner.model.load_weights`, then
  `reset_prefix_cache()`;
* sleep mode (level 2 frees the weights): wake the weights first, load the training weights, then wake the KV
  cache, generate, sleep again. vLLM's `reload_weights` is not used: it reloads the checkpoint from disk
  (TRL #5312); writing weights before waking them crashes on some devices (TRL #5142).

vllm is imported lazily; without it `from_config` fails with the install command.
"""

from __future__ import annotations

import math
import os
import socket
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from launchgen.jobdir import ENV_COLOCATE_MASTER_PORT

from .protocol import GenerationOutput, SamplingParams

if TYPE_CHECKING:
    import torch

    from ..config import TrainerConfig

NamedParamsFn = Callable[[], Iterator[tuple[str, "torch.Tensor"]]]
GatherFn = Callable[[list[list[int]]], list[list[list[int]]]]


def tp_groups(num_processes: int, tp_size: int) -> list[list[int]]:
    """Consecutive ranks form a TP group: [[0..tp-1], [tp..2tp-1], ...]."""
    if tp_size < 1 or num_processes % tp_size != 0:
        raise ValueError(
            f"generation.vllm_colocate.tensor_parallel_size={tp_size} must divide the number of trainer processes "
            f"({num_processes}); pick a divisor or change the process count"
        )
    return [list(range(start, start + tp_size)) for start in range(0, num_processes, tp_size)]


def import_vllm() -> Any:
    try:
        import vllm
    except ImportError as exc:
        raise ImportError(
            "generation.backend=vllm_colocate needs vLLM in the trainer environment: "
            "`pip install 'launchgen[vllm]'` (or use backend `vllm_server` / `hf`)"
        ) from exc
    return vllm


def _ensure_master_addr_port() -> None:
    """external_launcher reads env://; keep accelerate's values, fill in the gaps as TRL does."""
    os.environ.setdefault("MASTER_ADDR", "localhost")
    if os.environ.get("MASTER_PORT", "0") in ("", "0", "auto"):
        # The rendered scripts reserve this port in the plan (train.colocate_master_port, checked for collisions);
        # a free port is the fallback for hand-run trainers, as in TRL.
        planned = os.environ.get(ENV_COLOCATE_MASTER_PORT, "")
        if planned.isdigit():
            os.environ["MASTER_PORT"] = planned
            return
        with socket.socket() as s:
            s.bind(("", 0))
            os.environ["MASTER_PORT"] = str(s.getsockname()[1])


def _clean(value: float | None) -> float | None:
    return None if value is None or math.isnan(value) else float(value)


class VLLMColocateBackend:
    def __init__(
        self,
        llm: Any,
        accelerator: Any,
        *,
        tp_size: int = 1,
        gather_in_tp_group: GatherFn | None = None,
        enable_sleep_mode: bool = False,
        named_params_fn: NamedParamsFn | None = None,
        sampling_params_cls: Any = None,
    ) -> None:
        self.llm = llm
        self.accelerator = accelerator
        self.tp_size = tp_size
        self.tp_rank = int(getattr(accelerator, "process_index", 0)) % tp_size
        self._gather = gather_in_tp_group
        if tp_size > 1 and gather_in_tp_group is None:
            raise ValueError("tensor_parallel_size > 1 needs a TP-group gather")
        self.enable_sleep_mode = enable_sleep_mode
        self.named_params_fn = named_params_fn
        self._sampling_params_cls = sampling_params_cls
        # Level-2 sleep discards the weights; they must be pushed again before the next generation.
        self._weights_current = not enable_sleep_mode
        self._closed = False

    @classmethod
    def from_config(
        cls,
        cfg: TrainerConfig,
        accelerator: Any,
        model: Any,
        named_params_fn: NamedParamsFn | None = None,
    ) -> VLLMColocateBackend:
        """`named_params_fn` yields the full (gathered) weights; needed with sleep mode to re-push after a wake."""
        vllm = import_vllm()
        c = cfg.generation.vllm_colocate
        num_processes = int(getattr(accelerator, "num_processes", 1))
        groups = tp_groups(num_processes, c.tensor_parallel_size)
        gather: GatherFn | None = None
        if c.tensor_parallel_size > 1:
            import torch.distributed as dist

            tp_group, _ = dist.new_subgroups_by_enumeration(groups)

            def _gather_tp(prompts: list[list[int]]) -> list[list[list[int]]]:
                out: list[Any] = [None] * c.tensor_parallel_size
                dist.all_gather_object(out, prompts, group=tp_group)
                return out

            gather = _gather_tp

        os.environ["RANK"] = str(accelerator.process_index)
        os.environ["LOCAL_RANK"] = str(accelerator.local_process_index)
        os.environ["WORLD_SIZE"] = str(num_processes)
        _ensure_master_addr_port()
        name = getattr(getattr(model, "config", None), "_name_or_path", None) or getattr(model, "name_or_path", None)
        llm = vllm.LLM(
            model=name or cfg.model.name_or_path,
            revision=cfg.model.revision,
            tensor_parallel_size=c.tensor_parallel_size,
            gpu_memory_utilization=c.gpu_memory_utilization,
            max_model_len=c.max_model_len,
            max_num_seqs=cfg.per_device_train_batch_size * c.tensor_parallel_size * int(cfg.steps_per_generation or 1),
            max_num_batched_tokens=c.max_num_batched_tokens,
            enable_sleep_mode=c.enable_sleep_mode,
            distributed_executor_backend="external_launcher",
            seed=accelerator.process_index // c.tensor_parallel_size,
            logprobs_mode="processed_logprobs",
            trust_remote_code=cfg.model.trust_remote_code,
        )
        if c.enable_sleep_mode:
            llm.sleep(level=2)
        accelerator.wait_for_everyone()
        if named_params_fn is None:
            unwrapped = accelerator.unwrap_model(model) if hasattr(accelerator, "unwrap_model") else model

            def _plain_params() -> Iterator[tuple[str, torch.Tensor]]:
                # Correct for unsharded training only; the trainer passes its gathering iterator otherwise.
                return ((n, p.detach()) for n, p in unwrapped.named_parameters())

            named_params_fn = _plain_params

        return cls(
            llm,
            accelerator,
            tp_size=c.tensor_parallel_size,
            gather_in_tp_group=gather,
            enable_sleep_mode=c.enable_sleep_mode,
            named_params_fn=named_params_fn,
            sampling_params_cls=vllm.SamplingParams,
        )

    # -- weights ------------------------------------------------------------------------------------------
    def _inner_model(self) -> Any:
        return self.llm.llm_engine.model_executor.driver_worker.model_runner.model

    def sync_weights(self, named_params: Iterator[tuple[str, torch.Tensor]]) -> None:
        if self.enable_sleep_mode:
            import torch

            if torch.cuda.is_available():
                torch.cuda.empty_cache()
            self.llm.wake_up(tags=["weights"])
        target = self._inner_model()
        for name, tensor in named_params:
            target.load_weights([(name, tensor)])
        self.llm.reset_prefix_cache()
        self._weights_current = True

    # -- generation ---------------------------------------------------------------------------------------
    def _sampling_params(self, params: SamplingParams) -> Any:
        cls = self._sampling_params_cls
        if cls is None:
            cls = import_vllm().SamplingParams
        return cls(
            n=1,
            repetition_penalty=params.repetition_penalty,
            temperature=params.temperature,
            top_p=params.top_p,
            top_k=params.top_k,
            min_p=params.min_p,
            max_tokens=params.max_tokens,
            logprobs=0 if params.logprobs else None,
            **params.extra,
        )

    def generate(self, prompt_ids: list[list[int]], params: SamplingParams) -> GenerationOutput:
        if self.enable_sleep_mode:
            if not self._weights_current:
                if self.named_params_fn is None:
                    raise RuntimeError("sleep mode discarded the weights and no named_params_fn can re-push them")
                self.sync_weights(self.named_params_fn())
            self.llm.wake_up(tags=["kv_cache"])
        if self.tp_size > 1:
            assert self._gather is not None
            per_rank = self._gather(prompt_ids)
        else:
            per_rank = [prompt_ids]
        all_prompts = [p for rank in per_rank for p in rank]
        outputs = self.llm.generate(
            [{"prompt_token_ids": p} for p in all_prompts], sampling_params=self._sampling_params(params), use_tqdm=False
        )
        prompts_out: list[list[int]] = []
        completions: list[list[int]] = []
        logprobs: list[list[float | None]] | None = [] if params.logprobs else None
        finished: list[bool] = []
        for prompt, out in zip(all_prompts, outputs, strict=True):
            o = out.outputs[0]
            ids = [int(t) for t in o.token_ids]
            prompts_out.append(list(prompt))
            completions.append(ids)
            finished.append(o.finish_reason == "stop")
            if logprobs is not None:
                per_pos = o.logprobs or [None] * len(ids)
                logprobs.append(
                    [_clean(step[t].logprob) if step and t in step else None for step, t in zip(per_pos, ids, strict=True)]
                )
        if self.enable_sleep_mode:
            self.llm.sleep(level=2)
            self._weights_current = False
        start = sum(len(r) for r in per_rank[: self.tp_rank])
        rows = slice(start, start + len(prompt_ids))
        return GenerationOutput(
            prompt_ids=prompts_out[rows],
            completion_ids=completions[rows],
            logprobs=logprobs[rows] if logprobs is not None else None,
            finished=finished[rows],
        )

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self.llm = None
