"""GRPO (TRL 1.16's GRPOTrainer): group-normalised advantages, clipped token ratios, optional k3 KL, four loss
normalisers, the vLLM importance-sampling correction, and Liger's fused loss when asked for."""

from __future__ import annotations

from typing import Any

import torch
from launchgen.trainers.algorithms import grpo as grpo_alg
from launchgen.trainers.algorithms import grpo_loss
from launchgen.trainers.algorithms.adaptive_entropy import AdaptiveEntropy
from launchgen.trainers.declarations.algorithm_options import (
    CLIPPED_LOSS_TYPES,
    NEW_LOSS_TYPES,
    TOKEN_SUM_LOSS_TYPES,
)
from launchgen.trainers.declarations.configs.grpo import GRPOConfig
from launchgen.trainers.declarations.errors import TrainerSetupError
from launchgen.trainers.generation.backends import capabilities
from launchgen.trainers.objectives import base
from launchgen.trainers.stats import Stat, StepStats


def keeps_old_logps(use_is: bool, ga: int, spg: int, num_iterations: int) -> bool:
    """TRL's rule: omit generation-time policy log-probs when the batch is consumed within one optimizer step and
    IS is off (the policy cannot have changed, so the ratio is exp(l - l.detach()))."""
    return use_is or ga % (spg * num_iterations) != 0


class GRPOObjective:
    config_class = GRPOConfig
    name = GRPOConfig.trainer_name
    pair_size = 1

    def __init__(self, cfg: GRPOConfig, num_processes: int) -> None:
        self.cfg = cfg
        self.geometry = base.Geometry.from_config(cfg, num_processes)
        self.caps = capabilities(cfg)
        self.beta = float(cfg.beta or 0.0)
        self.eps_lo, self.eps_hi = base.clip_range(cfg)
        isc = cfg.generation.importance_sampling
        self.uses_importance_sampling = base.uses_separate_engine(self.caps) and isc.enabled
        g = self.geometry
        self.keeps_old_logps = keeps_old_logps(self.uses_importance_sampling, g.ga, g.spg, cfg.num_iterations)
        self.needs_reference = self.beta != 0.0
        self.logp_temperature = cfg.generation.temperature
        self.use_liger = cfg.model.use_liger_kernel and cfg.model.liger_grpo_loss
        self.clipped = cfg.loss_type in CLIPPED_LOSS_TYPES
        self.always_extremes: tuple[str, ...] = (
            ("clip_ratio/low_min", "clip_ratio/high_max") if self.clipped and not self.use_liger else ()
        )
        # TRL's off-policy mask compares the policy with a separate engine's (vLLM's) own log-probs; on a backend that
        # samples from the policy itself TRL has no sampler log-probs and compares with the old policy. The plain
        # backend's log-probs are taken after top-k/top-p renormalisation, so comparing with them would drop
        # negative-advantage rows TRL keeps.
        self.keeps_sampling_logps = (cfg.off_policy_mask_threshold is not None and self.caps.returns_logprobs
                                     and base.uses_separate_engine(self.caps))
        self.params = grpo_loss.LossParams(
            loss_type=cfg.loss_type, epsilon_low=self.eps_lo, epsilon_high=self.eps_hi, beta=self.beta,
            use_bias_correction_kl=cfg.use_bias_correction_kl, importance_sampling_level=cfg.importance_sampling_level,
            delta=cfg.delta, sapo_temperature_pos=cfg.sapo_temperature_pos,
            sapo_temperature_neg=cfg.sapo_temperature_neg, vespo_k_pos=cfg.vespo_k_pos,
            vespo_lambda_pos=cfg.vespo_lambda_pos, vespo_k_neg=cfg.vespo_k_neg, vespo_lambda_neg=cfg.vespo_lambda_neg,
        )
        self._liger_loss: Any = None
        self._accelerator: Any = None
        # TRL: the bonus stays on under adaptive control even when the coefficient has been walked down to 0.
        self.entropy_bonus = cfg.entropy_coef != 0.0 or cfg.use_adaptive_entropy
        self.entropy_control = AdaptiveEntropy(
            coef=cfg.entropy_coef, target=cfg.entropy_target, delta=cfg.entropy_coef_delta,
            coef_min=cfg.entropy_coef_min, coef_max=cfg.entropy_coef_max,
        ) if cfg.use_adaptive_entropy else None

    def validate(self) -> None:
        base.validate_rollout(self.geometry)
        if self.uses_importance_sampling and not self.caps.returns_logprobs:
            raise TrainerSetupError(
                f"generation.importance_sampling.enabled needs per-token log-probs, which generation.backend "
                f"{self.cfg.generation.backend} does not return: disable the correction"
            )
        if self.cfg.loss_type == "vespo" and self.uses_importance_sampling and \
                self.cfg.generation.importance_sampling.mode.startswith("sequence"):
            raise TrainerSetupError(
                "loss_type vespo folds the importance-sampling ratio into its sequence weight and needs it per token: "
                "set generation.importance_sampling.mode to token_truncate or token_mask (TRL refuses the same)"
            )
        if self.use_liger:
            self._refuse_with_liger()
        if self.cfg.max_tokens_per_forward is not None:
            for name, on in (("top_entropy_quantile", self.cfg.top_entropy_quantile < 1.0),
                             ("entropy_coef", self.cfg.entropy_coef != 0.0),
                             ("use_adaptive_entropy", self.cfg.use_adaptive_entropy)):
                if on:
                    raise TrainerSetupError(
                        f"{name} is computed over the whole micro-batch, which max_tokens_per_forward splits into "
                        f"passes: unset max_tokens_per_forward or {name}"
                    )

    def _refuse_with_liger(self) -> None:
        """Options Liger's fused loss does not compute (`launchgen check`: LG607-LG613)."""
        cfg = self.cfg
        refused = [
            ("loss_type", cfg.loss_type in NEW_LOSS_TYPES, f"loss_type {cfg.loss_type}"),
            ("delta", cfg.delta is not None, "two-sided clipping (delta)"),
            ("importance_sampling_level", cfg.importance_sampling_level != "token", "sequence-level ratios"),
            ("top_entropy_quantile", cfg.top_entropy_quantile < 1.0, "entropy masking"),
            ("entropy_coef", cfg.entropy_coef != 0.0, "an entropy bonus"),
            ("use_adaptive_entropy", cfg.use_adaptive_entropy, "an entropy bonus"),
            ("off_policy_mask_threshold", cfg.off_policy_mask_threshold is not None, "off-policy sequence masking"),
        ]
        for name, on, what in refused:
            if on:
                raise TrainerSetupError(
                    f"{name}: Liger's fused GRPO loss (model.liger_grpo_loss) does not support {what}: set "
                    f"model.liger_grpo_loss: false (the chunked head computes it) or drop {name}"
                )

    def make_source(self, accelerator: Any) -> base.BatchSource:
        self._accelerator = accelerator
        from launchgen.trainers.rollout import Rollout  # torch-heavy, and it imports objectives.base back

        return Rollout(self, accelerator)

    def prepare(self, batch: base.ScoredRollout) -> torch.Tensor:
        if self.cfg.multi_objective_aggregation == "normalize_then_sum":
            adv, _ = grpo_alg.normalize_then_sum_advantages(batch.rewards_per_func, batch.reward_weights,
                                                             self.geometry.G)
        else:
            adv = grpo_alg.grpo_advantages(batch.rewards, self.geometry.G, self.cfg.scale_rewards)
        batch.t["advantages"] = adv.advantages[batch.local]
        return adv.std_is_zero

    def loss_share(self, part: base.Batch, mb: base.Batch) -> Stat:
        """Follows the normaliser (see grpo.normalize_loss)."""
        if self.cfg.loss_type in TOKEN_SUM_LOSS_TYPES:
            return 1.0  # normalised by the whole generation batch's token count already
        if self.cfg.loss_type == "bnpo":
            return part["completion_mask"].sum().float() / mb["completion_mask"].sum().float().clamp(min=1.0)
        return base.row_share(part, mb)  # grpo / sapo / dr_grpo / luspo: per-sequence terms over rows

    def end_step(self) -> dict[str, float]:
        """The adaptive entropy controller's update at the optimizer step's end; its coefficient for the log."""
        ctl = self.entropy_control
        if ctl is None:
            return {}
        acc = self._accelerator
        reduce_sum = (lambda t: acc.reduce(t, reduction="sum")) if acc is not None else (lambda t: t)
        return {"entropy_coef": ctl.end_step(reduce_sum)}

    def state_dict(self) -> dict[str, Any]:
        return {} if self.entropy_control is None else self.entropy_control.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if self.entropy_control is not None:
            self.entropy_control.load_state_dict(state)

    def loss(self, model: Any, mb: base.Batch, stats: StepStats) -> torch.Tensor:
        if self.use_liger:
            return self._liger(model, mb, stats)
        cfg, g = self.cfg, self.geometry
        mask = mb["completion_mask"]
        adv = mb["advantages"]
        logps, entropy, m = base.policy_logps_entropy(model, mb, self.logp_temperature, stats,
                                                      entropy_grad=self.entropy_bonus)
        ent_mask = self._entropy_mask(entropy.detach(), mask) if cfg.top_entropy_quantile < 1.0 else None
        keep = None if ent_mask is None else ent_mask.to(m.dtype)
        if cfg.off_policy_mask_threshold is not None:
            samp = mb.get("sampling_logps", mb.get("old_logps", logps.detach()))
            opm = grpo_loss.off_policy_mask(adv, logps, samp, m, cfg.off_policy_mask_threshold)
            keep = opm if keep is None else keep * opm
        ptl = grpo_alg.grpo_per_token_loss(
            logps, adv, old_logps=mb.get("old_logps"), ref_logps=mb.get("ref_logps"), is_ratio=mb.get("is_ratio"),
            mask=m, params=self.params, keep=keep,
        )
        loss = grpo_alg.normalize_loss(
            ptl.loss, mask, cfg.loss_type, gradient_accumulation_steps=g.ga,
            max_completion_length=cfg.generation.max_completion_length, num_items_in_batch=mb["num_items_in_batch"],
            num_processes=g.num_processes, steps_per_generation=g.spg,
        )
        if self.entropy_bonus:
            # TRL logs the policy term alone (before its /GA for the per-step normalisers) beside the bonus.
            policy = loss.detach() * (1 if cfg.loss_type in TOKEN_SUM_LOSS_TYPES else g.ga)
            stats.add_mean("policy_loss", policy, 1.0)
            eff = m if ent_mask is None else m * ent_mask
            ctl = self.entropy_control
            coef = cfg.entropy_coef if ctl is None else ctl.applied_coef()
            loss = loss - coef * grpo_loss.entropy_bonus(entropy, eff, g.ga)
            if ctl is None:
                stats.add_mean("entropy_coef", cfg.entropy_coef, 1.0)
            else:
                ctl.add(entropy, eff)  # the coefficient is logged after the step's update (end_step), as TRL
        self._loss_metrics(ptl, adv, mask, m, stats)
        return loss

    def _entropy_mask(self, entropy: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """TRL's high-entropy mask: the quantile is over the micro-batch's tokens on every process."""
        local = entropy[mask.bool()].float()
        acc = self._accelerator
        if acc is not None and acc.num_processes > 1:
            pad = -1e9  # entropies are >= 0, so the sentinel cannot be a real value
            gathered = acc.gather(acc.pad_across_processes(local, dim=0, pad_index=pad))
            local = gathered[gathered != pad]
        return grpo_loss.high_entropy_mask(entropy, mask, local, self.cfg.top_entropy_quantile)

    def _loss_metrics(self, ptl: grpo_loss.PerTokenLoss, adv: torch.Tensor, mask: torch.Tensor, m: torch.Tensor,
                      stats: StepStats) -> None:
        """TRL's names and formulas: kl is the mean of the KL term as added to the loss (bias-corrected)."""
        if ptl.kl is not None:
            stats.add("kl_sum", (ptl.kl.detach() * m).sum())
            stats.add("kl_count", m.sum())
        ratio = ptl.ratio.detach()
        per_seq = ratio.size(1) == 1  # sequence level: each completion counts once (TRL's global_masked_mean)
        if self.clipped:
            cs = grpo_alg.clip_stats(ratio, adv, mask, self.eps_lo, self.eps_hi)
            stats.add("clip_low_sum", cs.low)
            stats.add("clip_high_sum", cs.high)
            stats.add("clip_region_sum", cs.region)
            stats.add("clip_count", cs.count)
            stats.min("clip_ratio/low_min", cs.low_seq_min)
            stats.max("clip_ratio/high_max", cs.high_seq_max)
        elif self.cfg.loss_type == "cispo":
            clipped = ((ratio > self.eps_hi) & (adv.unsqueeze(1) > 0)).float()
            w = torch.ones_like(clipped) if per_seq else m
            stats.add_mean("cispo_clip_ratio", (clipped * w).sum(), w.sum())
        if ptl.phi_seq is not None:
            stats.add_mean("vespo/phi_seq_mean", ptl.phi_seq.detach().sum(), float(ptl.phi_seq.size(0)))

    def _liger(self, model: Any, mb: base.Batch, stats: StepStats) -> torch.Tensor:
        from launchgen.trainers.modeling import liger_grpo_loss, make_liger_grpo_loss

        if self._liger_loss is None:
            self._liger_loss = make_liger_grpo_loss(self.cfg)
        cfg, g = self.cfg, self.geometry
        mask = mb["completion_mask"]
        n_items = mb["num_items_in_batch"]
        loss, lmetrics = liger_grpo_loss(
            model, self._liger_loss, mb["prompt_ids"], mb["prompt_mask"], mb["completion_ids"], mask,
            advantages=mb.get("advantages"), ref_per_token_logps=mb.get("ref_logps"),
            old_per_token_logps=mb.get("old_logps"), vllm_is_ratio=mb.get("is_ratio"),
            # Liger divides by num_items / world_size; TRL's dapo also multiplies by GA / SPG.
            num_items_in_batch=(n_items * g.ga / g.spg) if cfg.loss_type == "dapo" else None,
        )
        if cfg.loss_type != "dapo":
            loss = loss / g.ga
        tokens = mask.sum().to(torch.float64)
        if self.beta != 0.0 and lmetrics:
            stats.add("kl_sum", lmetrics[0].detach().to(torch.float64) * tokens)
            stats.add("kl_count", tokens)
        if lmetrics:
            stats.add("clip_region_sum", lmetrics[-1].detach().to(torch.float64) * tokens)
            stats.add("clip_count", tokens)
        return loss
