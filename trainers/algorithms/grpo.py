"""GRPO advantages, vLLM importance-sampling correction and the per-token clipped loss, as TRL 1.16 defines them.

Pure torch functions, no trainer state: the loop (`launchgen.trainers.core`) passes every quantity explicitly.
The exact definitions (and the reasons for each detail) are in `shared/reference/grpo-rloo-semantics.md`:

* advantages: group mean, **unbiased** std (+1e-4), `scale_rewards` in group/batch/none, NaN (unscorable) rewards
  excluded from the statistics and given A = 0;
* several rewards: `sum_then_normalize` (weighted sum, then the group statistics) or `normalize_then_sum`
  (`normalize_then_sum_advantages`);
* loss: the per-token objective and its variants are in `grpo_loss` (re-exported here); then one of TRL's
  normalisers (`normalize_loss`: grpo/sapo, bnpo, dr_grpo, dapo/cispo/vespo, luspo).

One deliberate option beyond TRL (default off, TRL's behaviour stays the default):
`importance_sampling_ratio(..., sequence_reduction="mean")` uses the geometric mean of the token ratios for the
`sequence_*` modes instead of TRL's product. TRL's exp(sum of log-ratios) grows with the completion length, so with
`sequence_mask` and C_max = 3 a long completion with a tiny per-token vLLM/trainer mismatch (e.g. 0.001 nats over
2000 tokens) is dropped entirely; the geometric mean measures the per-token mismatch and does not penalise length.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from launchgen.trainers.algorithms.grpo_loss import PerTokenLoss, grpo_per_token_loss

__all__ = ["PerTokenLoss", "grpo_per_token_loss"]  # the per-token objective lives in grpo_loss; re-exported

#: Added to the std before dividing, as TRL does (also makes a zero-std group give A = 0 instead of NaN).
STD_EPS = 1e-4

LOSS_TYPES = ("grpo", "dapo", "dr_grpo", "bnpo", "cispo", "sapo", "luspo", "vespo")
IS_MODES = ("token_truncate", "token_mask", "sequence_truncate", "sequence_mask")


def nanstd(x: torch.Tensor, dim: int | None = None, keepdim: bool = False) -> torch.Tensor:
    """Unbiased (Bessel) std ignoring NaNs; NaN where fewer than two values are present."""
    if dim is None:
        x = x.reshape(-1)
        dim = 0
    mean = torch.nanmean(x, dim=dim, keepdim=True)
    var = torch.nanmean((x - mean) ** 2, dim=dim, keepdim=True)
    count = (~torch.isnan(x)).sum(dim=dim, keepdim=True).to(x.dtype)
    corr = torch.where(count > 1, count / (count - 1), torch.full_like(count, float("nan")))
    std = torch.sqrt(var * corr)
    return std if keepdim else std.squeeze(dim)


def combine_rewards(rewards_per_func: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """Weighted sum over reward functions (N, K) -> (N,); a row where every function returned None (NaN) is NaN."""
    total = (rewards_per_func * weights.to(rewards_per_func).unsqueeze(0)).nansum(dim=1)
    unscorable = torch.isnan(rewards_per_func).all(dim=1)
    return total.masked_fill(unscorable, float("nan"))


@dataclass
class Advantages:
    advantages: torch.Tensor  # (N,), NaN-free
    std_is_zero: torch.Tensor  # (N,) bool, for the frac_reward_zero_std metric


def grpo_advantages(rewards: torch.Tensor, num_generations: int, scale_rewards: str = "group") -> Advantages:
    """A = (R - group mean) / (std + 1e-4) over the whole (all-process) generation batch.

    `rewards` (N,) may hold NaN for unscorable completions; rows are consecutive groups of `num_generations`.
    `"batch"` subtracts the GROUP mean but divides by the std over the whole batch (TRL's definition).
    """
    if rewards.dim() != 1 or rewards.numel() % num_generations:
        raise ValueError(f"rewards of shape {tuple(rewards.shape)} do not split into groups of {num_generations}")
    grouped = rewards.view(-1, num_generations)
    mean = torch.nanmean(grouped, dim=1).repeat_interleave(num_generations)
    if scale_rewards in ("group", "none"):
        std = nanstd(grouped, dim=1).repeat_interleave(num_generations)
    elif scale_rewards == "batch":
        std = nanstd(rewards).expand_as(rewards) if rewards.numel() > 1 else torch.zeros_like(rewards)
    else:
        raise ValueError(f"scale_rewards must be group, batch or none, got {scale_rewards!r}")
    adv = rewards - mean
    if scale_rewards != "none":
        adv = adv / (std + STD_EPS)
    return Advantages(
        advantages=torch.nan_to_num(adv, nan=0.0),
        std_is_zero=torch.isclose(std, torch.zeros_like(std)),
    )


def normalize_then_sum_advantages(rewards_per_func: torch.Tensor, weights: torch.Tensor, num_generations: int
                                  ) -> tuple[Advantages, torch.Tensor]:
    """TRL's `multi_objective_aggregation="normalize_then_sum"`: each reward (N, K) is normalised within its
    group ((r - group mean) / (group std + 1e-4)), the weighted sum taken, then whitened over the whole batch.
    Returns the advantages and the summed normalised rewards (NaN where every function gave None)."""
    n, k = rewards_per_func.shape
    if n % num_generations:
        raise ValueError(f"{n} rewards do not split into groups of {num_generations}")
    grouped = rewards_per_func.view(-1, num_generations, k)
    mean_k = torch.nanmean(grouped, dim=1, keepdim=True)
    std_k = nanstd(grouped, dim=1, keepdim=True) if num_generations > 1 else torch.zeros_like(mean_k)
    normed = ((grouped - mean_k) / (std_k + STD_EPS)).view(-1, k)
    summed = (normed * weights.to(normed).unsqueeze(0)).nansum(dim=1)
    summed = summed.masked_fill(torch.isnan(rewards_per_func).all(dim=1), float("nan"))
    std = nanstd(summed).expand_as(summed) if summed.numel() > 1 else torch.zeros_like(summed)
    adv = (summed - torch.nanmean(summed)) / (std + STD_EPS)
    return Advantages(torch.nan_to_num(adv, nan=0.0), torch.isclose(std, torch.zeros_like(std))), summed


@dataclass
class ISResult:
    ratio: torch.Tensor  # (B, C) for token modes, (B, 1) for sequence modes; no gradient
    # Local pieces of the five sampling/* metrics (the loop reduces them over processes as TRL does).
    logp_diff_mean: torch.Tensor
    logp_diff_max: torch.Tensor
    ratio_min: torch.Tensor
    ratio_mean: torch.Tensor
    ratio_max: torch.Tensor


@torch.no_grad()
def importance_sampling_ratio(
    old_logps: torch.Tensor,
    sampling_logps: torch.Tensor,
    mask: torch.Tensor,
    mode: str = "sequence_mask",
    clip_min: float | None = None,
    clip_max: float | None = 3.0,
    sequence_reduction: str = "sum",
) -> ISResult:
    """Truncated / masked IS correction of the sampler's log-probs (TRL `_generate_and_score_completions`).

    `sampling_logps` (B, C): the sampler's log-probs, padded with 0.0, NaN where it gave none (-> ratio 1).
    `sequence_reduction="sum"` is TRL's product of token ratios; `"mean"` the geometric mean (see module doc).
    """
    if mode not in IS_MODES:
        raise ValueError(f"importance_sampling.mode must be one of {IS_MODES}, got {mode!r}")
    maskf = mask.to(old_logps.dtype)
    delta = torch.nan_to_num((old_logps - sampling_logps) * maskf, nan=0.0)
    if mode.startswith("sequence"):
        seq = delta.sum(-1, keepdim=True)
        if sequence_reduction == "mean":
            seq = seq / maskf.sum(-1, keepdim=True).clamp(min=1.0)
        elif sequence_reduction != "sum":
            raise ValueError(f"sequence_reduction must be sum or mean, got {sequence_reduction!r}")
        ratio = torch.exp(seq)
    else:
        ratio = torch.exp(delta)
    if mode.endswith("_truncate"):
        ratio = torch.clamp(ratio, min=clip_min, max=clip_max)
    else:
        lo = -float("inf") if clip_min is None else clip_min
        hi = float("inf") if clip_max is None else clip_max
        ratio = ratio.masked_fill((ratio < lo) | (ratio > hi), 0.0)

    bmask = mask.bool()
    absdiff = torch.abs(old_logps - sampling_logps)
    absdiff = absdiff[bmask & ~torch.isnan(absdiff)]
    zero = torch.zeros((), device=old_logps.device, dtype=torch.float32)
    flat = ratio.flatten() if mode.startswith("sequence") else ratio[bmask]
    nonempty_d, nonempty_r = absdiff.numel() > 0, flat.numel() > 0
    return ISResult(
        ratio=ratio,
        logp_diff_mean=absdiff.mean().float() if nonempty_d else zero,
        logp_diff_max=absdiff.max().float() if nonempty_d else zero,
        ratio_min=flat.min().float() if nonempty_r else zero,
        ratio_mean=flat.mean().float() if nonempty_r else zero,
        ratio_max=flat.max().float() if nonempty_r else zero,
    )


def normalize_loss(
    per_token_loss: torch.Tensor,
    mask: torch.Tensor,
    loss_type: str,
    *,
    gradient_accumulation_steps: int,
    max_completion_length: int | None = None,
    num_items_in_batch: float | torch.Tensor | None = None,
    num_processes: int = 1,
    steps_per_generation: int | None = None,
) -> torch.Tensor:
    """Reduce (B, C) to the scalar that is backpropagated, in train mode (TRL's /GA is included).

    grpo/sapo: mean over rows of the per-row token mean; bnpo: token mean; dr_grpo: sum / (rows x max length);
    luspo: mean over rows of the per-row sum; dapo/cispo/vespo: sum / (max(N, 1) / n_proc * GA / SPG),
    N = completion tokens of the whole generation batch.
    """
    m = mask.to(per_token_loss.dtype)
    ga = gradient_accumulation_steps
    masked = per_token_loss * m
    if loss_type in ("grpo", "sapo"):
        return (masked.sum(-1) / m.sum(-1).clamp(min=1.0)).mean() / ga
    if loss_type == "luspo":
        return masked.sum(-1).mean() / ga
    if loss_type == "bnpo":
        return masked.sum() / m.sum().clamp(min=1.0) / ga
    if loss_type == "dr_grpo":
        if max_completion_length is None:
            raise ValueError("loss_type dr_grpo needs max_completion_length")
        return masked.sum() / (per_token_loss.size(0) * max_completion_length) / ga
    if loss_type in ("dapo", "cispo", "vespo"):
        if num_items_in_batch is None or steps_per_generation is None:
            raise ValueError(f"loss_type {loss_type} needs num_items_in_batch and steps_per_generation")
        n = torch.as_tensor(num_items_in_batch, dtype=torch.float32, device=per_token_loss.device)
        normalizer = n.clamp(min=1.0) / num_processes * ga / steps_per_generation
        return masked.sum() / normalizer
    raise ValueError(f"loss_type must be one of {LOSS_TYPES}, got {loss_type!r}")


@dataclass
class ClipStats:
    """Local sums/counts; the loop reduces them over processes (TRL's global_masked_mean)."""

    low: torch.Tensor
    high: torch.Tensor
    region: torch.Tensor
    count: torch.Tensor
    low_seq_min: torch.Tensor  # min over local sequences of the per-sequence low-clip fraction
    high_seq_max: torch.Tensor


@torch.no_grad()
def clip_stats(
    ratio: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor, epsilon_low: float, epsilon_high: float
) -> ClipStats:
    """A (B, 1) ratio (sequence level) counts each completion once, as TRL's global_masked_mean does."""
    adv = advantages.unsqueeze(1)
    low = ((ratio < 1 - epsilon_low) & (adv < 0)).float()
    high = ((ratio > 1 + epsilon_high) & (adv > 0)).float()
    region = torch.maximum(low, high)
    m = torch.ones_like(low) if ratio.size(1) == 1 else mask.float()
    per_seq_den = m.sum(-1)
    low_seq = (low * m).sum(-1) / per_seq_den
    high_seq = (high * m).sum(-1) / per_seq_den
    nan = torch.tensor(float("nan"), device=ratio.device)
    return ClipStats(
        low=(low * m).sum(),
        high=(high * m).sum(),
        region=(region * m).sum(),
        count=m.sum(),
        low_seq_min=torch.nan_to_num(low_seq, nan=float("inf")).min() if low_seq.numel() else nan,
        high_seq_max=torch.nan_to_num(high_seq, nan=-float("inf")).max() if high_seq.numel() else nan,
    )
