"""RLOO (TRL 1.16's RLOOTrainer): leave-one-out baselines on KL-penalised rewards, a clipped sequence-level ratio."""

from __future__ import annotations

from typing import Any

import torch
from launchgen.trainers.algorithms import rloo as rloo_alg
from launchgen.trainers.declarations.config import TrainerConfig
from launchgen.trainers.declarations.configs.rloo import RLOOConfig
from launchgen.trainers.declarations.errors import TrainerSetupError
from launchgen.trainers.objectives import base
from launchgen.trainers.stats import Stat, StepStats


class RLOOObjective(base.NoStepState):
    config_class = RLOOConfig
    name = RLOOConfig.trainer_name
    pair_size = 1
    always_extremes: tuple[str, ...] = ("clip_ratio/low_min", "clip_ratio/high_max")
    uses_importance_sampling = False
    keeps_sampling_logps = False
    keeps_old_logps = True  # its sequence-level ratio and KL penalty use them

    def __init__(self, cfg: TrainerConfig, num_processes: int) -> None:
        self.cfg = cfg
        self.geometry = base.Geometry.from_config(cfg, num_processes)
        self.beta = float(cfg.beta or 0.0)
        self.eps_lo, self.eps_hi = base.clip_range(cfg)
        self.needs_reference = self.beta != 0.0
        self.logp_temperature = cfg.generation.temperature

    def validate(self) -> None:
        base.validate_rollout(self.geometry)
        if self.geometry.G < 2:
            raise TrainerSetupError("num_generations must be >= 2 for rloo (leave-one-out baseline)")

    def make_source(self, accelerator: Any) -> base.BatchSource:
        from launchgen.trainers.rollout import Rollout  # torch-heavy, and it imports objectives.base back

        return Rollout(self, accelerator)

    def prepare(self, batch: base.ScoredRollout) -> torch.Tensor:
        old, ref, mask, acc = batch.old, batch.ref, batch.mask, batch.accelerator
        assert old is not None
        kl_local = None
        if self.beta != 0.0:
            assert ref is not None
            kl_local = ((old - ref) * mask).sum(-1)
            kl_stats = torch.stack([((old - ref) * mask).sum(), mask.sum().float()])
            if acc.num_processes > 1:
                kl_stats = acc.reduce(kl_stats, reduction="sum")
            batch.metrics["kl"] = (kl_stats[0] / kl_stats[1].clamp(min=1.0)).item()
        pen = batch.rewards
        if self.cfg.reward_clip_range is not None:
            pen = pen.clamp(min=self.cfg.reward_clip_range[0], max=self.cfg.reward_clip_range[1])
        if kl_local is not None:
            pen = pen - self.beta * batch.gather(kl_local)
        adv = rloo_alg.rloo_advantages(pen, self.geometry.G, self.cfg.normalize_advantages)
        batch.t["old_seq_logps"] = (old * mask).sum(1)
        batch.t["advantages"] = adv.advantages[batch.local]
        return adv.std_is_zero

    def loss_share(self, part: base.Batch, mb: base.Batch) -> Stat:
        return base.row_share(part, mb)  # a mean over rows

    def loss(self, model: Any, mb: base.Batch, stats: StepStats) -> torch.Tensor:
        logps, _ = base.policy_logps(model, mb, self.logp_temperature, stats)
        adv = mb["advantages"]
        rl = rloo_alg.rloo_loss(logps, mb["completion_mask"], mb["old_seq_logps"], adv, self.eps_lo, self.eps_hi)
        base.clip_counts(rl.ratio.detach(), adv, self.eps_lo, self.eps_hi, stats)
        return rl.loss / self.geometry.ga  # TRL's Trainer divides RLOO's loss by GA before backward
