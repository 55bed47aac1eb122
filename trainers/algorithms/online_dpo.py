"""Online DPO pairing and loss, as TRL 1.16's (experimental) OnlineDPOTrainer defines them, with one change for ties.

Pure torch functions; the loop (`launchgen.trainers.core`) passes every quantity explicitly.

* Two completions per prompt, consecutive rows (2i, 2i+1). The one with the higher weighted reward is *chosen*.
* Ties (equal rewards) and pairs where either reward is NaN (no function could score it) get weight 0: they stay
  in the batch (shapes and the mean's denominator do not change) but contribute no gradient. TRL instead keeps a
  tie with the first completion as chosen (`first_half >= second_half`), i.e. it trains on a coin flip.
* Sequence log-probs are sums over the completion tokens (masked), from the policy and the frozen reference.
  TRL scores them from the raw logits (no temperature), although it samples at `temperature` (0.9 by default).
* logits = (pi_c - pi_r) - (ref_c - ref_r);
  sigmoid: -log sigmoid(beta * logits);  ipo: (logits - 1 / (2 beta))^2;  loss = mean over the pairs of w * l.
* Logged as TRL: rewards/chosen = beta (pi_c - ref_c), rewards/rejected = beta (pi_r - ref_r),
  rewards/margins = their difference, rewards/accuracies = margin > 0 (over all pairs, ties included).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

LOSS_TYPES = ("sigmoid", "ipo")


@dataclass
class Pairs:
    order: torch.Tensor  # (N,) long: row permutation putting each pair's chosen row first (rows 2i <-> 2i+1 swapped)
    weights: torch.Tensor  # (N/2,) float: 1 for a usable pair, 0 for a tie or an unscorable pair
    chosen_rewards: torch.Tensor  # (N/2,) reward of the chosen completion (NaN possible)
    rejected_rewards: torch.Tensor  # (N/2,)


@torch.no_grad()
def pair_preferences(rewards: torch.Tensor) -> Pairs:
    """Chosen/rejected for consecutive pairs of `rewards` (N,), N even."""
    if rewards.dim() != 1 or rewards.numel() % 2:
        raise ValueError(f"rewards of shape {tuple(rewards.shape)} do not split into pairs")
    pair = rewards.view(-1, 2)
    second_better = pair[:, 1] > pair[:, 0]  # False for ties and NaN: the first row stays "chosen"
    base = torch.arange(0, rewards.numel(), 2, device=rewards.device)
    first = base + second_better.long()
    second = base + (~second_better).long()
    order = torch.stack([first, second], dim=1).reshape(-1)
    usable = (pair[:, 0] != pair[:, 1]) & ~torch.isnan(pair).any(dim=1)
    ordered = rewards[order].view(-1, 2)
    return Pairs(
        order=order, weights=usable.to(rewards.dtype), chosen_rewards=ordered[:, 0], rejected_rewards=ordered[:, 1]
    )


@dataclass
class DPOLoss:
    loss: torch.Tensor  # scalar: mean over pairs of weight * per-pair loss (the loop divides by GA)
    losses: torch.Tensor  # (P,) per-pair losses before weighting
    chosen_rewards: torch.Tensor  # (P,) beta * (pi_c - ref_c), no gradient
    rejected_rewards: torch.Tensor  # (P,) no gradient


def dpo_loss(
    chosen_logps: torch.Tensor,
    rejected_logps: torch.Tensor,
    ref_chosen_logps: torch.Tensor,
    ref_rejected_logps: torch.Tensor,
    beta: float,
    loss_type: str = "sigmoid",
    weights: torch.Tensor | None = None,
) -> DPOLoss:
    """DPO on summed sequence log-probs (P,) each; `weights` (P,) default 1."""
    if beta <= 0:
        raise ValueError("DPO needs beta > 0")
    logits = (chosen_logps - rejected_logps) - (ref_chosen_logps - ref_rejected_logps)
    if loss_type == "sigmoid":
        losses = -F.logsigmoid(beta * logits)
    elif loss_type == "ipo":
        losses = (logits - 1 / (2 * beta)) ** 2
    else:
        raise ValueError(f"online_dpo loss_type must be one of {LOSS_TYPES}, got {loss_type!r}")
    w = torch.ones_like(losses) if weights is None else weights.to(losses.dtype)
    loss = (losses * w).sum() / max(losses.numel(), 1)
    return DPOLoss(
        loss=loss,
        losses=losses,
        chosen_rewards=(beta * (chosen_logps - ref_chosen_logps)).detach(),
        rejected_rewards=(beta * (rejected_logps - ref_rejected_logps)).detach(),
    )
