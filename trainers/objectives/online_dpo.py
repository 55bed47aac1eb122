"""Online DPO (TRL 1.16's experimental OnlineDPOTrainer with reward functions): two completions per prompt, the
higher-reward one chosen, the DPO loss against a frozen reference; log-probs scored at temperature 1 as TRL does."""

from __future__ import annotations

from typing import Any

import torch
from launchgen.trainers.algorithms import online_dpo as dpo_alg
from launchgen.trainers.declarations.config import TrainerConfig
from launchgen.trainers.declarations.configs.online_dpo import OnlineDPOConfig
from launchgen.trainers.objectives import base
from launchgen.trainers.stats import Stat, StepStats


class OnlineDPOObjective(base.NoStepState):
    config_class = OnlineDPOConfig
    name = OnlineDPOConfig.trainer_name
    pair_size = 2  # rows are (chosen, rejected) pairs: never split by the shuffle or the passes
    always_extremes: tuple[str, ...] = ()
    needs_reference = True
    keeps_old_logps = False  # no ratio: the loss compares the policy with the reference only
    uses_importance_sampling = False
    keeps_sampling_logps = False
    logp_temperature = 1.0  # TRL scores completions from the raw logits although it samples at `temperature`

    def __init__(self, cfg: TrainerConfig, num_processes: int) -> None:
        self.cfg = cfg
        self.geometry = base.Geometry.from_config(cfg, num_processes)
        self.beta = float(cfg.beta or 0.0)

    def validate(self) -> None:
        base.validate_rollout(self.geometry)

    def make_source(self, accelerator: Any) -> base.BatchSource:
        from launchgen.trainers.rollout import Rollout  # torch-heavy, and it imports objectives.base back

        return Rollout(self, accelerator)

    def prepare(self, batch: base.ScoredRollout) -> None:
        """Reorders this process's rows chosen-first (local_gen is even, so they hold whole pairs)."""
        t, rewards, m = batch.t, batch.rewards, batch.metrics
        local_gen = batch.mask.size(0)
        pairs = dpo_alg.pair_preferences(rewards)
        local_order = pairs.order[batch.local] - batch.rank * local_gen
        for key, val in list(t.items()):
            if isinstance(val, torch.Tensor) and val.dim() > 0 and val.size(0) == local_gen:
                t[key] = val[local_order]
        t["rewards"] = rewards[pairs.order][batch.local]
        half = local_gen // 2
        t["pair_weights"] = pairs.weights[batch.rank * half : (batch.rank + 1) * half].repeat_interleave(2)
        m["objective/scores"] = torch.nanmean(rewards).item()
        m["objective/scores_margin"] = torch.nanmean(pairs.chosen_rewards - pairs.rejected_rewards).item()
        m["objective/tied_pairs"] = 1.0 - pairs.weights.mean().item()
        m["frac_reward_zero_std"] = m["objective/tied_pairs"]
        m["beta"] = self.beta
        m["val/contain_eos_token"] = 1.0 - batch.truncated_all.mean().item()
        return None

    def loss_share(self, part: base.Batch, mb: base.Batch) -> Stat:
        return base.row_share(part, mb)  # a mean over pairs

    def loss(self, model: Any, mb: base.Batch, stats: StepStats) -> torch.Tensor:
        """Rows are (chosen, rejected) pairs in order; TRL's metric names (means over pairs / completions)."""
        logps, m = base.policy_logps(model, mb, self.logp_temperature, stats)
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
        return res.loss / self.geometry.ga  # TRL's Trainer divides the mean pair loss by GA before backward
