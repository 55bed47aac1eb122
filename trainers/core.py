"""The online-RL loop shared by GRPO, RLOO and Online DPO: sample -> generate -> score -> advantages -> loss -> step -> sync.

Batch arithmetic follows TRL 1.16. One optimizer step = `gradient_accumulation_steps` (GA) micro-batches of
`per_device_train_batch_size` completions per process. A generation batch holds
`per_device_train_batch_size * num_processes * steps_per_generation` completions (`num_generations` per prompt,
consecutive; a group may span processes) and is used for `steps_per_generation * num_iterations` micro-batches:
every process generates its own slice, rewards are gathered so advantages see whole groups, then each process keeps
its slice, shuffles it and splits it into `steps_per_generation` micro-batches.

Log-probs kept from generation time (no gradient): the policy's ("old") when the batch outlives one optimizer step
(`GA % (steps_per_generation * num_iterations) != 0`), when the vLLM importance-sampling correction is on, and
always for RLOO; the reference model's when `beta != 0` (a frozen copy loaded from the same path).

After every optimizer step the backend receives the full weights (`weights.iter_full_named_params`, walked on every
rank); the plain-generate backend shares the policy and skips it.

Online DPO (`trainer: online_dpo`) runs on the same loop with num_generations = 2: the pair's rows are reordered
chosen-first at generation time, shuffled as pairs (so a pair never spans micro-batches) and scored at temperature 1
as TRL does; the reference model is always loaded. `launchgen.trainers.supervised` reuses the loop for SFT through
the `validate_config` / `load_inputs` / `after_tokenizer` / `needs_reference` / `make_generation_backend` /
`generate_batch` / `micro_loss` methods.
"""

from __future__ import annotations

import json
import math
import os
import time
from collections import defaultdict
from collections.abc import Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from launchgen.trainers import checkpoint as ckpt
from launchgen.trainers import resume
from launchgen.trainers.algorithms import grpo as grpo_alg
from launchgen.trainers.algorithms import online_dpo as dpo_alg
from launchgen.trainers.algorithms import rloo as rloo_alg
from launchgen.trainers.config import TrainerConfig
from launchgen.trainers.data import PromptSampler, build_prompt, is_conversational, load_rows, tokenize_prompt
from launchgen.trainers.errors import TrainerSetupError
from launchgen.trainers.generation.protocol import GenerationBackend, SamplingParams
from launchgen.trainers.rewards import LoadedReward, load_rewards, score
from launchgen.trainers.weights import iter_full_named_params

SUPPORTED = ("grpo", "rloo", "online_dpo")


def validate(cfg: TrainerConfig, num_processes: int) -> None:
    """Cross-field checks that need the process count; messages name the fields and the fix."""
    if cfg.trainer not in SUPPORTED:
        raise TrainerSetupError(f"trainer {cfg.trainer!r} is not run by the online-RL core ({', '.join(SUPPORTED)})")
    spg = int(cfg.steps_per_generation or cfg.gradient_accumulation_steps)
    g = int(cfg.num_generations or 2)
    total = cfg.per_device_train_batch_size * num_processes * spg
    if total % g:
        raise TrainerSetupError(
            f"generation batch = per_device_train_batch_size ({cfg.per_device_train_batch_size}) x processes "
            f"({num_processes}) x steps_per_generation ({spg}) = {total} completions, not divisible by "
            f"num_generations ({g}): change per_device_train_batch_size, steps_per_generation or num_generations"
        )
    if cfg.trainer == "rloo" and g < 2:
        raise TrainerSetupError("num_generations must be >= 2 for rloo (leave-one-out baseline)")
    if cfg.model.use_liger_kernel:
        from launchgen.trainers.modeling import check_liger_compatible

        check_liger_compatible(cfg)


def _mean(values: list[float]) -> float:
    finite = [v for v in values if not math.isnan(v)]
    return sum(finite) / len(finite) if finite else math.nan


def _truncate_metrics(path: Path, step: int) -> None:
    """Drop records of steps after the resumed checkpoint (they are about to be redone), so plots stay single-valued."""
    if not path.is_file():
        return
    kept = []
    for line in path.read_text().splitlines():
        try:
            if int(json.loads(line).get("step", 0)) <= step:
                kept.append(line)
        except (ValueError, TypeError, AttributeError):
            continue  # a line torn by a kill mid-write
    tmp = path.with_suffix(".jsonl.tmp")
    tmp.write_text("".join(x + "\n" for x in kept))
    tmp.replace(path)


def needs_old_logps(trainer: str, use_is: bool, ga: int, spg: int, num_iterations: int) -> bool:
    """TRL's rule: keep generation-time policy log-probs unless the batch is consumed within one optimizer step.

    GRPO omits them when `GA % (SPG * num_iterations) == 0` and IS is off (the policy cannot have changed, so the
    ratio is exp(l - l.detach())); RLOO always carries them (its sequence-level ratio and KL penalty use them);
    Online DPO never uses them (no ratio: its loss compares the policy with the reference only).
    """
    if trainer == "online_dpo":
        return False
    if trainer != "grpo":
        return True
    return use_is or ga % (spg * num_iterations) != 0


def make_backend(cfg: TrainerConfig, accelerator: Any, model: Any, tokenizer: Any) -> GenerationBackend:
    """Backend factory; the vLLM modules are imported only when selected."""
    kind = cfg.generation.backend
    if kind == "hf":
        engine = cfg.generation.hf_engine
        if engine == "auto":
            engine = "static_cache" if _static_cache_fits(cfg, accelerator, model) else "generate"
        if engine == "static_cache":
            from launchgen.trainers.generation.fast_generate import FastGenerateBackend

            return FastGenerateBackend.from_config(cfg, accelerator, model, tokenizer)
        from launchgen.trainers.generation.hf_generate import HFGenerateBackend

        return HFGenerateBackend.from_config(cfg, accelerator, model, tokenizer)
    try:
        if kind == "vllm_server":
            from launchgen.trainers.generation.vllm_server import VLLMServerBackend

            return VLLMServerBackend.from_config(cfg, accelerator)
        from launchgen.trainers.generation.vllm_colocate import VLLMColocateBackend

        # With sleep mode the engine drops its weights; it re-pulls them through this after waking.
        return VLLMColocateBackend.from_config(
            cfg, accelerator, model, named_params_fn=lambda: iter_full_named_params(model, accelerator)
        )
    except ImportError as e:
        if "vllm" in str(e).lower():
            raise TrainerSetupError(
                f"generation.backend {kind} needs vLLM: pip install 'launchgen[vllm]' (or set generation.backend: hf)"
            ) from e
        raise


def _static_cache_fits(cfg: TrainerConfig, accelerator: Any, model: Any) -> bool:
    """The static-cache engine decodes with the trainer's own full weights, so it needs them unsharded
    (DDP or one process) and pays off only where CUDA graphs remove the per-kernel launch cost."""
    try:
        device_type = next(model.parameters()).device.type
    except StopIteration:
        return False
    distributed = str(getattr(accelerator, "distributed_type", "NO"))
    sharded = any(k in distributed for k in ("FSDP", "DEEPSPEED"))
    return device_type == "cuda" and not sharded


def _pad(rows: Sequence[Sequence[float]], value: float, left: bool, dtype: torch.dtype = torch.long) -> torch.Tensor:
    width = max((len(r) for r in rows), default=0)
    out = torch.full((len(rows), width), value, dtype=dtype)
    for i, r in enumerate(rows):
        if r:
            t = torch.tensor(r, dtype=dtype)
            if left:
                out[i, width - len(r) :] = t
            else:
                out[i, : len(r)] = t
    return out


Stat = float | torch.Tensor


def _detached(value: Stat) -> Stat:
    return value.detach().to(torch.float64) if isinstance(value, torch.Tensor) else value


def _extreme(prev: torch.Tensor | None, value: Stat, take_min: bool) -> torch.Tensor:
    """NaN-ignoring running min/max as a float64 tensor on the value's device (no host sync per micro-batch);
    non-finite values count as missing, and a key that only ever saw missing values reduces to nothing."""
    v = torch.as_tensor(_detached(value), dtype=torch.float64).reshape(())
    v = torch.where(torch.isfinite(v), v, torch.full_like(v, math.nan))
    if prev is None:
        return v
    p = prev.to(v.device)
    return torch.fmin(p, v) if take_min else torch.fmax(p, v)


@dataclass
class StepStats:
    """Per-optimizer-step accumulators (local), reduced over processes when logged.

    Values may be device tensors: they are summed on the device and read back once per optimizer step in
    `_reduce_step`, so a micro-batch (or a `max_tokens_per_forward` pass) costs no host round trip.
    """

    loss: Stat = 0.0
    sums: dict[str, Stat] = field(default_factory=dict)
    mins: dict[str, torch.Tensor] = field(default_factory=dict)
    maxs: dict[str, torch.Tensor] = field(default_factory=dict)

    def add(self, key: str, value: Stat) -> None:
        self.sums[key] = self.sums.get(key, 0.0) + _detached(value)

    def add_mean(self, name: str, total: Stat, count: Stat) -> None:
        """Logged as `name` = sum of totals / sum of counts over the step's micro-batches and all processes."""
        self.add(f"mean:{name}:sum", total)
        self.add(f"mean:{name}:n", count)

    def min(self, key: str, value: Stat) -> None:
        self.mins[key] = _extreme(self.mins.get(key), value, take_min=True)

    def max(self, key: str, value: Stat) -> None:
        self.maxs[key] = _extreme(self.maxs.get(key), value, take_min=False)


def _as_f64(value: Stat, device: torch.device) -> torch.Tensor:
    return torch.as_tensor(value, dtype=torch.float64).to(device).reshape(())


class OnlineRLTrainer:
    def __init__(self, cfg: TrainerConfig, accelerator: Any = None) -> None:
        self.cfg = cfg
        self.accelerator = accelerator
        self.backend: GenerationBackend | None = None
        self.signals = ckpt.SignalFlag()

    # ------------------------------------------------------------------------------------------ setup

    def setup(self) -> None:
        from accelerate import Accelerator
        from accelerate.utils import DistributedType, set_seed
        from launchgen.trainers import modeling
        from transformers import get_scheduler

        cfg = self.cfg
        modeling.check_precision(cfg)
        if self.accelerator is None:
            # Without a GPU, `cpu=True` is what makes accelerate form a gloo group across the launched processes
            # (otherwise each process silently trains alone).
            self.accelerator = Accelerator(
                mixed_precision=modeling.accelerate_mixed_precision(cfg), cpu=not torch.cuda.is_available()
            )
        acc = self.accelerator
        self.validate_config(acc.num_processes)
        # before any model is loaded: a checkpoint of another config is refused in seconds, not minutes
        decision = resume.decide(cfg)
        if cfg.max_tokens_per_forward is not None and acc.distributed_type == DistributedType.DEEPSPEED:
            raise TrainerSetupError(
                "max_tokens_per_forward is not supported under DeepSpeed: its engine counts every backward as a "
                "gradient-accumulation step; set it to null and lower per_device_train_batch_size (raising "
                "gradient_accumulation_steps) instead"
            )
        set_seed(cfg.seed, device_specific=True)

        self.G = int(cfg.num_generations or 2)
        self.beta = float(cfg.beta or 0.0)
        self.ga = cfg.gradient_accumulation_steps
        self.spg = int(cfg.steps_per_generation or self.ga)
        self.B = cfg.per_device_train_batch_size
        self.local_gen = self.B * self.spg
        self.global_gen = self.local_gen * acc.num_processes
        self.eps_lo = cfg.epsilon
        self.eps_hi = float(cfg.epsilon_high if cfg.epsilon_high is not None else cfg.epsilon)
        self.is_grpo = cfg.trainer == "grpo"
        self.is_dpo = cfg.trainer == "online_dpo"
        # TRL's online DPO scores completions from the raw logits although it samples at `temperature`.
        self.logp_temperature = 1.0 if self.is_dpo else cfg.generation.temperature
        isc = cfg.generation.importance_sampling
        self.use_is = self.is_grpo and cfg.generation.backend != "hf" and isc.enabled
        self.use_liger = cfg.model.use_liger_kernel and cfg.model.liger_grpo_loss and self.is_grpo
        self.keep_old = needs_old_logps(cfg.trainer, self.use_is, self.ga, self.spg, cfg.num_iterations)

        # Cheap, user-fixable inputs first, so their errors do not wait for a large model to load.
        self.load_inputs()

        self.tokenizer = modeling.load_tokenizer(cfg)
        self.after_tokenizer()
        plan = modeling.resolve_compile(cfg, acc.device.type, str(acc.distributed_type.value))
        self.compiled = plan.layers  # generation must then run the layers eagerly
        model = modeling.load_model(cfg, trainable=True, compile=plan)
        ref = (modeling.load_model(cfg, trainable=False, compile=plan)
               if self.needs_reference() else None)
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
        if acc.distributed_type in (DistributedType.FSDP, DistributedType.DEEPSPEED):
            modeling.get_logp_head(model).fused = False
        self.model, self.optimizer = acc.prepare(model, opt)
        # Not prepared: accelerate's scheduler wrapper steps num_processes times per call; registered for save/load.
        self.scheduler = get_scheduler(
            cfg.lr_scheduler_type, self.optimizer, num_warmup_steps=cfg.warmup_steps, num_training_steps=cfg.max_steps
        )
        acc.register_for_checkpointing(self.scheduler)
        if ref is not None:
            if acc.distributed_type in (DistributedType.FSDP, DistributedType.DEEPSPEED):
                ref = acc.prepare_model(ref, evaluation_mode=True)
            else:
                ref = ref.to(acc.device)
        self.ref_model = ref
        self.liger_loss = modeling.make_liger_grpo_loss(cfg) if self.use_liger else None

        self.backend = self.make_generation_backend()

        self.global_step = 0
        self.micro_step = 0
        self.buffer: list[dict[str, Any]] | None = None
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
        self._tb: Any = None
        if acc.is_main_process and "tensorboard" in cfg.report_to:
            try:
                from torch.utils.tensorboard import SummaryWriter

                self._tb = SummaryWriter(str(self.out / "runs"))
            except ImportError:
                self._tb = None  # tensorboard is optional; metrics.jsonl always has everything

    # Seams for trainers that reuse this loop (`launchgen.trainers.supervised`).

    def validate_config(self, num_processes: int) -> None:
        validate(self.cfg, num_processes)

    def load_inputs(self) -> None:
        self.rows = load_rows(self.cfg.data)
        self.sampler = PromptSampler(len(self.rows), self.cfg.seed, self.cfg.data.shuffle)
        self.rewards: list[LoadedReward] = load_rewards(self.cfg.rewards)
        self.reward_weights = torch.tensor([r.weight for r in self.rewards], dtype=torch.float32)
        self._prompt_cache: dict[int, list[int]] = {}

    def after_tokenizer(self) -> None:
        """Checks that need the tokenizer but not the model (cheap); nothing for the online trainers."""

    def needs_reference(self) -> bool:
        return self.beta != 0.0 or self.is_dpo

    def make_generation_backend(self) -> GenerationBackend:
        return make_backend(self.cfg, self.accelerator, self.model, self.tokenizer)

    def _resume(self, path: Path) -> None:
        state, buffer = ckpt.load_checkpoint(self.accelerator, path)
        self.global_step = int(state["global_step"])
        self.micro_step = int(state["micro_step"])
        self.sampler.load_state_dict(state["sampler"])
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
            "sampler": self.sampler.state_dict(),
            "trainer": self.cfg.trainer,
            resume.STATE_KEY: resume.fingerprint(self.cfg),
        }

    def save(self) -> Path:
        mid_batch = self.micro_step % (self.spg * self.cfg.num_iterations) != 0
        buf = (
            [{k: (v.cpu() if isinstance(v, torch.Tensor) else v) for k, v in mb.items()} for mb in self.buffer]
            if mid_batch and self.buffer is not None
            else None
        )
        return ckpt.save_checkpoint(
            self.accelerator, self.out, self.global_step, self._trainer_state(), buf, self.cfg.save_total_limit
        )

    # ------------------------------------------------------------------------------------------ generation

    def _prompt_ids(self, idx: int) -> list[int]:
        ids = self._prompt_cache.get(idx)
        if ids is None:
            text = build_prompt(self.rows[idx][self.cfg.data.prompt_column], self.tokenizer, self.cfg.data.system_prompt)
            ids = tokenize_prompt(text, self.tokenizer, self.cfg.data.max_prompt_length)
            if not ids:
                raise TrainerSetupError(f"data: prompt at row {idx} is empty after tokenization")
            self._prompt_cache[idx] = ids
        return ids

    def _sampling_params(self) -> SamplingParams:
        g = self.cfg.generation
        return SamplingParams(
            max_tokens=g.max_completion_length,
            temperature=g.temperature,
            top_p=g.top_p,
            top_k=g.top_k,
            min_p=g.min_p,
            repetition_penalty=g.repetition_penalty,
            logprobs=True,
            extra=dict(g.generation_kwargs),
        )

    def _generation_context(self) -> AbstractContextManager[Any]:
        from launchgen.trainers.modeling import eager_layers

        return eager_layers() if self.compiled else nullcontext()

    def rows_per_pass(self, width: int, rows: int) -> int:
        """Rows of `width` tokens one forward pass may take under `max_tokens_per_forward` (at least one)."""
        limit = self.cfg.max_tokens_per_forward
        if limit is None:
            return rows
        return max(1, min(rows, limit // max(1, width)))

    @torch.no_grad()
    def _batched_logps(self, model: Any, t: dict[str, torch.Tensor]) -> torch.Tensor:
        from launchgen.trainers.modeling import per_token_logps

        outs = []
        n = t["prompt_ids"].size(0)
        step = self.rows_per_pass(t["prompt_ids"].size(1) + t["completion_ids"].size(1), self.B)
        for s in range(0, n, step):
            sl = slice(s, s + step)
            # The reference model is not prepared by accelerate: give it the policy's autocast explicitly.
            with self.accelerator.autocast():
                lp, _ = per_token_logps(
                    model,
                    t["prompt_ids"][sl],
                    t["prompt_mask"][sl],
                    t["completion_ids"][sl],
                    t["completion_mask"][sl],
                    self.logp_temperature,
                )
            outs.append(lp)
        return torch.cat(outs, 0)

    def _gather(self, t: torch.Tensor) -> torch.Tensor:
        acc = self.accelerator
        return acc.gather(t) if acc.num_processes > 1 else t

    def generate_batch(self) -> tuple[list[dict[str, Any]], dict[str, float]]:
        cfg, acc = self.cfg, self.accelerator
        assert self.backend is not None
        dev = acc.device
        metrics: dict[str, float] = {}
        t0 = time.perf_counter()
        prompt_idx = self.sampler.take(self.global_gen // self.G)  # identical on every rank
        expanded = [i for i in prompt_idx for _ in range(self.G)]
        rank = acc.process_index
        local_rows = expanded[rank * self.local_gen : (rank + 1) * self.local_gen]
        prompt_ids = [self._prompt_ids(i) for i in local_rows]
        with self._generation_context():
            out = self.backend.generate(prompt_ids, self._sampling_params())
        metrics["time/generate"] = time.perf_counter() - t0

        t1 = time.perf_counter()
        pad = self.tokenizer.pad_token_id
        comp_ids = out.completion_ids
        finished = out.finished if out.finished is not None else [bool(c) and c[-1] == self.tokenizer.eos_token_id for c in comp_ids]
        t: dict[str, Any] = {
            "prompt_ids": _pad(prompt_ids, pad, left=True).to(dev),
            "prompt_mask": _pad([[1] * len(p) for p in prompt_ids], 0, left=True).to(dev),
            "completion_ids": _pad(comp_ids, pad, left=False).to(dev),
            "completion_mask": _pad([[1] * len(c) for c in comp_ids], 0, left=False).to(dev),
        }
        if t["completion_ids"].size(1) == 0:  # every completion empty: keep one masked column so shapes work
            t["completion_ids"] = torch.full((len(comp_ids), 1), pad, dtype=torch.long, device=dev)
            t["completion_mask"] = torch.zeros((len(comp_ids), 1), dtype=torch.long, device=dev)
        truncated = torch.tensor([not f for f in finished], device=dev)
        if cfg.mask_truncated_completions:
            t["completion_mask"] = t["completion_mask"] * (~truncated).unsqueeze(1).long()
        mask = t["completion_mask"]

        # Rewards on this process's completions, then gathered so every rank sees whole groups.
        raw_prompts = [self.rows[i][cfg.data.prompt_column] for i in local_rows]
        texts = self.tokenizer.batch_decode(comp_ids, skip_special_tokens=True)
        completions: list[Any] = [
            [{"role": "assistant", "content": x}] if is_conversational(p) else x
            for p, x in zip(raw_prompts, texts, strict=True)
        ]
        cols = {
            c: [self.rows[i].get(c) for i in local_rows] for c in self.rows[0] if c != cfg.data.prompt_column
        }
        table = score(self.rewards, raw_prompts, completions, comp_ids, cols)
        rpf_local = torch.tensor(table, dtype=torch.float32, device=dev)
        rpf = self._gather(rpf_local)
        rewards = grpo_alg.combine_rewards(rpf, self.reward_weights.to(dev))
        metrics["time/score"] = time.perf_counter() - t1

        t2 = time.perf_counter()
        old = self._batched_logps(self.model, t) if self.keep_old else None
        ref = self._batched_logps(self.ref_model, t) if self.ref_model is not None else None
        if old is not None:
            t["old_logps"] = old
        if ref is not None:
            t["ref_logps"] = ref
        if self.use_is:
            assert old is not None
            if out.logprobs is None:
                raise TrainerSetupError(
                    "generation.importance_sampling.enabled needs per-token log-probs from the backend; "
                    "it returned none (disable the correction or fix the backend)"
                )
            samp_rows = [[math.nan if x is None else float(x) for x in row] for row in out.logprobs]
            samp = _pad(samp_rows, 0, left=False, dtype=torch.float32).to(dev)
            samp = samp[:, : mask.size(1)] if samp.size(1) >= mask.size(1) else torch.nn.functional.pad(samp, (0, mask.size(1) - samp.size(1)))
            isc = cfg.generation.importance_sampling
            res = grpo_alg.importance_sampling_ratio(
                old, samp, mask, isc.mode, isc.clip_min, isc.clip_max, isc.sequence_reduction
            )
            t["is_ratio"] = res.ratio
            metrics["sampling/sampling_logp_difference/mean"] = self._gather(res.logp_diff_mean.reshape(1)).mean().item()
            metrics["sampling/sampling_logp_difference/max"] = self._gather(res.logp_diff_max.reshape(1)).max().item()
            metrics["sampling/importance_sampling_ratio/min"] = self._gather(res.ratio_min.reshape(1)).min().item()
            metrics["sampling/importance_sampling_ratio/mean"] = self._gather(res.ratio_mean.reshape(1)).mean().item()
            metrics["sampling/importance_sampling_ratio/max"] = self._gather(res.ratio_max.reshape(1)).max().item()

        # Advantages over the whole generation batch, then this process's slice.
        sl = slice(rank * self.local_gen, (rank + 1) * self.local_gen)
        adv: grpo_alg.Advantages | rloo_alg.RLOOAdvantages | None = None
        if self.is_grpo:
            adv = grpo_alg.grpo_advantages(rewards, self.G, cfg.scale_rewards)
        elif self.is_dpo:
            # local_gen is even (per_device_train_batch_size is), so this process's rows hold whole pairs.
            pairs = dpo_alg.pair_preferences(rewards)
            local_order = pairs.order[sl] - rank * self.local_gen
            for key, val in list(t.items()):
                if isinstance(val, torch.Tensor) and val.dim() > 0 and val.size(0) == self.local_gen:
                    t[key] = val[local_order]
            t["rewards"] = rewards[pairs.order][sl]
            half = self.local_gen // 2
            t["pair_weights"] = pairs.weights[rank * half : (rank + 1) * half].repeat_interleave(2)
            metrics["objective/scores"] = torch.nanmean(rewards).item()
            metrics["objective/scores_margin"] = torch.nanmean(pairs.chosen_rewards - pairs.rejected_rewards).item()
            metrics["objective/tied_pairs"] = 1.0 - pairs.weights.mean().item()
            metrics["frac_reward_zero_std"] = metrics["objective/tied_pairs"]
            metrics["beta"] = self.beta
        else:
            kl_local = None
            if self.beta != 0.0:
                assert old is not None and ref is not None
                kl_local = ((old - ref) * mask).sum(-1)
                kl_stats = torch.stack([((old - ref) * mask).sum(), mask.sum().float()])
                if acc.num_processes > 1:
                    kl_stats = acc.reduce(kl_stats, reduction="sum")
                metrics["kl"] = (kl_stats[0] / kl_stats[1].clamp(min=1.0)).item()
            pen = rewards
            if cfg.reward_clip_range is not None:
                pen = pen.clamp(min=cfg.reward_clip_range[0], max=cfg.reward_clip_range[1])
            if kl_local is not None:
                pen = pen - self.beta * self._gather(kl_local)
            adv = rloo_alg.rloo_advantages(pen, self.G, cfg.normalize_advantages)
            assert old is not None
            t["old_seq_logps"] = (old * mask).sum(1)
        if adv is not None:
            t["advantages"] = adv.advantages[sl]
        metrics["time/score"] += time.perf_counter() - t2
        n_items = self._gather(mask.sum().reshape(1).float()).sum()
        t["num_items_in_batch"] = n_items

        # Logged statistics (TRL's names).
        lengths = self._gather(torch.tensor([len(c) for c in comp_ids], device=dev, dtype=torch.float32))
        trunc_all = self._gather(truncated.float())
        metrics["completions/mean_length"] = lengths.mean().item()
        metrics["completions/min_length"] = lengths.min().item()
        metrics["completions/max_length"] = lengths.max().item()
        metrics["completions/clipped_ratio"] = trunc_all.mean().item()
        if self.is_dpo:
            metrics["val/contain_eos_token"] = 1.0 - trunc_all.mean().item()
        term = lengths[trunc_all == 0]
        if term.numel():
            metrics["completions/mean_terminated_length"] = term.mean().item()
        for k, r in enumerate(self.rewards):
            col = rpf[:, k]
            metrics[f"rewards/{r.name}/mean"] = torch.nanmean(col).item()
            metrics[f"rewards/{r.name}/std"] = grpo_alg.nanstd(col).item()
        metrics["reward"] = torch.nanmean(rewards).item()
        metrics["reward_std"] = grpo_alg.nanstd(rewards).item()
        if adv is not None:
            metrics["frac_reward_zero_std"] = adv.std_is_zero.float().mean().item()

        # Shuffle this process's rows (Online DPO: its pairs) and split into steps_per_generation micro-batches.
        if self.is_dpo:
            pp = torch.randperm(self.local_gen // 2)
            perm = torch.stack([2 * pp, 2 * pp + 1], dim=1).reshape(-1).to(dev)
        else:
            perm = torch.randperm(self.local_gen).to(dev)
        batches = []
        for s in range(self.spg):
            idx = perm[s * self.B : (s + 1) * self.B]
            mb = {k: (v[idx] if isinstance(v, torch.Tensor) and v.dim() > 0 else v) for k, v in t.items()}
            batches.append(mb)
        return batches, metrics

    # ------------------------------------------------------------------------------------------ loss

    #: Per-row tensors aligned with the completion columns: a pass keeps only as many columns as its longest row.
    PASS_TRIM_KEYS: tuple[str, ...] = ("completion_ids", "completion_mask", "old_logps", "ref_logps", "is_ratio")

    def split_passes(self, mb: dict[str, Any]) -> list[tuple[dict[str, Any], Stat]]:
        """The micro-batch as forward/backward passes of at most `max_tokens_per_forward` tokens, each with the
        factor that turns its loss (normalised over the pass) into its share of the micro-batch's loss, so the
        summed gradient is the micro-batch's.

        Rows (Online DPO: pairs) are sorted by length, longest first, and packed greedily; each pass drops the
        right padding beyond its longest row (causal attention: the kept positions compute exactly what they did
        with it). Scalars are kept as they are.
        """
        limit = self.cfg.max_tokens_per_forward
        rows = self.batch_rows(mb)
        if limit is None or rows * self.row_width(mb) <= limit:
            return [(mb, 1.0)]
        row_lengths = self.row_lengths(mb)
        lengths = row_lengths.tolist()  # one host sync per micro-batch, only when passes are on
        unit = 2 if self.is_dpo else 1  # a (chosen, rejected) pair never spans passes
        units = [list(range(i, min(i + unit, rows))) for i in range(0, rows, unit)]
        units.sort(key=lambda u: -max(lengths[r] for r in u))  # stable: ties keep their order
        fixed = self.row_width(mb) - self.trim_width(mb)
        groups: list[list[int]] = []
        width = 0
        for u in units:
            u_width = fixed + max(1, max(lengths[r] for r in u))
            if groups and (len(groups[-1]) + len(u)) * width <= limit:
                groups[-1].extend(u)
            else:
                groups.append(list(u))
                width = u_width  # the first unit of a pass is its widest
        parts: list[tuple[dict[str, Any], Stat]] = []
        for g in groups:
            idx = torch.tensor(sorted(g), dtype=torch.long, device=row_lengths.device)
            keep = max(1, max(lengths[r] for r in g))
            part: dict[str, Any] = {}
            for k, v in mb.items():
                if isinstance(v, torch.Tensor) and v.dim() > 0:
                    v = v.index_select(0, idx)
                    if k in self.PASS_TRIM_KEYS and v.dim() == 2:
                        v = v[:, :keep]
                part[k] = v
            parts.append((part, self.loss_share(part, mb)))
        return parts

    def row_lengths(self, mb: dict[str, Any]) -> torch.Tensor:
        """Tokens of each row that a pass must keep in the trimmable columns."""
        return mb["completion_mask"].sum(1)

    def trim_width(self, mb: dict[str, Any]) -> int:
        return int(mb["completion_ids"].size(1))

    def batch_rows(self, mb: dict[str, Any]) -> int:
        return int(mb["completion_ids"].size(0))

    def row_width(self, mb: dict[str, Any]) -> int:
        return int(mb["prompt_ids"].size(1) + mb["completion_ids"].size(1))

    def loss_share(self, part: dict[str, Any], mb: dict[str, Any]) -> Stat:
        """What `micro_loss(part)` is multiplied by; follows each loss's normaliser (see grpo.normalize_loss)."""
        if self.is_grpo and self.cfg.loss_type == "dapo":
            return 1.0  # normalised by the whole generation batch's token count already
        if self.is_grpo and self.cfg.loss_type == "bnpo":
            return part["completion_mask"].sum().float() / mb["completion_mask"].sum().float().clamp(min=1.0)
        # grpo / dr_grpo (per-sequence terms over rows), RLOO (mean over rows), Online DPO (mean over pairs)
        return self.batch_rows(part) / self.batch_rows(mb)

    def micro_loss(self, mb: dict[str, Any], stats: StepStats) -> torch.Tensor:
        from launchgen.trainers.modeling import liger_grpo_loss, per_token_logps

        cfg = self.cfg
        mask = mb["completion_mask"]
        adv = mb.get("advantages")  # none for Online DPO
        if self.use_liger:
            n_items = mb["num_items_in_batch"]
            loss, lmetrics = liger_grpo_loss(
                self.model,
                self.liger_loss,
                mb["prompt_ids"],
                mb["prompt_mask"],
                mb["completion_ids"],
                mask,
                advantages=adv,
                ref_per_token_logps=mb.get("ref_logps"),
                old_per_token_logps=mb.get("old_logps"),
                vllm_is_ratio=mb.get("is_ratio"),
                # Liger divides by num_items / world_size; TRL's dapo also multiplies by GA / SPG.
                num_items_in_batch=(n_items * self.ga / self.spg) if cfg.loss_type == "dapo" else None,
            )
            if cfg.loss_type != "dapo":
                loss = loss / self.ga
            tokens = mask.sum().to(torch.float64)
            if self.beta != 0.0 and lmetrics:
                stats.add("kl_sum", lmetrics[0].detach().to(torch.float64) * tokens)
                stats.add("kl_count", tokens)
            if lmetrics:
                stats.add("clip_region_sum", lmetrics[-1].detach().to(torch.float64) * tokens)
                stats.add("clip_count", tokens)
            return loss

        logps, entropy = per_token_logps(
            self.model, mb["prompt_ids"], mb["prompt_mask"], mb["completion_ids"], mask, self.logp_temperature
        )
        m = mask.float()
        stats.add("entropy_sum", (entropy * m).sum())
        stats.add("entropy_count", m.sum())
        if self.is_dpo:
            return self._dpo_micro_loss(mb, logps, m, stats)
        assert adv is not None
        if self.is_grpo:
            ptl = grpo_alg.grpo_per_token_loss(
                logps,
                adv,
                old_logps=mb.get("old_logps"),
                ref_logps=mb.get("ref_logps"),
                epsilon_low=self.eps_lo,
                epsilon_high=self.eps_hi,
                beta=self.beta,
                use_bias_correction_kl=cfg.use_bias_correction_kl,
                is_ratio=mb.get("is_ratio"),
            )
            loss = grpo_alg.normalize_loss(
                ptl.loss,
                mask,
                cfg.loss_type,
                gradient_accumulation_steps=self.ga,
                max_completion_length=cfg.generation.max_completion_length,
                num_items_in_batch=mb["num_items_in_batch"],
                num_processes=self.accelerator.num_processes,
                steps_per_generation=self.spg,
            )
            if ptl.kl is not None:
                stats.add("kl_sum", (ptl.kl.detach() * m).sum())
                stats.add("kl_count", m.sum())
            cs = grpo_alg.clip_stats(ptl.ratio.detach(), adv, mask, self.eps_lo, self.eps_hi)
            stats.add("clip_low_sum", cs.low)
            stats.add("clip_high_sum", cs.high)
            stats.add("clip_region_sum", cs.region)
            stats.add("clip_count", cs.count)
            stats.min("clip_ratio/low_min", cs.low_seq_min)
            stats.max("clip_ratio/high_max", cs.high_seq_max)
            return loss
        rl = rloo_alg.rloo_loss(logps, mask, mb["old_seq_logps"], adv, self.eps_lo, self.eps_hi)
        r = rl.ratio.detach()
        low = ((r < 1 - self.eps_lo) & (adv < 0)).float()
        high = ((r > 1 + self.eps_hi) & (adv > 0)).float()
        stats.add("clip_low_sum", low.sum())
        stats.add("clip_high_sum", high.sum())
        stats.add("clip_region_sum", torch.maximum(low, high).sum())
        stats.add("clip_count", float(r.numel()))
        return rl.loss / self.ga  # TRL's Trainer divides RLOO's loss by GA before backward

    def _dpo_micro_loss(
        self, mb: dict[str, Any], logps: torch.Tensor, m: torch.Tensor, stats: StepStats
    ) -> torch.Tensor:
        """Rows are (chosen, rejected) pairs in order; TRL's metric names (means over pairs / completions)."""
        seq = (logps * m).sum(1)
        ref_seq = (mb["ref_logps"] * m).sum(1)
        res = dpo_alg.dpo_loss(
            seq[0::2], seq[1::2], ref_seq[0::2], ref_seq[1::2], self.beta, self.cfg.loss_type, mb["pair_weights"][0::2]
        )
        n_pairs = float(res.losses.numel())
        margins = res.chosen_rewards - res.rejected_rewards
        with torch.no_grad():
            kl = seq.detach() - ref_seq
            rows = float(kl.numel())
            rlhf = mb["rewards"] - self.beta * kl
            finite = ~torch.isnan(rlhf)
        for name, total, count in (
            ("rewards/chosen", res.chosen_rewards.sum(), n_pairs),
            ("rewards/rejected", res.rejected_rewards.sum(), n_pairs),
            ("rewards/margins", margins.sum(), n_pairs),
            ("rewards/accuracies", (margins > 0).float().sum(), n_pairs),
            ("logps/chosen", seq[0::2].detach().sum(), n_pairs),
            ("logps/rejected", seq[1::2].detach().sum(), n_pairs),
            ("objective/kl", kl.sum(), rows),
            ("objective/non_score_reward", -self.beta * kl.sum(), rows),
            ("objective/rlhf_reward", torch.where(finite, rlhf, 0.0).sum(), finite.sum()),
            ("objective/entropy", -seq.detach().sum(), rows),
        ):
            stats.add_mean(name, total, count)
        return res.loss / self.ga  # TRL's Trainer divides the mean pair loss by GA before backward

    # ------------------------------------------------------------------------------------------ loop

    def _reduce_step(self, stats: StepStats) -> dict[str, float]:
        acc = self.accelerator
        keys = sorted(stats.sums)
        vals = torch.stack([_as_f64(stats.loss, acc.device)] + [_as_f64(stats.sums[k], acc.device) for k in keys])
        if acc.num_processes > 1:
            vals = acc.reduce(vals, reduction="sum")
        summed = dict(zip(keys, vals[1:].tolist(), strict=True))
        out: dict[str, float] = {"loss": vals[0].item() / acc.num_processes}

        def ratio(num: str, den: str) -> float | None:
            if num not in summed or den not in summed:
                return None
            return summed[num] / max(summed[den], 1.0)

        for name, num, den in (
            ("entropy", "entropy_sum", "entropy_count"),
            ("kl", "kl_sum", "kl_count"),
            ("clip_ratio/low_mean", "clip_low_sum", "clip_count"),
            ("clip_ratio/high_mean", "clip_high_sum", "clip_count"),
            ("clip_ratio/region_mean", "clip_region_sum", "clip_count"),
        ):
            v = ratio(num, den)
            if v is not None:
                out[name] = v
        for key in keys:
            if key.startswith("mean:") and key.endswith(":sum"):
                name = key[len("mean:") : -len(":sum")]
                count = summed.get(f"mean:{name}:n", 0.0)
                out[name] = summed[key] / count if count > 0 else math.nan
        for key, store, red in (("clip_ratio/low_min", stats.mins, "min"), ("clip_ratio/high_max", stats.maxs, "max")):
            if key in store or (self.is_grpo and not self.use_liger):
                local = _as_f64(store.get(key, math.nan), acc.device).reshape(1)
                allv = self._gather(local)
                allv = allv[~torch.isnan(allv)]
                if allv.numel():
                    out[key] = (allv.min() if red == "min" else allv.max()).item()
        return out

    def train(self) -> int:
        if self.backend is None:
            self.setup()
        cfg, acc = self.cfg, self.accelerator
        assert self.backend is not None
        if not self.signals.installed:
            self.signals.install()
        metrics_path = self.out / "metrics.jsonl"
        self._pending: dict[str, list[float]] = defaultdict(list)
        if self.resumed_from is not None and acc.is_main_process:
            _truncate_metrics(metrics_path, self.global_step)
        bar = None
        if acc.is_main_process:
            try:
                from tqdm.auto import tqdm

                bar = tqdm(total=cfg.max_steps, initial=self.global_step, desc=cfg.trainer, dynamic_ncols=True)
            except ImportError:
                bar = None
        sync_needed = cfg.generation.backend != "hf"
        try:
            if sync_needed and self.resumed_from is not None:
                # A requeued job's vLLM engine starts from the base weights: push the resumed ones first.
                self._sync_weights()
            generate_every = self.spg * cfg.num_iterations
            while self.global_step < cfg.max_steps:
                # Checked before each step (so also right after setup, where loading can take minutes): after the
                # last step the run is complete and a late signal changes nothing.
                if self.signals.any_rank(acc):
                    self.save()
                    if acc.is_main_process:
                        print(
                            f"[launchgen] signal received: checkpoint-{self.global_step} written to {self.out}; "
                            f"exiting {ckpt.EXIT_PREEMPTED} so the job is requeued",
                            flush=True,
                        )
                    return ckpt.EXIT_PREEMPTED
                stats = StepStats()
                step_metrics: dict[str, float] = {}
                t_train = 0.0
                self.model.train()
                for k in range(self.ga):
                    if self.micro_step % generate_every == 0 or self.buffer is None:
                        self.buffer, gen_metrics = self.generate_batch()
                        step_metrics.update(gen_metrics)
                    mb = self.buffer[self.micro_step % self.spg]
                    ts = time.perf_counter()
                    passes = self.split_passes(mb)
                    for j, (part, share) in enumerate(passes):
                        last = k == self.ga - 1 and j == len(passes) - 1
                        with acc.no_sync(self.model) if not last else nullcontext():
                            loss = self.micro_loss(part, stats)
                            if len(passes) > 1:
                                loss = loss * share
                            acc.backward(loss)
                        stats.loss = stats.loss + loss.detach().to(torch.float64)
                    t_train += time.perf_counter() - ts
                    self.micro_step += 1
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
                if sync_needed:
                    step_metrics["time/sync_weights"] = self._sync_weights()
                step_metrics.update(self._reduce_step(stats))
                if grad_norm is not None:
                    step_metrics["grad_norm"] = float(grad_norm)
                step_metrics["learning_rate"] = lr
                step_metrics["time/train"] = t_train
                step_metrics["epoch"] = self.sampler.epoch + self.sampler.index / max(1, self.sampler.n)
                for key, value in step_metrics.items():
                    self._pending[key].append(value)
                if self.global_step % cfg.logging_steps == 0 or self.global_step == cfg.max_steps:
                    # As TRL: each key is the mean over the steps since the last log that produced it.
                    self._log(metrics_path, {k: _mean(v) for k, v in self._pending.items()})
                    self._pending.clear()
                if bar is not None:
                    if "reward" in step_metrics:
                        bar.set_postfix(reward=f"{step_metrics['reward']:.3f}", loss=f"{step_metrics['loss']:.4g}", refresh=False)
                    elif cfg.trainer == "sft":
                        bar.set_postfix(loss=f"{step_metrics['loss']:.4g}", refresh=False)
                    bar.update(1)
                if cfg.save_steps and self.global_step % cfg.save_steps == 0 and self.global_step < cfg.max_steps:
                    self.save()
            self.save()
            if cfg.save_final_model:
                self.save_final()
            if acc.is_main_process:
                ckpt.write_complete_marker(self.out, self.global_step, cfg.trainer)
            acc.wait_for_everyone()
            return ckpt.EXIT_OK
        finally:
            if bar is not None:
                bar.close()
            if self._tb is not None:
                self._tb.close()
            self.signals.uninstall()

    def _sync_weights(self) -> float:
        assert self.backend is not None
        t = time.perf_counter()
        self.backend.sync_weights(iter_full_named_params(self.model, self.accelerator))
        return time.perf_counter() - t

    def _log(self, path: Path, metrics: dict[str, float]) -> None:
        if not self.accelerator.is_main_process:
            return
        rec = {"step": self.global_step, **{k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in metrics.items()}}
        with path.open("a") as f:
            f.write(json.dumps(rec) + "\n")
        if self._tb is not None:
            for k, v in metrics.items():
                if isinstance(v, (int, float)) and not math.isnan(v):
                    self._tb.add_scalar(k, v, self.global_step)

    def save_final(self) -> None:
        acc = self.accelerator
        final = self.out / "final"
        state = acc.get_state_dict(self.model)
        if acc.is_main_process:
            acc.unwrap_model(self.model).save_pretrained(str(final), state_dict=state, safe_serialization=True)
            self.tokenizer.save_pretrained(str(final))
        acc.wait_for_everyone()

    def close(self) -> None:
        if self.backend is not None:
            self.backend.close()


def run(cfg: TrainerConfig, trainer_cls: type[OnlineRLTrainer] | None = None) -> int:
    """Entry used by `launchgen.trainers.grpo` / `rloo` / `online_dpo` (and `sft` with its own class);
    returns the process exit code."""
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    decision = resume.decide(cfg)
    if decision.complete:
        if os.environ.get("RANK", "0") == "0":
            print(decision.note, flush=True)
        return ckpt.EXIT_OK
    trainer = (trainer_cls or OnlineRLTrainer)(cfg)
    # Installed before the (long) model loading so an early USR2/TERM is not fatal; honoured before the first step.
    trainer.signals.install()
    try:
        trainer.setup()
        return trainer.train()
    finally:
        trainer.signals.uninstall()
        trainer.close()


def apply_override(data: dict[str, Any], item: str) -> None:
    """`a.b.c=value` into the nested mapping; the value is YAML (so `8001` is an int, `'x'` a string)."""
    import yaml

    key, sep, raw = item.partition("=")
    if not sep or not key.strip():
        raise ValueError(f"--set {item!r}: expected KEY=VALUE")
    parts = key.strip().split(".")
    node = data
    for part in parts[:-1]:
        nxt = node.setdefault(part, {})
        if not isinstance(nxt, dict):
            raise ValueError(f"--set {item!r}: {part} is not a mapping")
        node = nxt
    node[parts[-1]] = yaml.safe_load(raw) if raw.strip() else None


def entry(argv: list[str] | None, trainer: str, trainer_cls: type[OnlineRLTrainer] | None = None) -> int:
    """`python -m launchgen.trainers.<trainer> --config run.yaml`: config errors are one line and exit 2."""
    import argparse
    import sys

    import yaml
    from pydantic import ValidationError

    p = argparse.ArgumentParser(prog=f"python -m launchgen.trainers.{trainer}")
    p.add_argument("--config", required=True, help="resolved trainer config (YAML), see launchgen.trainers.config")
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override one field (dotted path, e.g. generation.vllm_server.port=8001; the value is parsed as YAML); "
        "repeatable, applied in order before validation",
    )
    a = p.parse_args(argv)
    try:
        data = yaml.safe_load(Path(a.config).read_text())
        if not isinstance(data, dict):
            raise ValueError("expected a mapping at the top level")
        for item in a.set:
            apply_override(data, item)
        cfg = TrainerConfig.model_validate(data)
    except ValidationError as e:
        errs = e.errors()
        loc = ".".join(str(x) for x in errs[0]["loc"]) or "(top level)"
        more = f" (+{len(errs) - 1} more)" if len(errs) > 1 else ""
        print(f"error: {a.config}: {loc}: {errs[0]['msg']}{more}", file=sys.stderr)
        return ckpt.EXIT_CONFIG
    except (OSError, ValueError, yaml.YAMLError) as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        print(f"error: {a.config}: {first}", file=sys.stderr)
        return ckpt.EXIT_CONFIG
    try:
        if cfg.trainer != trainer:
            raise TrainerSetupError(
                f"{a.config}: trainer is {cfg.trainer!r} but this is launchgen.trainers.{trainer}; "
                f"run python -m launchgen.trainers.{cfg.trainer} or fix `trainer`"
            )
        return run(cfg, trainer_cls)
    except TrainerSetupError as e:
        print(f"error: {e}", file=sys.stderr)
        return ckpt.EXIT_CONFIG
