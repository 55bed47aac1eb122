"""Evaluation of the online trainers (`eval_data`, `eval_strategy: steps`): generate on the eval prompts, score
them with the training reward functions, and log the reward metrics under `eval/`.

Each prompt gets `num_generations` completions with the training sampling settings, as TRL's GRPO evaluation does.
The prompts are dealt round-robin over the processes, `local_gen // num_generations` prompts per generate call;
every process makes the same number of calls (one short of prompts repeats its last one and drops the result), so
backends that generate collectively (colocated vLLM) stay in step. The per-completion values are padded with NaN
to one size per process and gathered once, so every metric is over all the eval completions:

* `eval/reward`, `eval/reward_std`: the weighted reward's mean and (Bessel) std over all eval completions;
* `eval/rewards/<fn>/mean`: per reward function; `eval/completions/mean_length`: in tokens;
* `time/eval`: seconds the evaluation took.
"""

from __future__ import annotations

import math
import time
from typing import Any

import torch
from launchgen.trainers.algorithms import grpo as grpo_alg
from launchgen.trainers.data import build_prompt, is_conversational, load_rows, tokenize_prompt
from launchgen.trainers.declarations.errors import TrainerSetupError
from launchgen.trainers.declarations.rewards import score

PREFIX = "eval/"


class Evaluator:
    def __init__(self, rollout: Any) -> None:
        self.rollout = rollout
        cfg = rollout.cfg
        assert cfg.eval_data is not None
        self.data = cfg.eval_data
        self.rows = load_rows(cfg.eval_data)
        self._ids: dict[int, list[int]] = {}

    def _prompt_ids(self, idx: int) -> list[int]:
        ids = self._ids.get(idx)
        if ids is None:
            tok = self.rollout.tokenizer
            text = build_prompt(self.rows[idx][self.data.prompt_column], tok, self.data.system_prompt)
            ids = tokenize_prompt(text, tok, self.data.max_prompt_length)
            if not ids:
                raise TrainerSetupError(f"eval_data: prompt at row {idx} is empty after tokenization")
            self._ids[idx] = ids
        return ids

    @torch.no_grad()
    def run(self) -> dict[str, float]:
        t0 = time.perf_counter()
        ro = self.rollout
        acc, g = ro.accelerator, ro.geometry
        n_proc, rank = acc.num_processes, acc.process_index
        mine = list(range(rank, len(self.rows), n_proc))
        per_call = max(1, g.local_gen // g.G)
        calls = math.ceil(math.ceil(len(self.rows) / n_proc) / per_call)
        k = len(ro.rewards)
        table: list[list[float]] = []
        lengths: list[float] = []
        for c in range(calls):
            idx = mine[c * per_call : (c + 1) * per_call]
            real = len(idx)
            idx = idx + [mine[-1] if mine else 0] * (per_call - real)  # same call size on every process
            expanded = [i for i in idx for _ in range(g.G)]
            with ro._generation_context():
                out = ro.backend.generate([self._prompt_ids(i) for i in expanded], ro._sampling_params())
            kept = real * g.G
            table.extend(self._score(expanded[:kept], out.completion_ids[:kept]))
            table.extend([[math.nan] * k] * (len(expanded) - kept))
            lengths.extend([float(len(x)) for x in out.completion_ids[:kept]] + [math.nan] * (len(expanded) - kept))
        dev = acc.device
        rpf = ro._gather(torch.tensor(table, dtype=torch.float32, device=dev).reshape(-1, k))
        lens = ro._gather(torch.tensor(lengths, dtype=torch.float32, device=dev))
        rewards = grpo_alg.combine_rewards(rpf, ro.reward_weights.to(dev))
        metrics = {
            f"{PREFIX}reward": torch.nanmean(rewards).item(),
            f"{PREFIX}reward_std": grpo_alg.nanstd(rewards).item(),
            f"{PREFIX}completions/mean_length": torch.nanmean(lens).item(),
        }
        for j, r in enumerate(ro.rewards):
            metrics[f"{PREFIX}rewards/{r.name}/mean"] = torch.nanmean(rpf[:, j]).item()
        metrics["time/eval"] = time.perf_counter() - t0
        return metrics

    def _score(self, idx: list[int], comp_ids: list[list[int]]) -> list[list[float]]:
        column = self.data.prompt_column
        raw = [self.rows[i][column] for i in idx]
        texts = self.rollout.tokenizer.batch_decode(comp_ids, skip_special_tokens=True)
        completions: list[Any] = [
            [{"role": "assistant", "content": x}] if is_conversational(p) else x for p, x in zip(raw, texts, strict=True)
        ]
        cols = {c: [self.rows[i].get(c) for i in idx] for c in self.rows[0] if c != column}
        return score(self.rollout.rewards, raw, completions, comp_ids, cols)
