"""One generation batch of the online-RL trainers: sample prompts, generate, score, gather, log-probs, importance
sampling; the objective then adds its training columns (`RLObjective.prepare`), and the rows are shuffled and
split into `steps_per_generation` micro-batches.

Every process generates its own slice of the batch; rewards are gathered so advantages see whole groups (a group
may span processes), then each process keeps its slice. Log-probs kept from generation time carry no gradient:
the policy's ("old") when the objective keeps them, the reference model's when it has one.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import Any, cast

import torch
from launchgen.trainers import async_rollout
from launchgen.trainers.algorithms import grpo as grpo_alg
from launchgen.trainers.data import (
    PromptSampler,
    build_prompt,
    is_conversational,
    load_rows,
    pad_rows,
    tokenize_prompt,
)
from launchgen.trainers.declarations.errors import TrainerSetupError
from launchgen.trainers.declarations.rewards import LoadedReward, load_rewards, score
from launchgen.trainers.generation import backends
from launchgen.trainers.generation.protocol import GenerationBackend, GenerationOutput, SamplingParams
from launchgen.trainers.objectives.base import Batch, RLObjective, ScoredRollout
from launchgen.trainers.passes import RowLayout, rows_per_pass

#: Prompts are left-padded (kept whole); completions right-padded, so a pass keeps only its longest row's columns.
RL_LAYOUT = RowLayout(
    ids_key="completion_ids", mask_key="completion_mask", fixed_key="prompt_ids", fixed_mask_key="prompt_mask",
    trim_keys=("completion_ids", "completion_mask", "old_logps", "ref_logps", "is_ratio", "sampling_logps"),
)


class Rollout:
    """The online-RL trainers' batch source (`objectives.base.BatchSource`)."""

    layout = RL_LAYOUT
    progress_keys = ("reward", "loss")

    def __init__(self, objective: RLObjective, accelerator: Any) -> None:
        self.objective, self.accelerator = objective, accelerator
        cfg = self.cfg = objective.cfg
        self.geometry = objective.geometry
        self.needs_weight_sync = backends.capabilities(cfg).needs_weight_sync
        self.backend: GenerationBackend | None = None
        #: Generates the next batches on a thread while the current one trains (max_staleness >= 1), else None.
        self.ahead: async_rollout.AheadGenerator | None = None
        self._version = 0  # optimizer steps in the weights the server holds
        self.rows = load_rows(cfg.data)
        self.sampler = PromptSampler(len(self.rows), cfg.seed, cfg.data.shuffle)
        self.rewards: list[LoadedReward] = load_rewards(cfg.rewards, accelerator.device)
        self.reward_weights = torch.tensor([r.weight for r in self.rewards], dtype=torch.float32)
        self._prompt_cache: dict[int, list[int]] = {}
        #: Prompt + completion tokens generated so far, all processes (TRL's num_input_tokens_seen: `num_tokens`).
        self.num_tokens = 0
        self.rows_per_batch = self.geometry.global_gen // self.geometry.G  # prompts one generation batch draws

    def after_tokenizer(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer

    def start(self, model: Any, ref_model: Any, compiled_layers: bool) -> None:
        self.model, self.ref_model = model, ref_model
        self.compiled_layers = compiled_layers  # generation must then run the layers eagerly
        self.backend = backends.make_backend(self.cfg, self.accelerator, model, self.tokenizer)
        g = self.cfg.generation
        if g.max_staleness:
            if not backends.capabilities(self.cfg).generates_ahead:
                raise TrainerSetupError(f"generation.max_staleness needs a backend that generates ahead, not {g.backend}")
            acc = self.accelerator
            self.ahead = async_rollout.AheadGenerator(
                cast(async_rollout.AheadBackend, self.backend),  # generates_ahead: it has request_all / share
                self._sampling_params(), is_main=bool(acc.is_main_process), process_index=int(acc.process_index),
                in_flight_at_push=g.in_flight_at_push,
            )

    def state_dict(self) -> dict[str, Any]:
        # A synchronous run's state is unchanged; an async one first finishes and records what is in flight.
        state: dict[str, Any] = {"sampler": self.sampler.state_dict(), "num_tokens": self.num_tokens}
        if self.ahead is not None:
            state["ahead"] = self.ahead.state_dict()
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.sampler.load_state_dict(state["sampler"])
        self.num_tokens = int(state.get("num_tokens", 0))  # checkpoints before the counter existed start at 0
        self._version = int(state.get("global_step", 0))
        if self.ahead is not None:
            if "ahead" in state:
                self.ahead.load_state_dict(state["ahead"])
            else:  # a synchronous checkpoint (resume: force): continue after the batches it already took
                self.ahead.next_index = -(-int(state.get("micro_step", 0)) // self.geometry.generate_every)

    @contextmanager
    def weight_push(self, version: int) -> Iterator[None]:
        """Around the push of the weights after `version` optimizer steps: in-flight generation is finished or
        paused first, and the batches those weights are to generate are submitted after."""
        if self.ahead is None:
            yield
            return
        with self.ahead.around_push():
            yield
        self._version = version
        self._schedule()

    def close(self) -> None:
        if self.ahead is not None:
            self.ahead.close()

    # ------------------------------------------------------------------------------------------ generating ahead

    def _schedule(self) -> None:
        """Submit every batch the server's current weights are to generate (`async_rollout.target_version`)."""
        a, g = self.ahead, self.geometry
        assert a is not None
        k = self.cfg.generation.max_staleness
        while True:
            j = a.next_index
            if async_rollout.consume_step(j, g.generate_every, g.ga) >= self.cfg.max_steps:
                return  # never trained on
            if async_rollout.target_version(j, g.generate_every, g.ga, k) > self._version:
                return
            rows = self._global_rows()
            rank = self.accelerator.process_index
            local = rows[rank * g.local_gen : (rank + 1) * g.local_gen]
            all_prompts = [self._prompt_ids(i) for i in rows] if self.accelerator.is_main_process else None
            a.submit(async_rollout.Job(j, self._version, local, all_prompts))

    def _next_ahead(self) -> tuple[list[Batch], dict[str, float]]:
        a, g = self.ahead, self.geometry
        assert a is not None
        if a.pending == 0:
            self._schedule()  # the first batch of a fresh run: what the initial weights generate
        metrics: dict[str, float] = {}
        t0 = time.perf_counter()
        job, out = a.take(g.local_gen)
        metrics["time/generate"] = time.perf_counter() - t0  # the wait: generation not hidden behind training
        staleness = async_rollout.consume_step(job.index, g.generate_every, g.ga) - job.version
        if not 0 <= staleness <= self.cfg.generation.max_staleness:
            raise RuntimeError(f"async generation: batch {job.index} is {staleness} steps old "
                               f"(max_staleness {self.cfg.generation.max_staleness})")
        metrics["async/staleness"] = float(staleness)
        prompt_ids = [self._prompt_ids(i) for i in job.local_rows]
        return self._finish(job.local_rows, prompt_ids, out, metrics)

    # ------------------------------------------------------------------------------------------ one batch

    def next_batches(self) -> tuple[list[Batch], dict[str, float]]:
        if self.ahead is not None:
            return self._next_ahead()
        metrics: dict[str, float] = {}
        t0 = time.perf_counter()
        local_rows = self._local_rows()
        prompt_ids = [self._prompt_ids(i) for i in local_rows]
        assert self.backend is not None
        with self._generation_context():
            out = self.backend.generate(prompt_ids, self._sampling_params())
        metrics["time/generate"] = time.perf_counter() - t0
        return self._finish(local_rows, prompt_ids, out, metrics)

    def _finish(
        self, local_rows: list[int], prompt_ids: list[list[int]], out: GenerationOutput, metrics: dict[str, float]
    ) -> tuple[list[Batch], dict[str, float]]:
        """Score, gather, log-probs, importance sampling, the objective's columns, metrics, split."""
        t1 = time.perf_counter()
        t, truncated = self._tensors(prompt_ids, out)
        mask = t["completion_mask"]
        rpf, rewards = self._score(local_rows, out.completion_ids)
        metrics["time/score"] = time.perf_counter() - t1

        t2 = time.perf_counter()
        old, ref = self._generation_logps(t)
        obj = self.objective
        wants_samp = obj.uses_importance_sampling or obj.keeps_sampling_logps
        samp = self._sampling_logps(out, mask) if wants_samp and out.logprobs is not None else None
        if obj.uses_importance_sampling:
            assert old is not None
            t["is_ratio"] = self._importance_sampling(old, samp, mask, metrics)
        if obj.keeps_sampling_logps and samp is not None:
            t["sampling_logps"] = samp
        trunc_all = self._gather(truncated.float())
        scored = ScoredRollout(t, rewards, old, ref, mask, trunc_all, self.accelerator.process_index, metrics,
                               self.accelerator, self._gather, rpf, self.reward_weights.to(rpf.device))
        std_is_zero = self.objective.prepare(scored)
        metrics["time/score"] += time.perf_counter() - t2
        t["num_items_in_batch"] = self._gather(mask.sum().reshape(1).float()).sum()
        self._completion_metrics(prompt_ids, out.completion_ids, trunc_all, metrics)
        self._reward_metrics(rpf, rewards, std_is_zero, metrics)
        return self._split(t), metrics

    def _global_rows(self) -> list[int]:
        """Every process's prompt rows of the next generation batch (identical on every rank)."""
        g = self.geometry
        prompt_idx = self.sampler.take(g.global_gen // g.G)
        return [i for i in prompt_idx for _ in range(g.G)]

    def _local_rows(self) -> list[int]:
        g = self.geometry
        rank = self.accelerator.process_index
        return self._global_rows()[rank * g.local_gen : (rank + 1) * g.local_gen]

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
            max_tokens=g.max_completion_length, temperature=g.temperature, top_p=g.top_p, top_k=g.top_k,
            min_p=g.min_p, repetition_penalty=g.repetition_penalty, logprobs=True, extra=dict(g.generation_kwargs),
        )

    def _generation_context(self) -> AbstractContextManager[Any]:
        from launchgen.trainers.modeling import eager_layers

        return eager_layers() if self.compiled_layers else nullcontext()

    def _tensors(self, prompt_ids: list[list[int]], out: GenerationOutput) -> tuple[Batch, torch.Tensor]:
        """Padded prompt and completion tensors on the device, and which completions hit the length limit."""
        dev = self.accelerator.device
        pad = self.tokenizer.pad_token_id
        comp_ids = out.completion_ids
        eos = self.tokenizer.eos_token_id
        finished = out.finished if out.finished is not None else [bool(c) and c[-1] == eos for c in comp_ids]
        t: Batch = {
            "prompt_ids": pad_rows(prompt_ids, pad, left=True).to(dev),
            "prompt_mask": pad_rows([[1] * len(p) for p in prompt_ids], 0, left=True).to(dev),
            "completion_ids": pad_rows(comp_ids, pad, left=False).to(dev),
            "completion_mask": pad_rows([[1] * len(c) for c in comp_ids], 0, left=False).to(dev),
        }
        if t["completion_ids"].size(1) == 0:  # every completion empty: keep one masked column so shapes work
            t["completion_ids"] = torch.full((len(comp_ids), 1), pad, dtype=torch.long, device=dev)
            t["completion_mask"] = torch.zeros((len(comp_ids), 1), dtype=torch.long, device=dev)
        truncated = torch.tensor([not f for f in finished], device=dev)
        if self.cfg.mask_truncated_completions:
            t["completion_mask"] = t["completion_mask"] * (~truncated).unsqueeze(1).long()
        return t, truncated

    def _score(self, local_rows: list[int], comp_ids: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
        """Rewards per function of this process's completions, gathered so every rank sees whole groups, and
        their weighted sum."""
        dev = self.accelerator.device
        column = self.cfg.data.prompt_column
        raw_prompts = [self.rows[i][column] for i in local_rows]
        texts = self.tokenizer.batch_decode(comp_ids, skip_special_tokens=True)
        completions: list[Any] = [
            [{"role": "assistant", "content": x}] if is_conversational(p) else x
            for p, x in zip(raw_prompts, texts, strict=True)
        ]
        cols = {c: [self.rows[i].get(c) for i in local_rows] for c in self.rows[0] if c != column}
        table = score(self.rewards, raw_prompts, completions, comp_ids, cols)
        rpf = self._gather(torch.tensor(table, dtype=torch.float32, device=dev))
        return rpf, grpo_alg.combine_rewards(rpf, self.reward_weights.to(dev))

    def _generation_logps(self, t: Batch) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        old = self._batched_logps(self.model, t) if self.objective.keeps_old_logps else None
        ref = self._batched_logps(self.ref_model, t) if self.ref_model is not None else None
        if old is not None:
            t["old_logps"] = old
        if ref is not None:
            t["ref_logps"] = ref
        return old, ref

    @torch.no_grad()
    def _batched_logps(self, model: Any, t: Batch) -> torch.Tensor:
        from launchgen.trainers.modeling import per_token_logps

        outs = []
        n = t["prompt_ids"].size(0)
        width = t["prompt_ids"].size(1) + t["completion_ids"].size(1)
        step = rows_per_pass(self.cfg.max_tokens_per_forward, width, self.geometry.B)
        for s in range(0, n, step):
            sl = slice(s, s + step)
            # The reference model is not prepared by accelerate: give it the policy's autocast explicitly.
            with self.accelerator.autocast():
                lp, _ = per_token_logps(model, t["prompt_ids"][sl], t["prompt_mask"][sl], t["completion_ids"][sl],
                                        t["completion_mask"][sl], self.objective.logp_temperature)
            outs.append(lp)
        return torch.cat(outs, 0)

    def _sampling_logps(self, out: GenerationOutput, mask: torch.Tensor) -> torch.Tensor:
        """The sampler's per-token log-probs as a (B, C) tensor: 0.0 past a completion, NaN where it gave none."""
        assert out.logprobs is not None
        samp_rows = [[math.nan if x is None else float(x) for x in row] for row in out.logprobs]
        samp = pad_rows(samp_rows, 0, left=False, dtype=torch.float32).to(self.accelerator.device)
        width = mask.size(1)
        return samp[:, :width] if samp.size(1) >= width else torch.nn.functional.pad(samp, (0, width - samp.size(1)))

    def _importance_sampling(
        self, old: torch.Tensor, samp: torch.Tensor | None, mask: torch.Tensor, metrics: dict[str, float]
    ) -> torch.Tensor:
        """The correction for the sampler's log-probs differing from the trainer's, and its statistics."""
        if samp is None:
            raise TrainerSetupError(
                "generation.importance_sampling.enabled needs per-token log-probs from the backend; "
                "it returned none (disable the correction or fix the backend)"
            )
        isc = self.cfg.generation.importance_sampling
        res = grpo_alg.importance_sampling_ratio(
            old, samp, mask, isc.mode, isc.clip_min, isc.clip_max, isc.sequence_reduction
        )
        g = self._gather
        metrics["sampling/sampling_logp_difference/mean"] = g(res.logp_diff_mean.reshape(1)).mean().item()
        metrics["sampling/sampling_logp_difference/max"] = g(res.logp_diff_max.reshape(1)).max().item()
        metrics["sampling/importance_sampling_ratio/min"] = g(res.ratio_min.reshape(1)).min().item()
        metrics["sampling/importance_sampling_ratio/mean"] = g(res.ratio_mean.reshape(1)).mean().item()
        metrics["sampling/importance_sampling_ratio/max"] = g(res.ratio_max.reshape(1)).max().item()
        return res.ratio

    def _completion_metrics(self, prompt_ids: list[list[int]], comp_ids: list[list[int]], trunc_all: torch.Tensor,
                            metrics: dict[str, float]) -> None:
        """TRL's `num_tokens` and `completions/*` (lengths in tokens over all processes; the terminated ones are
        those that ended before max_completion_length, 0 when none did, as TRL logs)."""
        dev = self.accelerator.device
        lengths = self._gather(torch.tensor([len(c) for c in comp_ids], device=dev, dtype=torch.float32))
        prompt_tokens = self._gather(torch.tensor([sum(len(p) for p in prompt_ids)], device=dev, dtype=torch.float64))
        self.num_tokens += int(prompt_tokens.sum().item() + lengths.sum().item())
        metrics["num_tokens"] = float(self.num_tokens)
        metrics["completions/mean_length"] = lengths.mean().item()
        metrics["completions/min_length"] = lengths.min().item()
        metrics["completions/max_length"] = lengths.max().item()
        metrics["completions/clipped_ratio"] = trunc_all.mean().item()
        term = lengths[trunc_all == 0]
        if not term.numel():
            term = torch.zeros(1, device=dev)
        metrics["completions/mean_terminated_length"] = term.mean().item()
        metrics["completions/min_terminated_length"] = term.min().item()
        metrics["completions/max_terminated_length"] = term.max().item()

    def _reward_metrics(
        self, rpf: torch.Tensor, rewards: torch.Tensor, std_is_zero: torch.Tensor | None, metrics: dict[str, float]
    ) -> None:
        for k, r in enumerate(self.rewards):
            col = rpf[:, k]
            metrics[f"rewards/{r.name}/mean"] = torch.nanmean(col).item()
            metrics[f"rewards/{r.name}/std"] = grpo_alg.nanstd(col).item()
        metrics["reward"] = torch.nanmean(rewards).item()
        metrics["reward_std"] = grpo_alg.nanstd(rewards).item()
        if std_is_zero is not None:
            metrics["frac_reward_zero_std"] = std_is_zero.float().mean().item()

    def _split(self, t: Batch) -> list[Batch]:
        """This process's rows (whole pairs where the objective pairs them) shuffled into micro-batches."""
        g, unit = self.geometry, self.objective.pair_size
        dev = self.accelerator.device
        pp = torch.randperm(g.local_gen // unit)
        perm = (pp.unsqueeze(1) * unit + torch.arange(unit)).reshape(-1).to(dev)
        batches = []
        for s in range(g.spg):
            idx = perm[s * g.B : (s + 1) * g.B]
            batches.append({k: (v[idx] if isinstance(v, torch.Tensor) and v.dim() > 0 else v) for k, v in t.items()})
        return batches

    def _gather(self, t: torch.Tensor) -> torch.Tensor:
        acc = self.accelerator
        return acc.gather(t) if acc.num_processes > 1 else t
