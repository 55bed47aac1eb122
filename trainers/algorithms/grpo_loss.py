"""GRPO's per-token objective in all of TRL 1.16's variants (`GRPOTrainer._compute_loss`), as pure torch functions.

* ratio: coef_1 = exp(l - old) per token, or (GSPO, `importance_sampling_level="sequence"`) one per completion,
  exp of the masked mean token log-ratio, (B, 1);
* loss types: the clipped ratio (grpo, bnpo, dr_grpo, dapo, luspo; `delta` caps the unclipped ratio: two-sided
  clipping), cispo (-min(coef_1, eps_high).detach() * A * l), sapo (-sigmoid(tau (coef_1 - 1)) * 4 / tau * A, tau by
  the sign of A), vespo (-phi(w) * A * l, phi the gamma weight of the sequence ratio, `gamma_weights`);
* then the off-policy sequence mask and the entropy mask multiply the loss, the vLLM IS ratio too (except vespo,
  which folds it into w), and beta * k3 KL is added (times coef_1 when `use_bias_correction_kl`).

`PerTokenLoss.kl` is the KL term as added to the loss (after the bias correction): TRL logs its masked mean as
`kl`. The normalisers are `grpo.normalize_loss`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

#: Sequence log-ratios are clamped to [log 1e-8, 20] in VESPO, as TRL does (matching the paper's code).
_VESPO_LOG_MIN = math.log(1e-8)


@dataclass(frozen=True)
class LossParams:
    """The knobs of `grpo_per_token_loss` (TRL's GRPOConfig names)."""

    loss_type: str = "grpo"
    epsilon_low: float = 0.2
    epsilon_high: float = 0.2
    beta: float = 0.0
    use_bias_correction_kl: bool = True
    importance_sampling_level: str = "token"
    delta: float | None = None
    sapo_temperature_pos: float = 1.0
    sapo_temperature_neg: float = 1.05
    vespo_k_pos: float = 2.0
    vespo_lambda_pos: float = 3.0
    vespo_k_neg: float = 3.0
    vespo_lambda_neg: float = 2.0


@dataclass
class PerTokenLoss:
    loss: torch.Tensor  # (B, C) unnormalised, unmasked
    ratio: torch.Tensor  # coef_1 (after `delta`): (B, C), or (B, 1) at sequence level
    kl: torch.Tensor | None  # (B, C) the KL term added to the loss (bias-corrected when asked), when beta != 0
    phi_seq: torch.Tensor | None = None  # (B, 1) VESPO's gamma weights


@torch.no_grad()
def gamma_weights(
    advantages: torch.Tensor, log_ratio: torch.Tensor, mask: torch.Tensor, is_ratio: torch.Tensor | None,
    p: LossParams,
) -> torch.Tensor:
    """VESPO's phi(w) = exp(lambda + k log w - lambda w), w the sequence ratio (times the IS ratio), (B, 1)."""
    seq = (torch.clamp(log_ratio, -20.0, 20.0) * mask).sum(-1, keepdim=True)
    if is_ratio is not None:
        seq = seq + torch.clamp(torch.log(is_ratio), _VESPO_LOG_MIN, 20.0).sum(-1, keepdim=True)
    log_w = torch.clamp(seq, _VESPO_LOG_MIN, 20.0)
    nonneg = advantages >= 0
    k = torch.where(nonneg, p.vespo_k_pos, p.vespo_k_neg)
    lam = torch.where(nonneg, p.vespo_lambda_pos, p.vespo_lambda_neg).clamp(min=1e-4)
    phi = torch.exp(lam + k * log_w - lam * torch.exp(log_w))
    return phi.nan_to_num(nan=0.0, posinf=0.0, neginf=0.0)


@torch.no_grad()
def off_policy_mask(
    advantages: torch.Tensor, logps: torch.Tensor, sampling_logps: torch.Tensor, mask: torch.Tensor, threshold: float
) -> torch.Tensor:
    """(B, 1) 1.0 = keep: A >= 0, or the completion's mean (sampler - policy) log-prob difference <= threshold.
    Unscored sampler tokens (NaN) count as no difference."""
    kl = torch.nan_to_num(sampling_logps - logps.detach(), nan=0.0)
    avg = (kl * mask).sum(1, keepdim=True) / mask.sum(1, keepdim=True).clamp(min=1.0)
    adv = advantages if advantages.dim() == 2 else advantages.unsqueeze(1)
    return ((adv >= 0) | (avg <= threshold)).to(mask.dtype)


@torch.no_grad()
def high_entropy_mask(entropy: torch.Tensor, mask: torch.Tensor, all_entropies: torch.Tensor,
                      top_quantile: float) -> torch.Tensor:
    """(B, C) bool: tokens whose entropy is >= the (1 - top_quantile) quantile of `all_entropies` (the unmasked
    entropies of the micro-batch on every process), padding always False."""
    if all_entropies.numel() == 0:
        return torch.zeros_like(entropy, dtype=torch.bool)
    threshold = torch.quantile(all_entropies.float(), 1 - top_quantile)
    return ((entropy * mask.float()) >= threshold) & mask.bool()


def _ratio(log_ratio: torch.Tensor, mask: torch.Tensor | None, level: str) -> torch.Tensor:
    if level == "token":
        return torch.exp(log_ratio)
    if level != "sequence":
        raise ValueError(f"importance_sampling_level must be token or sequence, got {level!r}")
    if mask is None:
        raise ValueError("importance_sampling_level sequence needs the completion mask")
    m = mask.to(log_ratio.dtype)
    return torch.exp(((log_ratio * m).sum(-1) / m.sum(-1).clamp(min=1.0)).unsqueeze(-1))


def grpo_per_token_loss(
    logps: torch.Tensor,
    advantages: torch.Tensor,
    *,
    old_logps: torch.Tensor | None = None,
    ref_logps: torch.Tensor | None = None,
    epsilon_low: float = 0.2,
    epsilon_high: float = 0.2,
    beta: float = 0.0,
    use_bias_correction_kl: bool = True,
    is_ratio: torch.Tensor | None = None,
    mask: torch.Tensor | None = None,
    params: LossParams | None = None,
    keep: torch.Tensor | None = None,
) -> PerTokenLoss:
    """TRL's per-token GRPO objective. `params` (when given) supersedes the individual clip/KL keywords.

    `old_logps=None` is TRL's on-policy case: r = exp(l - l.detach()) (== 1, but carrying the gradient).
    `keep`: the product of the off-policy and entropy masks ((B, 1) or (B, C)), or None.
    """
    p = params or LossParams(epsilon_low=epsilon_low, epsilon_high=epsilon_high, beta=beta,
                             use_bias_correction_kl=use_bias_correction_kl)
    old = logps.detach() if old_logps is None else old_logps
    adv = advantages.unsqueeze(1) if advantages.dim() == 1 else advantages
    log_ratio = logps - old
    coef_1 = _ratio(log_ratio, mask, p.importance_sampling_level)
    kl = None
    if p.beta != 0.0:
        if ref_logps is None:
            raise ValueError("beta != 0 needs the reference model's log-probs")
        kl = torch.exp(ref_logps - logps) - (ref_logps - logps) - 1
        if p.use_bias_correction_kl:
            kl = kl * coef_1
    phi = None
    if p.loss_type == "cispo":
        loss = -torch.clamp(coef_1, max=p.epsilon_high).detach() * adv * logps
    elif p.loss_type in ("grpo", "bnpo", "dr_grpo", "dapo", "luspo"):
        coef_2 = torch.clamp(coef_1, 1 - p.epsilon_low, 1 + p.epsilon_high)
        if p.delta is not None:  # two-sided clipping: only the unclipped branch is capped
            coef_1 = torch.clamp(coef_1, max=p.delta)
        loss = -torch.min(coef_1 * adv, coef_2 * adv)
    elif p.loss_type == "sapo":
        tau = torch.where(adv > 0, p.sapo_temperature_pos, p.sapo_temperature_neg)
        loss = -torch.sigmoid(tau * (coef_1 - 1)) * 4 / tau * adv
    elif p.loss_type == "vespo":
        if mask is None:
            raise ValueError("loss_type vespo needs the completion mask")
        phi = gamma_weights(adv, log_ratio, mask.to(logps.dtype), is_ratio, p)
        loss = -phi * adv * logps
    else:
        raise ValueError(f"unknown GRPO loss_type {p.loss_type!r}")
    if keep is not None:
        loss = loss * keep
    if is_ratio is not None and p.loss_type != "vespo":
        loss = loss * is_ratio
    if kl is not None:
        loss = loss + p.beta * kl
    return PerTokenLoss(loss=loss, ratio=coef_1, kl=kl, phi_seq=phi)


def entropy_bonus(entropy: torch.Tensor, effective_mask: torch.Tensor, gradient_accumulation_steps: int) -> torch.Tensor:
    """The mean entropy of the tokens the loss acts on, divided by GA (TRL's `entropy_loss`; the caller subtracts
    entropy_coef times it)."""
    m = effective_mask.to(entropy.dtype)
    return (entropy * m).sum() / m.sum().clamp(min=1.0) / gradient_accumulation_steps
