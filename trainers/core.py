"""The training loop every bundled trainer runs: batches -> loss -> step -> sync -> log -> checkpoint.

`Trainer` owns what is common (accelerate set-up, models, optimizer and scheduler, the gradient-accumulation loop,
`max_tokens_per_forward` passes, weight sync, reporting (`reporting.Reporter`), checkpoints, USR2/TERM -> checkpoint +
exit 75, `final/` and the completion marker). What differs per trainer is its objective (`objectives`, looked up
by `trainer` name), which brings its batch source: `rollout.Rollout` for the online-RL trainers,
`supervised.ExampleSource` for SFT.

Batch arithmetic follows TRL 1.16. One optimizer step = `gradient_accumulation_steps` (GA) micro-batches of
`per_device_train_batch_size` completions per process. A generation batch holds
`per_device_train_batch_size * num_processes * steps_per_generation` completions (`num_generations` per prompt,
consecutive; a group may span processes) and is used for `steps_per_generation * num_iterations` micro-batches
(see `rollout`). SFT's "generation batch" is the next GA micro-batches of examples.

After every optimizer step a backend that needs it receives the full weights (`weights.iter_full_named_params`,
walked on every rank; with `peft`, the merged adapted modules: `lora`); a backend that shares the policy's weights
skips it (`generation.backends`).
"""

from __future__ import annotations

import gc
import os
import time
from collections import defaultdict
from collections.abc import Callable
from contextlib import nullcontext
from pathlib import Path
from typing import Any

import torch
from launchgen.trainers import checkpoint as ckpt
from launchgen.trainers import epochs, grad_checkpointing, reporting, resume
from launchgen.trainers.declarations.config import TrainerConfig
from launchgen.trainers.declarations.errors import TrainerSetupError
from launchgen.trainers.evaluation import Evaluator
from launchgen.trainers.generation.protocol import GenerationBackend
from launchgen.trainers.objectives import build_objective
from launchgen.trainers.objectives.base import Batch, BatchSource, Objective
from launchgen.trainers.passes import split_passes
from launchgen.trainers.stats import STEP_TOKENS, Stat, StepStats, reduce_step, window_value
from launchgen.trainers.sync_params import iter_sync_params


class Trainer:
    def __init__(self, cfg: TrainerConfig, accelerator: Any = None) -> None:
        self.cfg = cfg
        self.accelerator = accelerator
        self.signals = ckpt.SignalFlag()
        self._ready = False

    @property
    def backend(self) -> GenerationBackend | None:
        # Also after a set-up that failed past the backend's creation (e.g. at resume): `close` must release it.
        source: BatchSource | None = getattr(self, "source", None)
        return source.backend if source is not None else None

    # ------------------------------------------------------------------------------------------ setup

    def setup(self) -> None:
        from accelerate.utils import set_seed
        from launchgen.trainers import modeling

        cfg = self.cfg
        modeling.check_precision(cfg)
        acc = self._accelerator()
        self.objective: Objective = build_objective(cfg, acc.num_processes)
        self._refuse_passes_under_deepspeed()
        reporting.require_backends(cfg)
        reporting.quiet_bars_off_terminal()
        # before any model is loaded: a checkpoint of another config is refused in seconds, not minutes
        decision = resume.decide(cfg)
        set_seed(cfg.seed, device_specific=True)
        self.geometry = self.objective.geometry
        # Cheap, user-fixable inputs first, so their errors do not wait for a large model to load.
        self.source: BatchSource = self.objective.make_source(acc)
        self.tokenizer = modeling.load_tokenizer(cfg)
        self.source.after_tokenizer(self.tokenizer)
        if cfg.num_train_epochs is not None:
            cfg.max_steps = epochs.steps_for(cfg.num_train_epochs, self.source.sampler.n, self.source.rows_per_batch,
                                             self.geometry)
            if acc.is_main_process:
                print(f"[launchgen] num_train_epochs {cfg.num_train_epochs:g} over {self.source.sampler.n} rows: "
                      f"{cfg.max_steps} optimizer steps", flush=True)
        self.evaluator = Evaluator(self.source) if cfg.eval_strategy == "steps" else None
        self._load_models()
        self.source.start(self.model, self.ref_model, self.compiled)
        self.global_step = 0
        self.micro_step = 0
        self.buffer: list[Batch] | None = None
        self.out = Path(cfg.output_dir)
        if acc.is_main_process:
            self.out.mkdir(parents=True, exist_ok=True)
            (self.out / "resolved_config.yaml").write_text(cfg.to_yaml())
        self.resumed_from: Path | None = None
        if decision.checkpoint is not None:
            if decision.note and acc.is_main_process:
                print(decision.note, flush=True)
            self._resume(decision.checkpoint)
            if acc.is_main_process and self.global_step < cfg.max_steps:
                resume.reopen(cfg)
        self.first_step = self.global_step  # this process's first step: the one an out-of-memory may retry
        self.reporter = reporting.Reporter(
            cfg, self.out, acc.is_main_process, self.global_step, resumed=self.resumed_from is not None
        )
        self._ready = True

    def _accelerator(self) -> Any:
        if self.accelerator is None:
            from accelerate import Accelerator
            from launchgen.trainers import modeling

            # Without a GPU, `cpu=True` is what makes accelerate form a gloo group across the launched processes
            # (otherwise each process silently trains alone).
            self.accelerator = Accelerator(
                mixed_precision=modeling.accelerate_mixed_precision(self.cfg), cpu=not torch.cuda.is_available()
            )
        return self.accelerator

    def _refuse_passes_under_deepspeed(self) -> None:
        from accelerate.utils import DistributedType

        if self.cfg.max_tokens_per_forward is not None and self.accelerator.distributed_type == DistributedType.DEEPSPEED:
            raise TrainerSetupError(
                "max_tokens_per_forward is not supported under DeepSpeed: its engine counts every backward as a "
                "gradient-accumulation step; set it to null and lower per_device_train_batch_size (raising "
                "gradient_accumulation_steps) instead"
            )

    def _load_models(self) -> None:
        """Policy (prepared with its optimizer), the LR scheduler and, where the objective needs it, the frozen
        reference loaded from the same path."""
        from accelerate.utils import DistributedType
        from launchgen.trainers import modeling
        from transformers import get_scheduler

        cfg, acc = self.cfg, self.accelerator
        plan = modeling.resolve_compile(cfg, acc.device.type, str(acc.distributed_type.value))
        self.compiled = plan.layers  # generation must then run the layers eagerly
        self.checkpointing = grad_checkpointing.resolve(cfg, acc)
        if acc.is_main_process:
            print(self.checkpointing.line(), flush=True)
        model = modeling.load_model(cfg, trainable=True, compile=plan, checkpointing=self.checkpointing.on)
        if cfg.peft is not None:
            from launchgen.trainers import lora

            lora.check_distributed(acc)
            model = lora.wrap_policy(model, cfg)
        # peft: the reference is the policy with its adapters disabled (below), not a second copy
        needs_ref_copy = self.objective.needs_reference and cfg.peft is None
        ref = modeling.load_model(cfg, trainable=False, compile=plan) if needs_ref_copy else None
        sharded = acc.distributed_type in (DistributedType.FSDP, DistributedType.DEEPSPEED)
        # The fused CUDA kernel (TRL's default optimizer, `adamw_torch_fused`) updates every tensor in one pass with
        # no temporaries; the foreach path materialises sqrt(v) etc. for all parameters at once (~2x the parameter
        # bytes of extra peak memory at the step). Sharded parameters keep the foreach path.
        fused = acc.device.type == "cuda" and acc.distributed_type in (DistributedType.NO, DistributedType.MULTI_GPU)
        opt = torch.optim.AdamW(
            [p for p in model.parameters() if p.requires_grad],
            lr=cfg.learning_rate,
            betas=(cfg.adam_beta1, cfg.adam_beta2),
            eps=cfg.adam_epsilon,
            weight_decay=cfg.weight_decay,
            fused=True if fused else None,
        )
        if sharded:
            modeling.get_logp_head(model).fused = False
        self.model, self.optimizer = acc.prepare(model, opt)
        # Not prepared: accelerate's scheduler wrapper steps num_processes times per call; registered for save/load.
        self.scheduler = get_scheduler(
            cfg.lr_scheduler_type, self.optimizer, num_warmup_steps=cfg.warmup_steps, num_training_steps=cfg.max_steps
        )
        acc.register_for_checkpointing(self.scheduler)
        if ref is not None:
            ref = acc.prepare_model(ref, evaluation_mode=True) if sharded else ref.to(acc.device)
        self.own_state: ckpt.OwnState | None = None
        if cfg.peft is not None:
            self.own_state = lora.register_adapter_checkpoints(acc, self.model, self.optimizer)
            if self.objective.needs_reference:
                ref = lora.AdapterOffReference(self.model, acc)
        self.ref_model = ref
        from launchgen.trainers import memory_budget

        self.memory_choice = memory_budget.apply(cfg, self.model, ref, acc)

    # ------------------------------------------------------------------------------------------ checkpoints

    def _resume(self, path: Path) -> None:
        state, buffer = ckpt.load_checkpoint(self.accelerator, path, self.own_state)
        self.global_step = int(state["global_step"])
        self.micro_step = int(state["micro_step"])
        self.source.load_state_dict(state)
        self.objective.load_state_dict(state)
        dev = self.accelerator.device
        self.buffer = (
            [{k: (v.to(dev) if isinstance(v, torch.Tensor) else v) for k, v in mb.items()} for mb in buffer]
            if buffer is not None
            else None
        )
        self.resumed_from = path

    def _trainer_state(self) -> dict[str, Any]:
        return {
            "global_step": self.global_step,
            "micro_step": self.micro_step,
            **self.source.state_dict(),
            **self.objective.state_dict(),
            "trainer": self.cfg.trainer,
            "max_steps": self.cfg.max_steps,  # resolved (num_train_epochs): resume.decide's "already complete"
            resume.STATE_KEY: resume.fingerprint(self.cfg),
        }

    def save(self) -> Path:
        mid_batch = self.micro_step % self.geometry.generate_every != 0
        buf = (
            [{k: (v.cpu() if isinstance(v, torch.Tensor) else v) for k, v in mb.items()} for mb in self.buffer]
            if mid_batch and self.buffer is not None
            else None
        )
        return ckpt.save_checkpoint(
            self.accelerator, self.out, self.global_step, self._trainer_state(), buf, self.cfg.save_total_limit,
            self.own_state,
        )

    # ------------------------------------------------------------------------------------------ seams

    def generate_batch(self) -> tuple[list[Batch], dict[str, float]]:
        """The next generation batch (its `steps_per_generation` micro-batches) and its metrics."""
        return self.source.next_batches()

    def split_passes(self, mb: Batch) -> list[tuple[Batch, Stat]]:
        return split_passes(mb, self.cfg.max_tokens_per_forward, self.source.layout, self.objective.pair_size,
                            self.objective.loss_share, self._agree_passes)

    @property
    def _agree_passes(self) -> Callable[[int], int] | None:
        """Under FSDP every rank must run as many forward passes (see `passes.split_passes`): the max over ranks."""
        from accelerate.utils import DistributedType

        acc = self.accelerator
        if acc.num_processes == 1 or acc.distributed_type != DistributedType.FSDP:
            return None

        def agree(n: int) -> int:
            t = torch.tensor([n], device=acc.device)
            torch.distributed.all_reduce(t, op=torch.distributed.ReduceOp.MAX)
            return int(t.item())

        return agree

    def micro_loss(self, mb: Batch, stats: StepStats) -> torch.Tensor:
        return self.objective.loss(self.model, mb, stats)

    # ------------------------------------------------------------------------------------------ loop

    def train(self) -> int:
        if not self._ready:
            self.setup()
        cfg, acc = self.cfg, self.accelerator
        if not self.signals.installed:
            self.signals.install()
        self._pending: dict[str, list[float]] = defaultdict(list)
        try:
            if self.source.needs_weight_sync and self.global_step < cfg.max_steps:
                # The engine's weights are not known to be the policy's before the first generation: a requeued
                # job's vLLM starts from the base weights, a long-lived server holds whatever its last trainer
                # pushed, and a fresh policy may differ from the checkpoint the server loaded. Push them first,
                # all of them: with peft the later pushes carry the adapted modules only, so the embeddings, norms
                # and LM head must be the policy's from here on.
                self._sync_weights(full=True)
            while self.global_step < cfg.max_steps:
                # Checked before each step (so also right after setup, where loading can take minutes): after the
                # last step the run is complete and a late signal changes nothing.
                if self.signals.any_rank(acc):
                    return self._preempted()
                done_before = epochs.completed(self.source.sampler)
                step_metrics = self._step()
                self.reporter.count_tokens(step_metrics.pop(STEP_TOKENS, 0.0))
                if self.evaluator is not None and self._eval_due():
                    step_metrics.update(self.evaluator.run())
                self._record(step_metrics)
                self.reporter.progress(step_metrics, self.source.progress_keys)
                if self._save_due(done_before) and self.global_step < cfg.max_steps:
                    self.save()
            return self._finish()
        finally:
            self.reporter.close()
            self.signals.uninstall()

    def _eval_due(self) -> bool:
        every = self.cfg.eval_steps or self.cfg.logging_steps
        return self.global_step % every == 0 or self.global_step == self.cfg.max_steps

    def _save_due(self, epochs_done_before: int) -> bool:
        """A periodic checkpoint after this step (`save_strategy`); the final one is `_finish`'s."""
        cfg = self.cfg
        if cfg.save_strategy == "epoch":
            return epochs.completed(self.source.sampler) > epochs_done_before
        return cfg.save_strategy == "steps" and bool(cfg.save_steps) and self.global_step % cfg.save_steps == 0

    def _preempted(self) -> int:
        self.save()
        if self.accelerator.is_main_process:
            print(
                f"[launchgen] signal received: checkpoint-{self.global_step} written to {self.out}; "
                f"exiting {ckpt.EXIT_PREEMPTED} so the job is requeued",
                flush=True,
            )
        return ckpt.EXIT_PREEMPTED

    def _step(self) -> dict[str, float]:
        """One optimizer step over GA micro-batches (regenerating where a generation batch is used up)."""
        cfg, acc = self.cfg, self.accelerator
        t_step = time.perf_counter()
        stats = StepStats()
        step_metrics: dict[str, float] = {}
        self.model.train()
        start, objective_state = self.micro_step, self.objective.state_dict()
        try:
            t_train = self._micro_batches(stats, step_metrics)
            retry = False
        except torch.OutOfMemoryError:
            if not self._may_retry_oom(start):
                raise
            retry = True  # retried outside `except`: its traceback holds the failed pass's activations
        if retry:
            self._checkpointing_on_after_oom(start, objective_state)
            stats = StepStats()
            t_train = self._micro_batches(stats, step_metrics, generate=False)
        ts = time.perf_counter()
        grad_norm = None
        if cfg.max_grad_norm > 0:
            grad_norm = acc.clip_grad_norm_(self.model.parameters(), cfg.max_grad_norm)
        lr = self.scheduler.get_last_lr()[0]
        self.optimizer.step()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        t_train += time.perf_counter() - ts
        self.global_step += 1
        self.signals.training()  # progress since the last checkpoint: TERM now checkpoints first
        step_metrics.update(self.objective.end_step())
        if self.source.needs_weight_sync:
            step_metrics["time/sync_weights"] = self._sync_weights()
        step_metrics.update(reduce_step(stats, acc, self._gather, self.objective.always_extremes))
        if grad_norm is not None:
            step_metrics["grad_norm"] = float(grad_norm)
        step_metrics["learning_rate"] = lr
        step_metrics["time/train"] = t_train
        step_metrics["time/step"] = time.perf_counter() - t_step  # wall time; `launchgen plan --from-run` reads it
        sampler = self.source.sampler
        step_metrics["epoch"] = sampler.epoch + sampler.index / max(1, sampler.n)
        return step_metrics

    def _micro_batches(self, stats: StepStats, step_metrics: dict[str, float], generate: bool = True) -> float:
        """The step's GA micro-batches, forward and backward (regenerating where a generation batch is used up,
        unless `generate` is False: the retry reuses the batch); returns their seconds."""
        acc, ga = self.accelerator, self.geometry.ga
        t_train = 0.0
        for k in range(ga):
            if k:
                stats.next_micro_batch()  # metrics per micro-batch, averaged over the step (as TRL logs them)
            if generate and (self.micro_step % self.geometry.generate_every == 0 or self.buffer is None):
                self.buffer, gen_metrics = self.generate_batch()
                step_metrics.update(gen_metrics)
            assert self.buffer is not None
            mb = self.buffer[self.micro_step % self.geometry.spg]
            ts = time.perf_counter()
            passes = self.split_passes(mb)
            for j, (part, share) in enumerate(passes):
                last = k == ga - 1 and j == len(passes) - 1
                with acc.no_sync(self.model) if not last else nullcontext():
                    loss = self.micro_loss(part, stats)
                    if len(passes) > 1:
                        loss = loss * share
                    acc.backward(loss)
                stats.loss = stats.loss + loss.detach().to(torch.float64)
            stats.add(STEP_TOKENS, self.source.layout.tokens(mb))
            t_train += time.perf_counter() - ts
            self.micro_step += 1
        return t_train

    def _may_retry_oom(self, start: int) -> bool:
        """An out-of-memory in this process's first step, with checkpointing off by `auto`, one process, and every
        micro-batch of the step from the generation batch already made (so the retry regenerates nothing)."""
        c = self.checkpointing
        if not c.auto or c.on or self.global_step != self.first_step:
            return False
        if self.accelerator.num_processes > 1:
            print("[launchgen] out of memory in the first step with gradient_checkpointing off (auto); with "
                  "several processes it is not retried: set train.gradient_checkpointing: true", flush=True)
            return False
        every = self.geometry.generate_every
        return self.buffer is not None and all((start + k) % every for k in range(1, self.geometry.ga))

    def _checkpointing_on_after_oom(self, start: int, objective_state: dict[str, Any]) -> None:
        self.optimizer.zero_grad(set_to_none=True)
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
        from launchgen.trainers import modeling

        modeling.enable_checkpointing(self.accelerator.unwrap_model(self.model))
        self.checkpointing = self.checkpointing.retrying()
        self.micro_step = start
        self.objective.load_state_dict(objective_state)
        print("[launchgen] out of memory in the first step with gradient_checkpointing off (auto); retrying the "
              "step once with it on (set train.gradient_checkpointing: true to start that way)", flush=True)

    def _record(self, step_metrics: dict[str, float]) -> None:
        for key, value in step_metrics.items():
            self._pending[key].append(value)
        if self.global_step % self.cfg.logging_steps == 0 or self.global_step == self.cfg.max_steps:
            # As TRL: each key is the mean over the steps since the last log that produced it.
            self.reporter.log(self.global_step, {k: window_value(k, v) for k, v in self._pending.items()})
            self._pending.clear()

    def _finish(self) -> int:
        self.save()
        if self.cfg.save_final_model:
            self.save_final()
        if self.accelerator.is_main_process:
            ckpt.write_complete_marker(self.out, self.global_step, self.cfg.trainer)
        self.accelerator.wait_for_everyone()
        return ckpt.EXIT_OK

    def _gather(self, t: torch.Tensor) -> torch.Tensor:
        acc = self.accelerator
        return acc.gather(t) if acc.num_processes > 1 else t

    def _sync_weights(self, full: bool = False) -> float:
        assert self.backend is not None
        t = time.perf_counter()
        with self.source.weight_push(self.global_step):  # generation ahead: finished or paused around the push
            self.backend.sync_weights(iter_sync_params(self.model, self.accelerator, self.cfg, full=full))
        return time.perf_counter() - t

    def save_final(self) -> None:
        acc = self.accelerator
        final = self.out / "final"
        if self.cfg.peft is not None:
            from launchgen.trainers import lora

            lora.save_final(acc, self.model, self.tokenizer, final, self.cfg.peft.save_merged)
            return
        state = acc.get_state_dict(self.model)
        if acc.is_main_process:
            acc.unwrap_model(self.model).save_pretrained(str(final), state_dict=state, safe_serialization=True)
            self.tokenizer.save_pretrained(str(final))
        acc.wait_for_everyone()

    def close(self) -> None:
        source: BatchSource | None = getattr(self, "source", None)
        if source is not None:
            source.close()
        if self.backend is not None:
            self.backend.close()


def run(cfg: TrainerConfig) -> int:
    """Entry used by `launchgen.trainers.grpo` / `rloo` / `online_dpo` / `sft`; returns the process exit code."""
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    decision = resume.decide(cfg)
    if decision.complete:
        if os.environ.get("RANK", "0") == "0":
            print(decision.note, flush=True)
        return ckpt.EXIT_OK
    trainer = Trainer(cfg)
    # Installed before the (long) model loading so an early USR2/TERM is not fatal; honoured before the first step.
    trainer.signals.install()
    try:
        trainer.setup()
        return trainer.train()
    finally:
        trainer.signals.uninstall()
        trainer.close()
