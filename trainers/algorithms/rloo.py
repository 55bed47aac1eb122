"""RLOO advantages and loss, as TRL 1.16's RLOOTrainer defines them.

* The KL acts only through the reward: R <- R - beta * sum_t (old_gen - ref) * m (k1 estimator, no gradient).
* Leave-one-out baseline over the scorable siblings: b_i = (sum_j R_j - R_i) / (n_scorable - 1); A = R - b.
* Optional whitening over the whole generation batch (`normalize_advantages`).
* Sequence-level PPO clip on r_i = exp(sum_t l m - old_logps_i), plain mean over sequences; the loop divides by
  gradient_accumulation_steps (TRL's Trainer does the same for RLOO).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from launchgen.trainers.algorithms.grpo import STD_EPS, nanstd


@torch.no_grad()
def kl_penalized_rewards(
    rewards: torch.Tensor,
    beta: float,
    old_logps: torch.Tensor | None,
    ref_logps: torch.Tensor | None,
    mask: torch.Tensor,
    reward_clip_range: tuple[float, float] | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Clamp (optional), then subtract beta * k1 KL summed per sequence. Returns (rewards, per-token kl or None)."""
    if reward_clip_range is not None:
        rewards = rewards.clamp(min=reward_clip_range[0], max=reward_clip_range[1])
    if beta == 0.0:
        return rewards, None
    if old_logps is None or ref_logps is None:
        raise ValueError("RLOO with beta != 0 needs generation-time and reference log-probs")
    per_token_kl = old_logps - ref_logps
    kl = (per_token_kl * mask.to(per_token_kl.dtype)).sum(-1)
    return rewards - beta * kl, per_token_kl


@dataclass
class RLOOAdvantages:
    advantages: torch.Tensor
    std_is_zero: torch.Tensor


@torch.no_grad()
def rloo_advantages(
    rewards: torch.Tensor, num_generations: int, normalize: bool = False
) -> RLOOAdvantages:
    """Leave-one-out advantages over consecutive groups; NaN rewards (unscorable) are excluded and get A = 0."""
    if num_generations < 2:
        raise ValueError("RLOO needs num_generations >= 2")
    grouped = rewards.view(-1, num_generations)
    counts = (~torch.isnan(grouped)).sum(dim=1, keepdim=True).to(rewards.dtype)
    total = torch.nansum(grouped, dim=1, keepdim=True)
    baseline = ((total - grouped) / (counts - 1)).view(-1)
    adv = rewards - baseline
    if normalize:
        adv = (adv - torch.nanmean(adv)) / (nanstd(adv) + STD_EPS)
    std = nanstd(grouped, dim=1)
    return RLOOAdvantages(
        advantages=torch.nan_to_num(adv, nan=0.0),
        std_is_zero=torch.isclose(std, torch.zeros_like(std)).repeat_interleave(num_generations),
    )


@dataclass
class RLOOLoss:
    loss: torch.Tensor  # scalar, before the /GA the loop applies
    ratio: torch.Tensor  # (B,)


def rloo_loss(
    logps: torch.Tensor,
    mask: torch.Tensor,
    old_seq_logps: torch.Tensor,
    advantages: torch.Tensor,
    epsilon_low: float = 0.2,
    epsilon_high: float = 0.2,
) -> RLOOLoss:
    seq = (logps * mask.to(logps.dtype)).sum(1)
    coef_1 = torch.exp(seq - old_seq_logps)
    coef_2 = torch.clamp(coef_1, 1 - epsilon_low, 1 + epsilon_high)
    loss = -torch.min(coef_1 * advantages, coef_2 * advantages)
    return RLOOLoss(loss=loss.mean(), ratio=coef_1)
